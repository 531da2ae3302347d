"""The public surface: curated exports, typed package, no heavy imports on `import esi_guard`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import esi_guard
from esi_guard import ConfigurationError, HFBackend

PUBLIC = {
    "APIError", "OpenAIBackend", "ContextLengthError",
    "Backend", "BackendError", "ConfigurationError", "ESIGuard", "ESIGuardError", "ESIResult",
    "ESIScore", "FakeBackend", "FixedVariants", "HFBackend", "InputError", "Intervention",
    "ModelLoadError", "Paraphrase", "ScoringError", "SkipOneChar", "TopK", "Typo",
    "__version__", "esi_score",
}  # fmt: skip


def test_all_is_the_curated_public_api() -> None:
    assert set(esi_guard.__all__) == PUBLIC
    for name in esi_guard.__all__:
        assert getattr(esi_guard, name) is not None


def test_package_is_typed() -> None:
    assert (Path(esi_guard.__file__).parent / "py.typed").is_file()


def test_import_does_not_load_torch_transformers_or_openai() -> None:
    code = (
        "import sys, esi_guard; from esi_guard import HFBackend, ESIGuard, OpenAIBackend; "
        "heavy = {'torch', 'transformers', 'openai', 'tenacity'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_error_is_an_esi_guard_error() -> None:
    for name in (
        "BackendError",
        "ConfigurationError",
        "InputError",
        "ModelLoadError",
        "ScoringError",
        "ContextLengthError",
        "APIError",
    ):
        assert issubclass(getattr(esi_guard, name), esi_guard.ESIGuardError)
    assert issubclass(esi_guard.ContextLengthError, esi_guard.BackendError)
    assert issubclass(esi_guard.ConfigurationError, ValueError)


def test_tokenizer_without_chat_template_is_refused_with_the_fix() -> None:
    tokenizer = SimpleNamespace(chat_template=None)
    with pytest.raises(ConfigurationError, match="chat_template"):
        HFBackend(SimpleNamespace(), tokenizer)  # type: ignore[arg-type]
