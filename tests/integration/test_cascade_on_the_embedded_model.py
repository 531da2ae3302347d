"""The cascade end to end on the embedded model: distill -> calibrate -> guard.

On llama.cpp (the default engine): ``esi-guard distill`` on 32 unlabelled SciQ questions
(labels never read: the file given has none), ``esi-guard calibrate --esi-probe`` on 40
labelled others, then ``ESIGuard.from_calibration``: the probe reads the states of each
answer's own pass, its estimate in the results equals the file's probe applied to the
states the backend gives, an answer outside the band skips ESI (no variant forced) and
one inside it runs ESI. Another model's probe and an API backend are refused.

The cascade reads what any white-box engine gives (its free signals and states); that
transformers gives the states a probe reads, batched or not, to the file's numbers is
``tests/integration/test_hidden_probe.py``'s (on both engines), so the cascade's minute of
calibration runs here on one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard
from esi_guard.backends import Backend, Generation
from esi_guard.backends.openai import OpenAIBackend
from esi_guard.calibration.data import load_examples
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cascade import Band, ESIProbe
from esi_guard.cli import app, build
from esi_guard.combined import free_signals
from esi_guard.exceptions import ConfigurationError

# Side by side (pytest -n), the module's calibration on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.xdist_group("cascade"),
    pytest.mark.parametrize("white_box", ["llamacpp"], indirect=True, scope="module"),
]

SCORING = ["--n-variants", "4", "--max-new-tokens", "16", "--top-k", "20"]


@pytest.fixture(scope="module")
def files(
    tmp_path_factory: pytest.TempPathFactory, shared_data: Path, white_box: Backend,
    made_once: Callable[[tuple[str, str], Callable[[], Any]], Any],
) -> tuple[Path, Path]:  # fmt: skip
    made: tuple[Path, Path] = made_once(
        ("cascade", white_box.engine or ""),
        lambda: _made(tmp_path_factory, shared_data, white_box),
    )
    return made


def _made(
    tmp_path_factory: pytest.TempPathFactory, shared_data: Path, white_box: Backend
) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("cascade")
    examples = load_examples(shared_data / "sciq" / "test.jsonl", limit=72, seed=1)
    questions = folder / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": e.question}) + "\n"
                                 for e in examples[:32]))  # fmt: skip
    labelled = folder / "qa.jsonl"
    labelled.write_text("".join(json.dumps({"question": e.question, "answers": list(e.answers)})
                                + "\n" for e in examples[32:]))  # fmt: skip
    probe, threshold = folder / "probe.json", folder / "threshold.json"
    patch = pytest.MonkeyPatch()
    patch.setattr(build, "backend", lambda *args: white_box)
    try:
        distilled = CliRunner().invoke(app, [
            "distill", "--data", str(questions), "--out", str(probe), *SCORING,
            "--cache", str(folder / "distill.jsonl"), "--resamples", "100",
        ])  # fmt: skip
        assert distilled.exit_code == 0, distilled.output
        calibrated = CliRunner().invoke(app, [
            "calibrate", "--data", str(labelled), "--out", str(threshold), *SCORING,
            "--esi-probe", str(probe), "--select", "coverage", "--coverage", "0.7",
            "--max-disagreement", "0.25", "--cache", str(folder / "calibrate.jsonl"),
            "--resamples", "100",
        ])  # fmt: skip
        assert calibrated.exit_code == 0, calibrated.output
    finally:
        patch.undo()
    assert "Spearman with ESI" in " ".join(distilled.output.split())
    assert "cascade: ESI runs where" in " ".join(calibrated.output.split())
    return probe, threshold


def test_the_files_name_the_model_and_carry_the_probe_and_its_band(
    files: tuple[Path, Path], white_box: Backend
) -> None:
    probe_file, threshold_file = files
    probe = ESIProbe.read(probe_file)
    assert probe.model == white_box.model_id and probe.engine == white_box.engine
    assert probe.hidden is not None and probe.hidden.hidden_size == 576
    assert probe.quality["n"] >= 24 and len(probe.held_out_esi) == probe.quality["n"]
    written = ThresholdFile.read(threshold_file)
    assert written.esi_probe == probe
    band = written.probe_band
    assert band is not None and band.fitted is not None
    assert band.low <= written.threshold <= band.high
    assert band.fitted["bound"] <= 0.25


def test_the_guard_takes_the_probes_path_outside_the_band_and_esi_inside(
    files: tuple[Path, Path], white_box: Backend, shared_data: Path
) -> None:
    _, threshold_file = files
    written = ThresholdFile.read(threshold_file)
    guard = ESIGuard.from_calibration(threshold_file, backend=white_box)
    probe = written.esi_probe
    assert probe is not None and probe.hidden is not None
    question = load_examples(shared_data / "sciq" / "test.jsonl", limit=1, seed=5)[0].question
    system = written.scoring.system_prompt
    assert system
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    esi = guard.invoke(messages).response_metadata["esi"]
    (gen,) = white_box.generate([messages], max_new_tokens=16, top_k=20, hidden=probe.hidden.spec)
    assert isinstance(gen, Generation) and gen.hidden is not None
    signals = free_signals(gen.topk, gen.token_ids, white_box.values_kind)
    expected = probe.estimate(signals, gen.hidden)
    assert esi["probe_score"] == pytest.approx(expected, rel=1e-6, abs=1e-9)
    # The same answer with a band around its own estimate: ESI runs; a band elsewhere: not.
    inside = Band(low=min(expected, written.threshold) - 1e-3,
                  high=max(expected, written.threshold) + 1e-3)  # fmt: skip
    outside = Band(low=written.threshold, high=written.threshold)
    for band, path in ((inside, "esi"), (outside, "probe")):
        forced = ESIGuard.from_calibration(threshold_file, backend=white_box, probe_band=band)
        meta = forced.invoke(messages).response_metadata["esi"]
        assert meta["decided_by"] == path
        assert (meta["variants_used"] == 0) == (path == "probe")
        assert meta["answer"] == esi["answer"]


def test_another_model_and_an_api_backend_are_refused(
    files: tuple[Path, Path], white_box: Backend
) -> None:
    probe = ESIProbe.read(files[0])
    with pytest.raises(ConfigurationError, match="model"):
        ESIGuard(backend=white_box, threshold=0.3,
                 esi_probe=probe.model_copy(update={"model": "someone/else",
                                                    "model_sha256": "0" * 64}))  # fmt: skip
    api = OpenAIBackend("smollm2", base_url="http://127.0.0.1:9/v1", model_id=white_box.model_id)
    with pytest.raises(ConfigurationError, match="hidden states"):
        ESIGuard(backend=api, threshold=0.3, esi_probe=probe)
