"""The ESI probe and the cascade at run time: the guard takes the probe's path outside the
band and ESI's inside it, on every entry point, with the results saying which decided; a
probe that does not fit the guard is refused. (Fitting them: tests/unit/calibration.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends import Generation
from esi_guard.backends.openai import OpenAIBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cascade import Band, ESIProbe
from esi_guard.combined import HiddenProbe, free_signals
from esi_guard.exceptions import ConfigurationError


def constant_probe(backend: FakeBackend, value: float, band: float = 0.1) -> ESIProbe:
    """A probe whose estimate is always ``value`` (no signal, no state)."""
    return ESIProbe(model=backend.model_id, features=(), mean=(), scale=(), weights=(),
                    intercept=value, strength=0.0, band=band, coverage=0.98,
                    n_fit=0)  # fmt: skip


@pytest.mark.parametrize("call", ["invoke", "batch", "stream", "ainvoke"])
@pytest.mark.parametrize(("estimate", "path", "decision"),
                         [(0.1, "probe", "accept"), (0.9, "probe", "flag"),
                          (0.55, "esi", None)])  # fmt: skip
async def test_the_cascade_decides_on_the_probe_outside_the_band_only(
    call: str, estimate: float, path: str, decision: str | None
) -> None:
    backend = FakeBackend(default_sensitivity=0.3)
    guard = ESIGuard(backend=backend, threshold=0.5, n_variants=4, action="flag",
                     esi_probe=constant_probe(backend, estimate))  # fmt: skip
    if call == "invoke":
        message = guard.invoke("Where is the Eiffel Tower?")
    elif call == "batch":
        (message,) = guard.batch(["Where is the Eiffel Tower?"])
    elif call == "stream":
        message = list(guard.stream("Where is the Eiffel Tower?"))[-1]
    else:
        message = await guard.ainvoke("Where is the Eiffel Tower?")
    esi = message.response_metadata["esi"]
    assert esi["decided_by"] == path
    assert esi["probe_score"] == pytest.approx(estimate)
    forced = [size for method, size in backend.calls if method == "teacher_force"]
    if path == "probe":
        assert esi["decision"] == decision and esi["variants_used"] == 0
        assert esi["score"] == pytest.approx(estimate) and not forced
    else:
        assert esi["variants_used"] == 4 and forced
        assert esi["decision"] == ("flag" if esi["score"] > 0.5 else "accept")


def test_without_a_cascade_results_say_nothing_of_it() -> None:
    esi = ESIGuard(backend=FakeBackend(), threshold=0.5).invoke("Where?").response_metadata["esi"]
    assert "decided_by" not in esi and "probe_score" not in esi


def test_the_probe_reads_the_answers_free_signals() -> None:
    backend = FakeBackend(default_sensitivity=0.3)
    probe = ESIProbe(model=backend.model_id, features=("entropy",), mean=(0.0,), scale=(1.0,),
                     weights=(1.0,), intercept=0.0, strength=0.0, band=0.01, coverage=0.98,
                     n_fit=0)  # fmt: skip
    guard = ESIGuard(backend=backend, threshold=0.5, esi_probe=probe)
    esi = guard.invoke("Where is the Eiffel Tower?").response_metadata["esi"]
    (gen,) = backend.generate([[{"role": "user", "content": "Where is the Eiffel Tower?"}]],
                              max_new_tokens=64, top_k=100)  # fmt: skip
    assert isinstance(gen, Generation)
    expected = free_signals(gen.topk, gen.token_ids, backend.values_kind)["entropy"]
    assert esi["probe_score"] == pytest.approx(expected)


def test_a_probe_that_does_not_fit_the_guard_is_refused() -> None:
    backend = FakeBackend(default_sensitivity=0.3)
    states = HiddenProbe(layers=(3,), positions=("answer_mean",), hidden_size=8,
                         weights=(0.1,) * 8, components=4)  # fmt: skip
    probe = constant_probe(backend, 0.5).model_copy(update={"hidden": states})
    with pytest.raises(ConfigurationError, match="model"):
        ESIGuard(backend=backend, threshold=0.5, esi_probe=probe.model_copy(
            update={"model": "another/model"}))  # fmt: skip
    api = OpenAIBackend(base_url="http://127.0.0.1:9/v1", model="m", model_id=backend.model_id)
    with pytest.raises(ConfigurationError, match="hidden states"):
        ESIGuard(backend=api, threshold=0.5, esi_probe=probe)
    with pytest.raises(ConfigurationError, match="probe_band needs an esi_probe"):
        ESIGuard(backend=backend, threshold=0.5, probe_band=Band(low=0.4, high=0.6))
    with pytest.raises(ConfigurationError, match="must hold the threshold"):
        ESIGuard(backend=backend, threshold=0.5, esi_probe=probe,
                 probe_band=Band(low=0.6, high=0.7))  # fmt: skip


def test_the_probe_file_and_the_threshold_file_carry_the_cascade(tmp_path: Path) -> None:
    backend = FakeBackend(default_sensitivity=0.3)
    probe = constant_probe(backend, 0.1)
    probe.write(tmp_path / "probe.json")
    assert ESIProbe.read(tmp_path / "probe.json") == probe
    guard = ESIGuard(backend=backend, threshold=0.5, esi_probe=str(tmp_path / "probe.json"))
    assert guard.invoke("Where?").response_metadata["esi"]["decided_by"] == "probe"
    (tmp_path / "other.json").write_text('{"format": "esi-guard/threshold"}')
    with pytest.raises(ConfigurationError, match="not an esi-guard ESI probe"):
        ESIProbe.read(tmp_path / "other.json")
    plain = ESIGuard(backend=backend, threshold=0.5)
    file = ThresholdFile(threshold=0.5, method="youden", calibration_coverage=0.5,
                         calibration_selective_risk=None, model=backend.model_id,
                         scoring=plain.scoring_config, label_method="containment",
                         dataset={"path": "x", "sha256": "0", "n": 1}, metrics={},
                         created="now", esi_guard_version="0", esi_probe=probe,
                         probe_band=Band(low=0.05, high=0.6))  # fmt: skip
    file.write(tmp_path / "threshold.json")
    loaded = ESIGuard.from_calibration(tmp_path / "threshold.json", backend=backend)
    assert loaded.probe_band == Band(low=0.05, high=0.6)
    esi = loaded.invoke("Where?").response_metadata["esi"]
    assert esi["decided_by"] == "esi"  # 0.1 is inside the file's band


def test_distill_then_calibrate_with_the_probe_then_the_guard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commands end to end on the fake backend: questions only for distill (no answers
    in the file), labels for calibrate; the guard from the file runs the cascade."""
    from typer.testing import CliRunner

    from esi_guard.cli import app, build

    rng = np.random.default_rng(3)
    questions = [f"What is the name of thing number {i}?" for i in range(120)]
    levels = {q: float(rng.uniform(0.0, 1.0)) for q in questions}
    answers = {q: ("Atlantis" if levels[q] > 0.5 else f"city{i}") for i, q in
               enumerate(questions)}  # fmt: skip
    backend = FakeBackend(answers, sensitivity=levels)
    monkeypatch.setattr(build, "backend", lambda *args: backend)
    unlabelled = tmp_path / "questions.jsonl"
    unlabelled.write_text("".join(json.dumps({"question": q}) + "\n" for q in questions[:60]))
    labelled = tmp_path / "qa.jsonl"
    labelled.write_text("".join(json.dumps({"question": q, "answers": [f"city{i + 60}"]}) + "\n"
                                for i, q in enumerate(questions[60:])))  # fmt: skip
    common = ["--n-variants", "4", "--top-k", "10", "--max-new-tokens", "8"]
    probe_file = tmp_path / "probe.json"
    done = CliRunner().invoke(app, ["distill", "--data", str(unlabelled), "--out",
                                    str(probe_file), "--cache", str(tmp_path / "d.jsonl"),
                                    "--resamples", "50", *common])  # fmt: skip
    assert done.exit_code == 0, done.output
    probe = ESIProbe.read(probe_file)
    assert probe.model == backend.model_id and probe.scoring is not None
    assert probe.scoring.n_variants == 4 and probe.hidden is not None
    assert probe.quality["n"] == 60 and probe.quality["spearman"]["value"] > 0.5
    assert "Spearman with ESI" in done.output
    out = tmp_path / "threshold.json"
    calibrated = CliRunner().invoke(app, ["calibrate", "--data", str(labelled), "--out", str(out),
                                          "--select", "youden", "--esi-probe", str(probe_file),
                                          "--max-disagreement", "0.1", "--cache",
                                          str(tmp_path / "c.jsonl"), *common])  # fmt: skip
    assert calibrated.exit_code == 0, calibrated.output
    written = ThresholdFile.read(out)
    assert written.esi_probe == probe and written.probe_band is not None
    assert written.probe_band.fitted is not None
    assert written.probe_band.fitted["bound"] <= 0.1
    guard = ESIGuard.from_calibration(out, backend=backend)
    paths = {m.response_metadata["esi"]["decided_by"] for m in guard.batch(questions[60:80])}
    assert paths <= {"probe", "esi"} and "probe" in paths
    with pytest.raises(ConfigurationError, match="another/model"):
        ESIGuard(backend=backend, threshold=0.5,
                 esi_probe=probe.model_copy(update={"model": "another/model"}))  # fmt: skip


def test_a_label_free_band_is_certified_on_the_probes_held_out_answers() -> None:
    backend = FakeBackend(default_sensitivity=0.3)
    rng = np.random.default_rng(4)
    esi = rng.uniform(0, 1, 1000)
    estimates = esi + rng.normal(0, 0.05, esi.size)
    probe = constant_probe(backend, 0.1).model_copy(
        update={"held_out_estimates": tuple(estimates), "held_out_esi": tuple(esi)}
    )
    guard = ESIGuard(backend=backend, threshold=0.5, esi_probe=probe, probe_disagreement=0.05)
    band = guard._cascade.band if guard._cascade else None
    assert band is not None and band.fitted is not None and band.fitted["bound"] <= 0.05
    assert 0.3 < band.low < 0.5 < band.high < 0.7
    few = probe.model_copy(update={"held_out_estimates": (0.5,) * 10, "held_out_esi": (0.5,) * 10})
    guard = ESIGuard(backend=backend, threshold=0.5, esi_probe=few)
    esi_meta = guard.invoke("Where?").response_metadata["esi"]
    assert esi_meta["decided_by"] == "esi"  # nothing certified: ESI on every answer
