"""A hidden-state probe end to end on the embedded model: calibrate -> file -> guard.

``esi-guard calibrate --score combined --features esi,nll,entropy,hidden`` on 64 SciQ
questions, on llama.cpp and on transformers; the threshold file carries the probe;
``ESIGuard.from_calibration`` reads the same states from each answer's own passes and
reproduces the file's ``p_wrong`` exactly on the calibration questions, and refuses another
model, another engine and an API backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard
from esi_guard.backends import Backend
from esi_guard.backends.openai import OpenAIBackend
from esi_guard.calibration.calibrate_combined import decode_states
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module
from esi_guard.exceptions import ConfigurationError

# Side by side (pytest -n), the module's calibrations (one per engine) on one worker.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("hidden_probe")]

SCORING = ["--n-variants", "4", "--max-new-tokens", "16", "--top-k", "20"]


@pytest.fixture(scope="module")
def calibrated(
    tmp_path_factory: pytest.TempPathFactory, shared_data: Path, white_box: Backend,
    made_once: Callable[[tuple[str, str], Callable[[], Any]], Any],
) -> tuple[Path, Path]:  # fmt: skip
    made: tuple[Path, Path] = made_once(
        ("hidden_probe", white_box.engine or ""),
        lambda: _calibrate(tmp_path_factory, shared_data, white_box),
    )
    return made


def _calibrate(
    tmp_path_factory: pytest.TempPathFactory, shared_data: Path, white_box: Backend
) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("probe")
    out, cache = folder / "threshold.json", folder / "run.jsonl"
    patch = pytest.MonkeyPatch()
    patch.setattr(build, "backend", lambda *args: white_box)
    try:
        result = CliRunner().invoke(cli_module.app, [
            "calibrate", "--data", str(shared_data / "sciq" / "test.jsonl"), "--limit", "64",
            "--cache", str(cache), *SCORING, "--score", "combined",
            "--features", "esi,nll,entropy,hidden", "--fit-fraction", "0.6",
            "--select", "coverage", "--coverage", "0.7", "--resamples", "100",
            "--out", str(out),
        ])  # fmt: skip
    finally:
        patch.undo()
    assert result.exit_code == 0, result.output
    assert "hidden-state probe: layer" in " ".join(result.output.split())
    return out, cache


def test_the_file_carries_the_probe_and_the_guard_reproduces_p_wrong_exactly(
    calibrated: tuple[Path, Path], white_box: Backend
) -> None:
    out, cache = calibrated
    written = ThresholdFile.read(out)
    assert written.engine == white_box.engine
    combined = written.combined
    assert combined is not None and combined.hidden is not None
    probe = combined.hidden
    assert probe.hidden_size == white_box.hidden_size == 576
    assert len(probe.weights) == len(probe.layers) * len(probe.positions) * 576
    assert set(probe.selection)  # the candidates' cross-validated losses are reported
    guard = ESIGuard.from_calibration(out, backend=white_box)
    records = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    scored = [r for r in records if r["scored"]][:4]
    system = written.scoring.system_prompt  # the CLI asked with its QA instruction
    assert system
    messages = guard.batch([[("system", system), ("human", r["question"])] for r in scored])
    for record, message in zip(scored, messages, strict=True):
        esi = message.response_metadata["esi"]
        assert esi["answer"] == record["prediction"]
        signals = {"esi": record["score"], **record["signals"]}
        expected = combined.p_wrong(signals, decode_states(record["hidden"]))
        term = probe.term(decode_states(record["hidden"]))
        if white_box.engine.startswith("llamacpp"):  # one sequence per decode: the same bits
            assert esi["p_wrong"] == expected
            assert esi["signals"]["hidden"] == pytest.approx(term, rel=1e-7, abs=1e-9)
        else:
            # transformers' numbers move a little with the batch an answer is padded into
            # and the threads its matrix products split over (the probe's term by 2.7e-7
            # relative on a 2-core AVX2 machine, two threads)
            assert esi["p_wrong"] == pytest.approx(expected, rel=1e-5)
            assert esi["signals"]["hidden"] == pytest.approx(term, rel=1e-5, abs=1e-9)
        assert esi["decision"] == ("accept" if expected <= written.threshold else "flag")


def test_another_model_engine_or_an_api_backend_is_refused(
    calibrated: tuple[Path, Path], white_box: Backend, tmp_path: Path
) -> None:
    out, _ = calibrated
    raw = json.loads(out.read_text())
    other = tmp_path / "other-model.json"
    other.write_text(json.dumps({**raw, "model": "someone/else", "model_sha256": "0" * 64}))
    with pytest.raises(ConfigurationError, match="model"):
        ESIGuard.from_calibration(other, backend=white_box)
    narrower = tmp_path / "other-width.json"
    probe = {**raw["combined"]["hidden"], "hidden_size": 960}
    narrower.write_text(json.dumps({**raw, "combined": {**raw["combined"], "hidden": probe}}))
    with pytest.raises(ConfigurationError, match="width 960"):
        ESIGuard.from_calibration(narrower, backend=white_box)
    engine = tmp_path / "other-engine.json"
    elsewhere = "transformers" if white_box.engine.startswith("llamacpp") else "llamacpp"
    engine.write_text(json.dumps({**raw, "engine": elsewhere}))
    with pytest.raises(ConfigurationError, match=f"hidden-state probe fitted on the {elsewhere}"):
        ESIGuard.from_calibration(engine, backend=white_box)
    api = OpenAIBackend(raw["model"], base_url="http://127.0.0.1:9/v1", mode="chat")
    with pytest.raises(ConfigurationError, match="gives no hidden states"):
        ESIGuard.from_calibration(out, backend=api)


# The path without ESI is the engine's answer pass alone, whose states the test above checks
# on both engines: here on the default one.
@pytest.mark.parametrize("white_box", ["llamacpp"], indirect=True, scope="module")
def test_a_file_without_esi_decides_with_no_variant_forced(
    calibrated: tuple[Path, Path], white_box: Backend, shared_data: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``--features nll,entropy,max_nll,hidden`` on the same answers (the cache: no model
    call), then the guard: the backend's forcing is never called, and each answer's
    ``p_wrong`` is the file's score of its own signals and states."""
    first, cache = calibrated
    out = first.with_name("free.json")
    monkeypatch.setattr(build, "backend", lambda *args: white_box)
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(shared_data / "sciq" / "test.jsonl"), "--limit", "64",
        "--cache", str(cache), *SCORING, "--score", "combined",
        "--features", "nll,entropy,max_nll,hidden", "--select", "coverage",
        "--coverage", "0.7", "--resamples", "100", "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no model loaded" in " ".join(result.output.split())
    written = ThresholdFile.read(out)
    combined = written.combined
    assert combined is not None and not combined.uses_esi
    guard = ESIGuard.from_calibration(out, backend=white_box)
    calls: list[int] = []
    real = white_box.teacher_force

    def counted(requests: Any, **kwargs: Any) -> Any:
        calls.append(len(requests))
        return real(requests, **kwargs)

    monkeypatch.setattr(white_box, "teacher_force", counted)
    records = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    scored = [r for r in records if r["scored"]][:4]
    system = written.scoring.system_prompt
    messages = guard.batch([[("system", system), ("human", r["question"])] for r in scored])
    assert calls == []  # no variant, not even the original row: the answer's own pass
    for record, message in zip(scored, messages, strict=True):
        esi = message.response_metadata["esi"]
        assert esi["decided_by"] == "free" and esi["score"] is None and esi["variants"] == []
        assert esi["answer"] == record["prediction"]
        states = decode_states(record["hidden"]) if combined.hidden is not None else None
        expected = combined.p_wrong(record["signals"], states)
        assert esi["p_wrong"] == pytest.approx(expected, rel=1e-5)
        assert esi["decision"] == ("accept" if esi["p_wrong"] <= written.threshold else "flag")
