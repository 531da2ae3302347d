"""A sentence threshold with a guarantee over answers: conformal back-off.

A redacting guard keeps the sentences scored at or below ``t``; an answer *fails* when it keeps a
wrong one (conformal factuality, Mohri & Hashimoto, ICML 2024). ``t`` is the largest calibration
sentence score whose one-sided Clopper-Pearson bound on the failure rate (monotone in ``t``) at
level ``delta`` is at most ``alpha``, tested from the smallest up: a fixed sequence (*Learn then
Test*), no union bound. So with probability ``>= 1 - delta``, at most ``alpha`` of new
(exchangeable) answers keep a wrong sentence. Unlabelled sentences (not aligned to a question)
cannot be wrong here: the guarantee covers labelled ones. Pure: arrays in, a :class:`Choice` out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from esi_guard.calibration.thresholds import Choice, risk_bound

__all__ = ["by_backoff", "first_wrong"]


def first_wrong(scores: Sequence[float], wrong: Sequence[bool]) -> float:
    """The lowest score among an answer's wrong sentences (``inf`` when none is wrong)."""
    return min((s for s, w in zip(scores, wrong, strict=True) if w), default=math.inf)


def by_backoff(
    answers: Sequence[tuple[Sequence[float], Sequence[bool]]], alpha: float, delta: float
) -> Choice | None:
    """The sentence threshold of largest coverage whose answer failure rate is bounded.

    Args:
        answers: Per calibration answer, its labelled sentences' scores and whether each is wrong.
        alpha: The largest share of answers with a wrong kept sentence.
        delta: The probability that the bound fails.

    Returns:
        The choice (``coverage``: share of sentences kept; ``selective_risk``: share wrong among
        them; ``guarantee``), or None when even the lowest score fails the bound.
    """
    if not 0 < alpha < 1 or not 0 < delta < 1:
        msg = f"alpha and delta must be in (0, 1), got {alpha} and {delta}"
        raise ValueError(msg)
    answers = [(list(s), list(w)) for s, w in answers if len(s)]
    if not answers:
        msg = "no calibration answer with a labelled sentence"
        raise ValueError(msg)
    scores = np.asarray([x for s, _ in answers for x in s], dtype=np.float64)
    wrong = np.asarray([x for _, w in answers for x in w], dtype=bool)
    if not np.isfinite(scores).all():
        msg = "sentence scores must be finite"
        raise ValueError(msg)
    fails_from = np.sort([first_wrong(s, w) for s, w in answers])
    n = len(answers)
    # The bound rises with the failures, and they with t: the candidates that pass are
    # those with at most `allowed` failures, all below the first that fails.
    allowed = -1
    while allowed < n and risk_bound(allowed + 1, n, delta) <= alpha:
        allowed += 1
    limit = fails_from[allowed] if 0 <= allowed < n else (math.inf if allowed == n else -math.inf)
    passing = scores[scores < limit]
    if not passing.size:
        return None
    t = float(passing.max())
    failures = int(np.searchsorted(fails_from, t, side="right"))
    best = (t, failures, risk_bound(failures, n, delta))
    threshold, failures, bound = best
    kept = scores <= threshold
    risk = float(wrong[kept].mean()) if kept.any() else math.nan
    guarantee = {
        "kind": (
            "conformal back-off per sentence (Mohri & Hashimoto 2024), Clopper-Pearson bound "
            "with fixed-sequence testing (Learn then Test)"
        ),
        "granularity": "sentence",
        "alpha": alpha,
        "delta": delta,
        "risk_bound": bound,
        "calibration_answers": n,
        "calibration_failures": failures,
        "statement": (
            f"with probability >= {1 - delta:g} over the calibration set, the share of "
            f"answers whose kept sentences include a wrong one is <= {alpha:g} (bound "
            f"{bound:.4f}); sentences without a label are not covered"
        ),
    }
    return Choice(threshold, f"backoff<={alpha:g}@delta={delta:g}", float(kept.mean()), risk,
                  guarantee=guarantee)  # fmt: skip
