"""Choosing the threshold, including by a selective-risk target with a guarantee.

Rules: by coverage, by F1 or Youden's J of flagging wrong answers, or by a selective-risk
target with a finite-sample guarantee.

The guard accepts an answer when ``score <= threshold``. Every rule returns a
:class:`Choice`: the threshold, what it achieves on the calibration data, and for the risk
rule the guarantee it carries.

**Risk with a guarantee** (Geifman & El-Yaniv, *Selective Classification for Deep Neural
Networks*, NeurIPS 2017, "SGR"). For a threshold accepting ``n`` calibration answers with
``k`` wrong, the one-sided Clopper-Pearson bound ``B(k, n, d)`` (the largest risk ``b``
with ``P(Binomial(n, b) <= k) >= d``) exceeds the true selective risk with probability at
least ``1 - d``. SGR tests ``ceil(log2 m)`` thresholds by binary search over the sorted
scores, each at level ``delta / ceil(log2 m)``, so that all its bounds hold at once with
probability ``1 - delta`` (union bound). It returns the tested threshold of largest
coverage whose bound is at most ``alpha``: with probability at least ``1 - delta`` over
the calibration set, the error rate among accepted answers is at most ``alpha``. If no
tested threshold meets ``alpha``, there is no threshold to return; :func:`risk_search`
gives the tested thresholds and their bounds, to say how far the best one was.
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

Every rule compares the wrong answers' scores with the right ones': with a handful of
either kind, the threshold and the metrics (AUROC, PRR) turn on those few answers and move
a lot from one sample to the next. ``esi-guard calibrate`` warns below it and refuses a
set with none of a kind.
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
    """How many wrong and right answers each candidate threshold flags (score > threshold).

    Candidates: every distinct score, and one below the lowest.
    """
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
    """The fewest accepted answers that can meet selective risk ``alpha``: all of them right.

    With no error among ``n`` accepted answers the Clopper-Pearson bound at level
    ``delta / tests`` is ``1 - (delta / tests) ** (1 / n)``; it is at most ``alpha`` from
    ``n = ceil(log(delta / tests) / log(1 - alpha))`` on. With errors more are needed: a
    calibration set smaller than this can never give the risk rule a threshold.
    """
    if not 0 < alpha < 1 or not 0 < delta < 1 or tests < 1:
        msg = f"need alpha and delta in (0, 1) and tests >= 1, got {alpha}, {delta}, {tests}"
        raise ValueError(msg)
    return max(1, math.ceil(math.log(delta / tests) / math.log1p(-alpha)))


def min_examples(alpha: float, delta: float) -> int:
    """The smallest calibration set on which the risk rule can return a threshold.

    SGR's search first tests the median score's threshold (accepting half the set, plus
    one) and only goes lower when it fails, so even with no wrong answer that half must
    hold :func:`min_accepted` answers: the set needs about twice as many.
    """
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
    """The thresholds SGR's binary search tests for (alpha, delta), in the order tested.

    At most :func:`risk_tests` of them, each bound at level ``delta / risk_tests(m)``; a
    threshold meeting ``alpha`` moves the search up (accept more), one failing it down.
    """
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
    """SGR: a threshold whose selective risk is at most ``alpha`` w.p. ``>= 1 - delta``.

    Returns None when no tested threshold meets (alpha, delta): then no threshold should
    be written (:func:`risk_search` says what each tested threshold got).
    """
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
