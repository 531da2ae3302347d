"""Choosing the threshold: by coverage, by F1 or Youden's J, or by a guaranteed selective risk.

The guard accepts an answer when ``score <= threshold``; every rule returns a :class:`Choice`.
The risk rule is SGR (Geifman & El-Yaniv, NeurIPS 2017): a binary search tests ``ceil(log2 m)``
thresholds by one-sided Clopper-Pearson bounds at level ``delta / ceil(log2 m)`` (union bound),
and returns the one of largest coverage with bound ``<= alpha``, if any: with probability
``>= 1 - delta``, the error rate among accepted answers is then at most ``alpha``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "MIN_PER_CLASS",
    "Choice",
    "RiskTest",
    "by_coverage",
    "by_f1",
    "by_risk",
    "by_youden",
    "class_counts",
    "min_accepted",
    "min_examples",
    "risk_bound",
    "risk_search",
    "risk_tests",
]


MIN_PER_CLASS = 10
"""Fewer wrong (or right) calibration answers than this are too few to lean on.

The threshold and metrics (AUROC, PRR) then turn on those few answers. ``esi-guard calibrate``
warns below it and refuses a set with none of a kind.
"""


def class_counts(wrong: ArrayLike) -> tuple[int, int]:
    """How many of the labelled answers are wrong, and how many right."""
    w = np.asarray(wrong).astype(np.int_)
    return int(w.sum()), int(w.size - w.sum())


@dataclass(frozen=True)
class Choice:
    """A chosen threshold and what it does on the calibration data."""

    threshold: float
    method: str
    coverage: float
    """Fraction of calibration answers accepted (score <= threshold)."""
    selective_risk: float
    """Error rate among the accepted calibration answers (NaN if none)."""
    guarantee: dict[str, Any] | None = field(default=None)
    """For the risk rule: alpha, delta, the bound, and the statement."""


def _arrays(scores: ArrayLike, wrong: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.int_]]:
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(wrong).astype(np.int_)
    if s.ndim != 1 or s.shape != w.shape or s.size == 0 or not np.isfinite(s).all():
        msg = "need non-empty, finite 1-D scores and labels of the same length"
        raise ValueError(msg)
    return s, w


def _choice(
    s: NDArray[np.float64], w: NDArray[np.int_], threshold: float, method: str, **extra: Any
) -> Choice:
    accepted = s <= threshold
    n = int(accepted.sum())
    risk = float(w[accepted].mean()) if n else math.nan
    return Choice(float(threshold), method, n / s.size, risk, **extra)


def by_coverage(scores: ArrayLike, wrong: ArrayLike, coverage: float) -> Choice:
    """The smallest threshold accepting at least ``coverage`` of the calibration answers."""
    if not 0 < coverage <= 1:
        msg = f"coverage must be in (0, 1], got {coverage}"
        raise ValueError(msg)
    s, w = _arrays(scores, wrong)
    ordered = np.sort(s)
    index = max(0, math.ceil(coverage * s.size - 1e-9) - 1)
    return _choice(s, w, float(ordered[index]), f"coverage={coverage:g}")


def _flag_counts(
    s: NDArray[np.float64], w: NDArray[np.int_]
) -> tuple[NDArray[np.float64], NDArray[np.int_], NDArray[np.int_]]:
    """Candidate thresholds (each score, one below) and the wrong and right answers each flags."""
    candidates = np.concatenate([[np.nextafter(s.min(), -np.inf)], np.unique(s)])
    flagged = s[None, :] > candidates[:, None]
    wrong_flagged = (flagged & (w[None, :] == 1)).sum(axis=1)
    right_flagged = (flagged & (w[None, :] == 0)).sum(axis=1)
    return candidates, wrong_flagged, right_flagged


def by_youden(scores: ArrayLike, wrong: ArrayLike) -> Choice:
    """The threshold maximising Youden's J = TPR - FPR of flagging wrong answers."""
    s, w = _arrays(scores, wrong)
    candidates, tp, fp = _flag_counts(s, w)
    positives, negatives = max(int(w.sum()), 1), max(int((1 - w).sum()), 1)
    best = int(np.argmax(tp / positives - fp / negatives))
    return _choice(s, w, float(candidates[best]), "youden")


