"""Backends: the engines that give ESI its token distributions.

Importing them imports no torch, llama-cpp-python or openai SDK (not until a model loads or a
request is sent). Also: :func:`embedded_gguf`, the embedded model's file; :func:`load_llama`, a
``llama_cpp.Llama`` safe to decode on this CPU; :class:`HiddenSpec` and :class:`HiddenStates`,
hidden states for probes; :func:`known_model_path`, a bigger model known by name
(:data:`KNOWN_MODELS`) fetched to the cache; :class:`ForcingSession`, forcing as an answer grows.
"""

from esi_guard.backends._identity import file_sha256
from esi_guard.backends._known import KNOWN_MODELS, KnownModel, ModelPart, known_model_path
from esi_guard.backends._session import ForcingSession
from esi_guard.backends._types import (
    AnswerPiece,
    ChatMessage,
    Forced,
    ForcingRequest,
    Generation,
    Messages,
)
from esi_guard.backends.base import Backend
from esi_guard.backends.embedded import embedded_gguf
from esi_guard.backends.fake import FakeBackend
from esi_guard.backends.hf import HFBackend
from esi_guard.backends.hidden import FINAL, POSITIONS, HiddenSpec, HiddenStates
from esi_guard.backends.llamacpp import LlamaCppBackend, load_llama
from esi_guard.backends.openai import OpenAIBackend, RequestStats

__all__ = [
    "FINAL",
    "KNOWN_MODELS",
    "POSITIONS",
    "AnswerPiece",
    "Backend",
    "ChatMessage",
    "FakeBackend",
    "Forced",
    "ForcingRequest",
    "ForcingSession",
    "Generation",
    "HFBackend",
    "HiddenSpec",
    "HiddenStates",
    "KnownModel",
    "LlamaCppBackend",
    "Messages",
    "ModelPart",
    "OpenAIBackend",
    "RequestStats",
    "embedded_gguf",
    "file_sha256",
    "known_model_path",
    "load_llama",
]
