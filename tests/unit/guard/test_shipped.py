"""The shipped calibrations: found by the model file's digest, engine-specific parts kept to
their engine, and every result saying where its threshold came from (``threshold_source``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID, EmbeddedBackend, embedded_threshold
from esi_guard.calibration.file import ThresholdFile
from esi_guard.exceptions import EngineMismatchWarning
from esi_guard.guard import _shipped

DIGEST = "ab" * 32


class Known(FakeBackend):
    """A fake whose weights have a digest, as a GGUF file's backend does."""

    @property
    def model_id(self) -> str:
        return "/models/known.gguf"

    @property
    def model_sha256(self) -> str | None:
        return DIGEST


def known() -> Known:
    return Known({"What is the capital of France?": "Paris"}, default_sensitivity=0.1)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shipped folder holding the embedded model's file and two for the known model:
    one on ESI alone (fitted on the fake engine) and one with a probe fitted on llama.cpp."""
    raw = json.loads(embedded_threshold().read_text())
    (tmp_path / embedded_threshold().name).write_text(json.dumps(raw))
    free = {**raw, "model": "/models/known.gguf", "model_sha256": DIGEST, "engine": "fake",
            "threshold": 0.25, "combined": None, "combined_report": None}  # ESI alone  # fmt: skip
    (tmp_path / "known-free.json").write_text(json.dumps(free))
    probe = {**free, "engine": "llamacpp", "combined": {"hidden": {"layers": [3]}}}
    (tmp_path / "known-probe.json").write_text(json.dumps(probe))  # only its header is read
    monkeypatch.setattr(_shipped, "SHIPPED", tmp_path)
    _shipped.shipped.cache_clear()
    yield tmp_path
    _shipped.shipped.cache_clear()


def test_the_embedded_model_s_file_is_shipped_and_its_results_say_so() -> None:
    guard = ESIGuard()  # nothing is loaded until the first answer
    assert isinstance(guard.backend, EmbeddedBackend)
    assert guard.threshold_source == f"shipped:{embedded_threshold().name}"
    assert guard.threshold == ThresholdFile.read(embedded_threshold()).threshold


def test_a_known_model_decides_with_its_file_and_each_result_names_it(folder: Path) -> None:
    with pytest.warns(EngineMismatchWarning, match="known-probe.json holds a hidden-state probe"):
        guard = ESIGuard(backend=known())
    assert guard.threshold == 0.25 and guard.threshold_source == "shipped:known-free.json"
    esi = guard.invoke("What is the capital of France?").response_metadata["esi"]
    assert esi["threshold_source"] == "shipped:known-free.json" and esi["threshold"] == 0.25


def test_the_probe_s_own_engine_takes_the_file_with_the_probe(folder: Path) -> None:
    class OnLlamaCpp(Known):
        @property
        def engine(self) -> str:
            return "llamacpp"

    chosen = _shipped.shipped_for(OnLlamaCpp())
    assert chosen.path.name == "known-probe.json" and chosen.probe


def test_a_guard_judging_sentences_takes_the_file_on_esi_alone(folder: Path) -> None:
    class OnLlamaCpp(Known):
        @property
        def engine(self) -> str:
            return "llamacpp"

    assert _shipped.shipped_for(OnLlamaCpp()).path.name == "known-probe.json"
    chosen = _shipped.shipped_for(OnLlamaCpp(), "sentence")
    assert chosen.path.name == "known-free.json" and chosen.esi_alone
    with pytest.warns(EngineMismatchWarning, match="known-free.json was calibrated on the fake"):
        guard = ESIGuard(backend=OnLlamaCpp(), action="redact")
    assert guard.threshold_source == "shipped:known-free.json" and guard.combined is None
    for settings in ({"decide_on": "sentences"}, {"stream_mode": "sentences"}):
        with pytest.warns(EngineMismatchWarning):
            judged = ESIGuard(backend=OnLlamaCpp(), **settings)
        assert judged.threshold_source == "shipped:known-free.json"


def test_a_sentence_guard_for_a_model_with_no_esi_file_is_told_what_to_do(folder: Path) -> None:
    (folder / "known-free.json").unlink()
    _shipped.shipped.cache_clear()
    with pytest.raises(ConfigurationError) as caught:
        _shipped.shipped_for(known(), "sentence")
    message = str(caught.value)
    assert "\n" not in message and "/models/known.gguf" in message
    assert "threshold=" in message and "--score esi" in message and "redact" in message


def test_a_probe_for_another_engine_alone_is_refused(folder: Path) -> None:
    (folder / "known-free.json").unlink()
    _shipped.shipped.cache_clear()
    with pytest.raises(ConfigurationError, match=r"fitted on the llamacpp engine.*calibrate"):
        ESIGuard(backend=known())


def test_a_model_none_ships_for_is_told_which_do(folder: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ESIGuard(backend=FakeBackend())
    message = str(caught.value)
    assert "\n" not in message and "known-free" in message and "esi-guard calibrate" in message
    assert "threshold=" in message


def test_a_given_threshold_and_a_file_are_named_as_such(tmp_path: Path) -> None:
    assert ESIGuard(backend=known(), threshold=0.3).threshold_source == "given"
    path = tmp_path / "mine.json"
    raw = json.loads(embedded_threshold().read_text())
    path.write_text(json.dumps({**raw, "model": "fake", "model_sha256": None, "engine": "fake"}))
    guard = ESIGuard.from_calibration(path, backend=FakeBackend())
    assert guard.threshold_source == f"file:{path}"
    message = guard.invoke("What is 2 + 2?")
    assert message.response_metadata["esi"]["threshold_source"] == f"file:{path}"


def test_every_shipped_file_reads_and_names_a_model() -> None:
    files = _shipped.shipped()
    assert [f.model for f in files if f.model == EMBEDDED_MODEL_ID]
    for file in files:
        written = ThresholdFile.read(file.path)
        assert written.model_sha256 == file.model_sha256 and len(file.model_sha256) == 64