def by_f1(scores: ArrayLike, wrong: ArrayLike) -> Choice:
    """The threshold maximising F1 of flagging wrong answers."""
    s, w = _arrays(scores, wrong)
    candidates, tp, fp = _flag_counts(s, w)
    fn = int(w.sum()) - tp
    f1 = np.where(tp > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 0.0)
    return _choice(s, w, float(candidates[int(np.argmax(f1))]), "f1")


def risk_bound(errors: int, n: int, delta: float) -> float:
    """One-sided Clopper-Pearson upper bound on a risk from ``errors`` in ``n`` (level 1-delta)."""
    from scipy.stats import beta

    if n == 0:
        return 1.0
    if errors >= n:
        return 1.0
    return float(beta.ppf(1 - delta, errors + 1, n - errors))


def risk_tests(m: int) -> int:
    """How many thresholds SGR's binary search tests on ``m`` calibration answers."""
    return max(1, math.ceil(math.log2(m))) if m > 1 else 1


def min_accepted(alpha: float, delta: float, tests: int = 1) -> int:
    """The fewest accepted answers (all right) that can meet selective risk ``alpha``.

    With bounds at level ``delta / tests``: ``ceil(log(delta / tests) / log(1 - alpha))``.
    """
    if not 0 < alpha < 1 or not 0 < delta < 1 or tests < 1:
        msg = f"need alpha and delta in (0, 1) and tests >= 1, got {alpha}, {delta}, {tests}"
        raise ValueError(msg)
    return max(1, math.ceil(math.log(delta / tests) / math.log1p(-alpha)))


def min_examples(alpha: float, delta: float) -> int:
    """The smallest set the risk rule can return a threshold on (about 2x :func:`min_accepted`)."""
    m = 1
    while m // 2 + 1 < min_accepted(alpha, delta, risk_tests(m)):
        m += 1
    return m


@dataclass(frozen=True)
class RiskTest:
    """A threshold SGR's search tested, and the bound it got."""

    threshold: float
    accepted: int
    """Calibration answers with ``score <= threshold``."""
    errors: int
    """Wrong answers among them."""
    bound: float
    """Upper confidence bound of their error rate (Clopper-Pearson at ``delta / tests``)."""


def risk_search(scores: ArrayLike, wrong: ArrayLike, alpha: float, delta: float) -> list[RiskTest]:
    """The thresholds SGR's search tests (:func:`risk_tests` at most), in order, with bounds."""
    if not 0 < alpha < 1 or not 0 < delta < 1:
        msg = f"alpha and delta must be in (0, 1), got {alpha} and {delta}"
        raise ValueError(msg)
    s, w = _arrays(scores, wrong)
    ordered = np.sort(s)
    m = s.size
    steps = risk_tests(m)
    level = delta / steps
    low, high = 0, m - 1  # indices into the sorted scores: accept those <= ordered[z]
    tested: list[RiskTest] = []
    for _ in range(steps):
        z = (low + high + 1) // 2
        accepted = s <= ordered[z]
        n, errors = int(accepted.sum()), int(w[accepted].sum())
        bound = risk_bound(errors, n, level)
        tested.append(RiskTest(float(ordered[z]), n, errors, bound))
        if bound <= alpha:
            low = z  # meets the target: try accepting more
        else:
            high = z - 1 if z > low else z  # too risky: accept fewer
        if low >= high:
            break
    return tested


def by_risk(scores: ArrayLike, wrong: ArrayLike, alpha: float, delta: float) -> Choice | None:
    """SGR: selective risk <= ``alpha`` w.p. ``>= 1 - delta``, or None if no tested one meets it."""
    tested = risk_search(scores, wrong, alpha, delta)
    met = [test for test in tested if test.bound <= alpha]
    if not met:
        return None
    best = max(met, key=lambda test: test.accepted)  # the first of the largest
    bound, n, errors = best.bound, best.accepted, best.errors
    s, w = _arrays(scores, wrong)
    steps = risk_tests(s.size)
    guarantee = {
        "kind": "selective risk (Geifman & El-Yaniv 2017, SGR, Clopper-Pearson bound)",
        "alpha": alpha,
        "delta": delta,
        "risk_bound": bound,
        "tests": steps,
        "calibration_accepted": n,
        "calibration_errors": errors,
        "statement": (
            f"with probability >= {1 - delta:g} over the calibration set, the error rate "
            f"among accepted answers is <= {alpha:g} (bound {bound:.4f})"
        ),
    }
    return _choice(s, w, best.threshold, f"risk<={alpha:g}@delta={delta:g}", guarantee=guarantee)
