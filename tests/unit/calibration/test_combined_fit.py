"""Fitting the combined score: monotone, calibrated on held-out answers, a wrong-way signal
weightless, and the projected Newton fit at the constrained optimum."""

from __future__ import annotations

import numpy as np
import pytest

from esi_guard import ConfigurationError
from esi_guard.calibration.combined_fit import STRENGTHS, _fit, fit_combined, fit_path
from esi_guard.calibration.metrics import expected_calibration_error


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


@pytest.mark.parametrize("seed", range(6))
def test_the_fit_reaches_the_constrained_optimum(seed: int) -> None:
    # Badly scaled features (as a probe's PCA components are) and weights that want to be
    # negative where they must not: the projected Newton fit meets the optimality
    # conditions and is no worse than scipy's L-BFGS-B on the same problem.
    from scipy.optimize import minimize

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


def test_fits_solved_together_reach_each_one_s_own_optimum() -> None:
    # Every data set (a probe's folds), width (its PCA sizes) and strength solved in one
    # stack of Newton steps: the same optimum as each fitted alone, bounded weights >= 0.
    rng = np.random.default_rng(7)
    n, d, bounded = 120, 12, 3
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 10, size=d)
    y = (rng.random(n) < 1 / (1 + np.exp(1.0 - 0.7 * x[:, 4] / x[:, 4].std()))).astype(float)
    folds = [np.arange(n) % 3 != k for k in range(3)]  # three sets of rows, of two sizes
    folds[0][:5] = False
    xs, ys = [x[rows] for rows in folds], [y[rows] for rows in folds]
    problems = [(i, width, c) for i in range(3) for width in (d - 4, d) for c in STRENGTHS]
    path = fit_path(xs, ys, problems, bounded)
    assert len(path) == len(problems)
    for (i, width, strength), (w, b) in zip(problems, path, strict=True):
        assert w.shape == (width,)
        alone_w, alone_b = _fit(xs[i][:, :width], ys[i], strength, bounded)
        assert (w[:bounded] >= 0).all()
        np.testing.assert_allclose(w, alone_w, rtol=1e-6, atol=1e-7)
        assert b == pytest.approx(alone_b, rel=1e-6, abs=1e-7)
