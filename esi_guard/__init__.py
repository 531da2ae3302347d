"""esi_guard: flag, withhold or re-route LLM answers that the ESI uncertainty score distrusts.

``import esi_guard`` never imports torch, transformers or llama-cpp-python; they load with a model.
"""

import importlib.metadata

from esi_guard.backends import Backend, FakeBackend, HFBackend, LlamaCppBackend, OpenAIBackend
from esi_guard.exceptions import (
    APIError,
    BackendError,
    ConfigurationError,
    ContextLengthError,
    EngineMismatchWarning,
    ESIGuardError,
    InputError,
    InterventionError,
    ModelLoadError,
    PromptMismatchWarning,
    ScoringError,
    UncertainAnswerError,
    WholeMessageWarning,
)
from esi_guard.guard import ESIGuard
from esi_guard.interventions import FixedVariants, Intervention, Paraphrase, SkipOneChar, Typo
from esi_guard.result import ESIResult, ScoringConfig
from esi_guard.scoring import ESIScore, TopK, esi_score

try:
    __version__ = importlib.metadata.version("esi-guard")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "APIError",
    "Backend",
    "BackendError",
    "ConfigurationError",
    "ContextLengthError",
    "ESIGuard",
    "ESIGuardError",
    "ESIResult",
    "ESIScore",
    "EngineMismatchWarning",
    "FakeBackend",
    "FixedVariants",
    "HFBackend",
    "InputError",
    "Intervention",
    "InterventionError",
    "LlamaCppBackend",
    "ModelLoadError",
    "OpenAIBackend",
    "Paraphrase",
    "PromptMismatchWarning",
    "ScoringConfig",
    "ScoringError",
    "SkipOneChar",
    "TopK",
    "Typo",
    "UncertainAnswerError",
    "WholeMessageWarning",
    "__version__",
    "esi_score",
]
