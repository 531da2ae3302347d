"""The combined score at run time: its free signals, a guard deciding on ``p_wrong``, and
``calibrate --score combined`` fitted on one part and chosen on another. (Fitting it:
tests/unit/calibration/test_combined_fit.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module
from esi_guard.combined import CombinedScore, answer_signals, free_signals
from esi_guard.scoring import TopK, truncated_entropy


def test_free_signals_match_the_formula() -> None:
    topk = TopK(np.array([[3, 4], [5, 6]]), np.array([[2.0, 1.0], [1.0, 1.0]]))
    got = free_signals(topk, [3, 6], "logits")
    nll = -math.log(math.e**2 / (math.e**2 + math.e)) + math.log(2)  # summed over tokens
    assert got["nll"] == pytest.approx(nll)
    p = math.e**2 / (math.e**2 + math.e)
    entropy = (-(p * math.log(p) + (1 - p) * math.log(1 - p)) + math.log(2)) / 2
    assert got["entropy"] == pytest.approx(entropy)
    assert got["max_nll"] == pytest.approx(math.log(2))  # the least likely token: 1/2
    assert free_signals(topk, [3, 6], "logits", truncated_entropy(topk)) == got  # given alphas
    # A token outside the top-k gets ESI's fill value: less likely than every kept one.
    assert free_signals(topk, [9, 6], "logits")["nll"] > got["nll"]


def test_an_answer_without_tokens_or_finite_rows_has_no_free_signals() -> None:
    topk = TopK(np.array([[3, 4], [5, 6]]), np.array([[2.0, 1.0], [1.0, 1.0]]))
    got = answer_signals(topk, [3, 6], "logits", "Paris.")
    assert got == {**free_signals(topk, [3, 6], "logits"), "repetition": 0.0}
    assert answer_signals(None, [3, 6], "logits", "Paris.") is None
    assert answer_signals(topk, [], "logits", "") is None
    nan = TopK(topk.ids, np.array([[np.nan, 1.0], [1.0, 1.0]]))
    assert answer_signals(nan, [3, 6], "logits", "Paris.") is None  # would read as certain


SURE, UNSURE = "What is the capital city of France?", "Who won the chess tournament of 1911?"


def test_a_guard_with_a_combined_score_decides_on_p_wrong() -> None:
    model = CombinedScore(mean=(0.0, 0.0, 0.0), scale=(1.0, 1.0, 1.0), weights=(20.0, 0.0, 0.0),
                          intercept=-2.0, strength=0.1, n_fit=100)  # fmt: skip
    backend = FakeBackend({SURE: "Paris", UNSURE: "Karl"}, sensitivity={UNSURE: 2.0})
    guard = ESIGuard(backend=backend, threshold=0.5, combined=model)
    sure, unsure = (m.response_metadata["esi"] for m in guard.batch([SURE, UNSURE]))
    for esi in (sure, unsure):
        assert set(esi["signals"]) == {"nll", "entropy", "max_nll", "repetition"}
        assert esi["p_wrong"] == pytest.approx(
            model.p_wrong({"esi": esi["score"], **esi["signals"]})
        )
        assert esi["decision"] == ("accept" if esi["p_wrong"] <= 0.5 else "flag")
    assert sure["p_wrong"] < unsure["p_wrong"]
    assert (
        ESIGuard(backend=backend, threshold=0.5).invoke(SURE).response_metadata["esi"]["p_wrong"]
        is None
    )


def test_calibrate_with_a_combined_score_then_evaluate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 80 questions: the right answers are stable under SOC, most wrong ones move.
    rows, answers, sensitivity = [], {}, {}
    for i in range(80):
        question = f"Which capital city does the country number {i} have today?"
        right = i % 3 != 0
        rows.append({"question": question, "answer": f"city{i}"})
        answers[question] = f"city{i}" if right else "Atlantis"
        sensitivity[question] = 0.1 if right else (2.0 if i % 2 else 0.3)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    backend = FakeBackend(answers, sensitivity=sensitivity)
    monkeypatch.setattr(build, "backend", lambda *args: backend)
    out = tmp_path / "threshold.json"
    common = ["--data", str(data), "--resamples", "50"]
    runner = CliRunner()
    result = runner.invoke(cli_module.app, [
        "calibrate", *common, "--n-variants", "4", "--cache", str(tmp_path / "c.jsonl"),
        "--score", "combined",
        "--select", "coverage", "--coverage", "0.6", "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "combined score: cross-fitted on all 80 answers" in result.output
    written = ThresholdFile.read(out)
    assert written.combined is not None and written.combined_report is not None
    assert written.combined_report["n_select"] == 80 and 0 <= written.threshold <= 1
    split = runner.invoke(cli_module.app, [
        "calibrate", *common, "--n-variants", "4", "--cache", str(tmp_path / "c.jsonl"),
        "--score", "combined", "--fit-fraction", "0.5",
        "--select", "coverage", "--coverage", "0.6", "--out", str(tmp_path / "split.json"),
    ])  # fmt: skip
    assert split.exit_code == 0, split.output
    assert "combined score: fitted on 40 answers; on the other 40" in split.output
    guard = ESIGuard.from_calibration(out, backend=backend)
    assert guard.combined == written.combined
    with pytest.raises(ConfigurationError, match="from the threshold file"):
        ESIGuard.from_calibration(out, backend=backend, combined=None)
    evaluated = runner.invoke(cli_module.app, [
        "evaluate", "--threshold", str(out), *common, "--cache", str(tmp_path / "e.jsonl"),
    ])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert "P(wrong): AUROC" in evaluated.output
