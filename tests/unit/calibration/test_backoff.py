"""Conformal back-off: a sentence threshold whose answer failure rate is bounded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esi_guard.calibration.backoff import by_backoff, first_wrong
from esi_guard.calibration.thresholds import risk_bound


def _answers(rng: np.random.Generator, n: int) -> list[tuple[list[float], list[bool]]]:
    """Answers of 1-4 sentences; wrong sentences score higher on average."""
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 5))
        wrong = list(rng.random(k) < 0.3)
        scores = [float(rng.normal(1.0 if w else 0.0, 0.7)) for w in wrong]
        out.append((scores, wrong))
    return out


def test_first_wrong_is_the_lowest_wrong_score() -> None:
    assert first_wrong([0.1, 0.5, 0.3], [False, True, True]) == 0.3
    assert first_wrong([0.1], [False]) == math.inf


def test_the_threshold_is_the_largest_whose_bound_meets_alpha() -> None:
    answers = _answers(np.random.default_rng(0), 400)
    choice = by_backoff(answers, alpha=0.2, delta=0.1)
    assert choice is not None and choice.guarantee is not None
    t = choice.threshold
    failures = sum(first_wrong(s, w) <= t for s, w in answers)
    assert choice.guarantee["calibration_failures"] == failures
    assert risk_bound(failures, 400, 0.1) <= 0.2 == choice.guarantee["alpha"]
    higher = min(x for s, _ in answers for x in s if x > t)
    assert risk_bound(sum(first_wrong(s, w) <= higher for s, w in answers), 400, 0.1) > 0.2
    assert (
        "share of answers whose kept sentences include a wrong one"
        in (choice.guarantee["statement"])
    )
    assert choice.method == "backoff<=0.2@delta=0.1"


def test_the_guarantee_holds_on_new_answers_over_many_calibration_sets() -> None:
    rng = np.random.default_rng(1)
    test = np.asarray([first_wrong(s, w) for s, w in _answers(rng, 20000)])
    violations = 0
    for _ in range(200):
        choice = by_backoff(_answers(rng, 200), alpha=0.2, delta=0.1)
        assert choice is not None
        violations += float(np.mean(test <= choice.threshold)) > 0.2
    assert violations / 200 <= 0.1 + 0.05  # delta, plus the simulation's own noise


def test_no_threshold_when_even_the_lowest_score_fails_the_bound() -> None:
    answers = [([0.1], [True]) for _ in range(20)]
    assert by_backoff(answers, alpha=0.1, delta=0.1) is None


@pytest.mark.parametrize(("alpha", "delta"), [(0.0, 0.1), (0.2, 1.0)])
def test_bad_levels_are_refused(alpha: float, delta: float) -> None:
    with pytest.raises(ValueError, match="alpha and delta"):
        by_backoff([([0.1], [False])], alpha=alpha, delta=delta)
