"""The combined score: monotone, calibrated, fitted on one part and chosen on another."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.calibration.metrics import expected_calibration_error
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module
from esi_guard.combined import CombinedScore, fit_combined, free_signals
from esi_guard.scoring import TopK, truncated_entropy


def synthetic(n: int, seed: int) -> tuple[list[dict[str, float]], list[int]]:
    """Wrong answers more likely with higher ESI and NLL; entropy is noise."""
    rng = np.random.default_rng(seed)
    esi, nll, entropy = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    p = 1 / (1 + np.exp(-(-1.0 + 1.5 * esi + 0.8 * nll)))
    wrong = (rng.random(n) < p).astype(int)
    signals = [
        {"esi": a, "nll": b, "entropy": c} for a, b, c in zip(esi, nll, entropy, strict=True)
    ]
    return signals, wrong.tolist()


def test_the_fit_is_monotone_and_calibrated_on_held_out_answers() -> None:
    signals, wrong = synthetic(3000, seed=1)
    model = fit_combined(signals[:2000], wrong[:2000])
    assert all(w >= 0 for w in model.weights)
    weights = dict(zip(model.features, model.weights, strict=True))
    assert weights["esi"] > weights["nll"] > weights["entropy"]
    held = [model.p_wrong(s) for s in signals[2000:]]
    assert expected_calibration_error(held, wrong[2000:]) < 0.05
    # Monotone: raising any one signal never lowers p_wrong.
    base = {"esi": 0.0, "nll": 0.0, "entropy": 0.0}
    for name in base:
        assert model.p_wrong({**base, name: 2.0}) >= model.p_wrong(base)


def test_a_signal_that_points_the_wrong_way_gets_no_weight() -> None:
    signals, wrong = synthetic(1000, seed=2)
    flipped = [{**s, "nll": -s["nll"]} for s in signals]  # now higher means right
    model = fit_combined(flipped, wrong)
    assert dict(zip(model.features, model.weights, strict=True))["nll"] == 0.0


def test_too_few_answers_of_a_class_is_a_clear_error() -> None:
    signals, _ = synthetic(20, seed=3)
    with pytest.raises(ConfigurationError, match="at least 5 wrong"):
        fit_combined(signals, [1, 1] + [0] * 18)
    model = fit_combined(*synthetic(200, seed=3))
    with pytest.raises(ConfigurationError, match="nll"):
        model.p_wrong({"esi": 0.1, "entropy": 1.0})


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
    with pytest.raises(ConfigurationError, match="combined"):
        ESIGuard(backend=backend, threshold=0.5, combined=model, min_variants=2, stop_constant=1.0)


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
    both = runner.invoke(cli_module.app, [
        "calibrate", *common, "--n-variants", "4", "--score", "combined", "--min-variants", "2",
        "--out", str(out),
    ])  # fmt: skip
    assert both.exit_code == 2 and "choose one" in both.output


@pytest.mark.parametrize("seed", range(6))
def test_the_fit_reaches_the_constrained_optimum(seed: int) -> None:
    # Badly scaled features (as a probe's PCA components are) and weights that want to be
    # negative where they must not: the projected Newton fit meets the optimality
    # conditions and is no worse than scipy's L-BFGS-B on the same problem.
    from scipy.optimize import minimize

    from esi_guard.combined import _fit

    rng = np.random.default_rng(seed)
    n, d, bounded, strength = 300, 20, 3, [0.01, 0.1, 1.0][seed % 3]
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 20, size=d)
    logit = -2.0 - 0.5 * x[:, 0] / x[:, 0].std() + 0.8 * x[:, 5] / x[:, 5].std()
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(float)
    w, b = _fit(x, y, strength, bounded)

    def objective(theta: np.ndarray) -> float:
        z = x @ theta[:-1] + theta[-1]
        return float(np.mean(np.logaddexp(0, z) - y * z) + 0.5 * strength * theta[:-1] @ theta[:-1])

    assert (w[:bounded] >= 0).all()
    p = 1 / (1 + np.exp(-(x @ w + b)))
    grad = np.append(x.T @ (p - y) / n + strength * w, np.mean(p - y))
    at_bound = np.append(w[:bounded] == 0, np.zeros(d - bounded + 1, dtype=bool))
    assert np.abs(grad[~at_bound]).max() < 1e-6
    assert (grad[at_bound] >= -1e-9).all()
    bounds = [(0, None)] * bounded + [(None, None)] * (d - bounded + 1)
    reference = minimize(objective, np.zeros(d + 1), method="L-BFGS-B", bounds=bounds)
    assert objective(np.append(w, b)) <= reference.fun + 1e-9
