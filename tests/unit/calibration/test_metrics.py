"""Calibration metrics against hand values and scikit-learn, with bootstrap intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from esi_guard.calibration import metrics

# Five answers; higher score = less trusted. Sorted by score: w=0,0,1,0,1.
SCORES = [0.1, 0.2, 0.3, 0.4, 0.5]
WRONG = [0, 0, 1, 0, 1]


def test_auroc_matches_scikit_learn_and_a_hand_count() -> None:
    # Pairs (wrong, right) with the wrong one scored higher: (0.3>0.1, 0.3>0.2, 0.5>all) = 5 of 6.
    assert metrics.auroc(SCORES, WRONG) == pytest.approx(5 / 6)
    rng = np.random.default_rng(1)
    s, w = rng.normal(size=200), rng.integers(0, 2, 200)
    assert metrics.auroc(s, w) == pytest.approx(roc_auc_score(w, s))
    tied = rng.integers(0, 4, 200).astype(float)  # many ties: each counts one half
    assert metrics.auroc(tied, w) == pytest.approx(roc_auc_score(w, tied))
    assert metrics.auroc([0.5, 0.5], [0, 1]) == 0.5
    assert math.isnan(metrics.auroc(SCORES, [1] * 5))


def test_risk_coverage_aurc_and_prr_by_hand() -> None:
    coverage, risk = metrics.risk_coverage(SCORES, WRONG)
    np.testing.assert_allclose(coverage, [0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(risk, [0, 0, 1 / 3, 1 / 4, 2 / 5])
    assert metrics.aurc(SCORES, WRONG) == pytest.approx((0 + 0 + 1 / 3 + 1 / 4 + 2 / 5) / 5)
    oracle = (0 + 0 + 0 + 1 / 4 + 2 / 5) / 5
    random = 2 / 5
    expected = (random - metrics.aurc(SCORES, WRONG)) / (random - oracle)
    assert metrics.prr(SCORES, WRONG) == pytest.approx(expected)
    assert metrics.prr(WRONG, WRONG) == pytest.approx(1.0)  # the oracle itself


def test_selective_accuracy_keeps_the_lowest_scores() -> None:
    assert metrics.selective_accuracy(SCORES, WRONG, 0.4) == 1.0  # 2 kept: both right
    assert metrics.selective_accuracy(SCORES, WRONG, 0.8) == 0.75  # 4 kept, 1 wrong
    assert metrics.selective_accuracy(SCORES, WRONG, 1.0) == 0.6
    with pytest.raises(ValueError, match="coverage"):
        metrics.selective_accuracy(SCORES, WRONG, 0.0)


def test_bootstrap_interval_brackets_the_value_and_summarise_names_every_metric() -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(0, 2, 300)
    s = w + rng.normal(scale=1.0, size=300)
    estimate = metrics.bootstrap(metrics.auroc, s, w, n_resamples=300)
    assert estimate.low < estimate.value < estimate.high
    assert 0.6 < estimate.value < 0.9
    summary = metrics.summarise(s, w, n_resamples=50)
    assert set(summary) == {"auroc", "aurc", "prr", "selective_accuracy@90%",
                            "selective_accuracy@80%", "selective_accuracy@70%"}  # fmt: skip


def test_grouped_bootstrap_measures_each_fitted_model_on_its_own_answers() -> None:
    # Two cross-fitted halves: each ranks its own answers perfectly, but the second
    # model's outputs sit lower, so pooling them ranks half of its wrong answers below
    # the first model's right ones.
    w = np.array([0, 0, 1, 1] * 10)
    first = np.array([0.6, 0.7, 0.8, 0.9] * 5)
    second = np.array([0.1, 0.2, 0.3, 0.4] * 5)
    scores = np.concatenate([first, second])
    groups = np.repeat([0, 1], 20)
    assert metrics.auroc(scores, w) < 0.8
    grouped = metrics.bootstrap(metrics.auroc, scores, w, n_resamples=200, groups=groups)
    assert grouped.value == grouped.low == grouped.high == 1.0
    # Paired: resamples keep each group's examples together for both scores.
    flat = np.tile([0.1, 0.5, 0.3, 0.4], 10)  # per group: AUROC 0.5
    diff = metrics.paired_difference(metrics.auroc, scores, flat, w, n_resamples=200,
                                     groups=groups)  # fmt: skip
    assert diff.value == pytest.approx(0.5)
    assert diff.low > 0
    # Without groups the resampling is what it always was (the same draws, seed 0).
    plain = metrics.bootstrap(metrics.auroc, scores, w, n_resamples=200)
    same = metrics.bootstrap(metrics.auroc, scores, w, n_resamples=200, groups=np.zeros(40))
    assert (plain.value, plain.low, plain.high) == (same.value, same.low, same.high)
    with pytest.raises(ValueError, match="one label per example"):
        metrics.bootstrap(metrics.auroc, scores, w, groups=[0, 1])


@pytest.mark.parametrize(
    ("wrong", "why"),
    [([0, 0, 0], "no wrong answer"), ([1, 1], "no right answer"), ([], "no labelled answer"),
     (WRONG, None)],
)  # fmt: skip
def test_undefined_because_says_why_auroc_and_prr_are_nan(
    wrong: list[int], why: str | None
) -> None:
    assert metrics.undefined_because(wrong) == why
    if why is not None and wrong:
        scores = list(range(len(wrong)))
        assert math.isnan(metrics.auroc(scores, wrong)) and math.isnan(metrics.prr(scores, wrong))
        summary = metrics.summarise(scores, wrong, n_resamples=20)  # and no warning raised
        assert math.isnan(summary["auroc"].value) and summary["aurc"].value in (0.0, 1.0)
