"""The public surface: curated exports, typed package, no heavy imports on `import esi_guard`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

import esi_guard
from esi_guard import ConfigurationError, HFBackend


def test_all_imports_are_exported() -> None:
    """Every public name bound in the package is in ``__all__`` and nothing else is."""
    included_private_members = {"__version__"}
    public = {
        name
        for name, value in vars(esi_guard).items()
        if (not name.startswith("_") or name in included_private_members)
        and not isinstance(value, ModuleType)  # submodules bound by importing them
    }
    assert esi_guard.__all__ == sorted(public)


def test_backends_exports_every_public_name_it_binds() -> None:
    """``esi_guard.backends`` too, the known models' names among them."""
    from esi_guard import backends

    public = {
        name
        for name, value in vars(backends).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert set(backends.__all__) == public
    assert {"KNOWN_MODELS", "KnownModel", "ModelPart", "known_model_path"} <= public
    for name in ("KnownModel", "ModelPart"):
        assert getattr(backends, name).__doc__, name


def test_every_exported_class_says_what_it_is() -> None:
    for name in esi_guard.__all__:
        value = getattr(esi_guard, name)
        if isinstance(value, type):
            assert value.__doc__, name


def test_package_is_typed() -> None:
    assert (Path(esi_guard.__file__).parent / "py.typed").is_file()


def test_import_does_not_load_torch_transformers_or_openai() -> None:
    code = (
        "import sys, esi_guard; from esi_guard import HFBackend, ESIGuard, OpenAIBackend; "
        "heavy = {'torch', 'transformers', 'openai', 'tenacity'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tokenizer_without_chat_template_is_refused_with_the_fix() -> None:
    tokenizer = SimpleNamespace(chat_template=None)
    with pytest.raises(ConfigurationError, match="chat_template"):
        HFBackend(SimpleNamespace(), tokenizer)  # type: ignore[arg-type]
