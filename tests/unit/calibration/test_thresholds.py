"""Threshold rules, the risk bound, and the risk guarantee over many random splits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esi_guard.calibration import thresholds

# Five answers; higher score = less trusted. Sorted by score: w=0,0,1,0,1.
SCORES = [0.1, 0.2, 0.3, 0.4, 0.5]
WRONG = [0, 0, 1, 0, 1]


def test_threshold_rules() -> None:
    chosen = thresholds.by_coverage(SCORES, WRONG, 0.6)
    assert (chosen.threshold, chosen.coverage) == (0.3, 0.6)
    assert chosen.selective_risk == pytest.approx(1 / 3)
    # Youden: flag > 0.2 catches both wrong (TPR 1) and one right (FPR 1/3): J = 2/3, best.
    assert thresholds.by_youden(SCORES, WRONG).threshold == 0.2
    # F1 of flagging wrong answers: > 0.2 gives P=2/3, R=1, F1=0.8; > 0.4 gives P=R=1/2.
    assert thresholds.by_f1(SCORES, WRONG).threshold == 0.2


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.3, 0.5])
@pytest.mark.parametrize("m", [2, 20, 100, 1000, 10_000])
def test_min_accepted_is_the_fewest_error_free_answers_the_bound_accepts(
    alpha: float, m: int
) -> None:
    delta = 0.1
    tests = thresholds.risk_tests(m)
    needed = thresholds.min_accepted(alpha, delta, tests)
    assert thresholds.risk_bound(0, needed, delta / tests) <= alpha
    assert needed == 1 or thresholds.risk_bound(0, needed - 1, delta / tests) > alpha


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.3])
def test_min_examples_is_the_smallest_set_the_risk_rule_can_accept_on(alpha: float) -> None:
    assert [thresholds.risk_tests(m) for m in (1, 2, 20, 100, 1000)] == [1, 1, 5, 7, 10]
    m = thresholds.min_examples(alpha, 0.1)
    # The search tests the median first: half the set must hold min_accepted answers.
    assert m // 2 + 1 >= thresholds.min_accepted(alpha, 0.1, thresholds.risk_tests(m))
    assert thresholds.by_risk(list(range(m)), [0] * m, alpha=alpha, delta=0.1) is not None
    assert thresholds.by_risk(list(range(m - 1)), [0] * (m - 1), alpha=alpha, delta=0.1) is None
    with pytest.raises(ValueError, match="alpha and delta"):
        thresholds.min_accepted(0.0, 0.1)


def test_clopper_pearson_bound_by_hand() -> None:
    # 0 errors in n: the bound solves (1-b)^n = delta.
    assert thresholds.risk_bound(0, 50, 0.1) == pytest.approx(1 - 0.1 ** (1 / 50))
    assert thresholds.risk_bound(5, 5, 0.1) == 1.0
    assert thresholds.risk_bound(10, 100, 0.05) > 0.1


def test_risk_rule_says_no_when_the_target_cannot_be_met() -> None:
    assert thresholds.by_risk(SCORES, WRONG, alpha=0.05, delta=0.1) is None
    rng = np.random.default_rng(3)
    w = rng.integers(0, 2, 2000)
    s = w * 2 + rng.normal(size=2000)
    choice = thresholds.by_risk(s, w, alpha=0.2, delta=0.1)
    assert choice is not None and choice.guarantee is not None
    assert choice.guarantee["risk_bound"] <= 0.2
    assert choice.selective_risk <= choice.guarantee["risk_bound"]
    assert 0.3 < choice.coverage < 0.7


def _population(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores and labels where wrong answers tend to score higher (AUROC about 0.75)."""
    wrong = rng.random(n) < 0.4
    scores = rng.normal(loc=np.where(wrong, 1.0, 0.0), scale=1.0)
    return scores, wrong.astype(int)


def test_the_risk_guarantee_holds_over_many_random_calibration_sets() -> None:
    # With probability >= 1 - delta over the calibration set, the true selective risk of the
    # chosen threshold is <= alpha. A large fresh test set stands in for the true risk.
    alpha, delta, n_cal, n_splits = 0.25, 0.1, 500, 600
    rng = np.random.default_rng(2024)
    test_scores, test_wrong = _population(rng, 200_000)
    order = np.argsort(test_scores)
    cum_errors = np.cumsum(test_wrong[order])
    sorted_scores = test_scores[order]
    violations = chosen = 0
    for _ in range(n_splits):
        scores, wrong = _population(rng, n_cal)
        choice = thresholds.by_risk(scores, wrong, alpha, delta)
        if choice is None:
            continue
        chosen += 1
        kept = int(np.searchsorted(sorted_scores, choice.threshold, side="right"))
        risk = cum_errors[kept - 1] / kept if kept else 0.0
        violations += risk > alpha
    assert chosen >= n_splits * 0.9  # the target is reachable for this population
    rate = violations / chosen
    slack = 3 * math.sqrt(delta * (1 - delta) / chosen)
    print(f"risk guarantee: {violations}/{chosen} splits above alpha ({rate:.3f}; delta {delta})")
    assert rate <= delta + slack


@pytest.mark.parametrize(("alpha", "met"), [(0.2, False), (0.37, True)])
def test_the_search_says_what_each_tested_threshold_got(alpha: float, met: bool) -> None:
    rng = np.random.default_rng(5)
    w = rng.integers(0, 2, 75)
    s = w + rng.normal(size=75)
    tested = thresholds.risk_search(s, w, alpha=alpha, delta=0.1)
    assert 1 <= len(tested) <= thresholds.risk_tests(75)
    assert tested[0].accepted == 38  # the median first
    level = 0.1 / thresholds.risk_tests(75)
    for test in tested:
        accepted = s <= test.threshold
        assert (test.accepted, test.errors) == (int(accepted.sum()), int(w[accepted].sum()))
        assert test.bound == thresholds.risk_bound(test.errors, test.accepted, level)
    choice = thresholds.by_risk(s, w, alpha=alpha, delta=0.1)
    within = [t for t in tested if t.bound <= alpha]
    assert bool(within) is met and (choice is not None) is met
    if choice is not None:  # the tested threshold accepting most within alpha
        assert choice.threshold == max(within, key=lambda t: t.accepted).threshold


def test_class_counts_and_the_documented_minimum() -> None:
    assert thresholds.class_counts(WRONG) == (2, 3)
    assert thresholds.class_counts([0, 0]) == (0, 2)
    assert thresholds.MIN_PER_CLASS == 10  # docs/calibration.md names it
