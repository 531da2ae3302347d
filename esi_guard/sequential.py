"""Sequential ESI: score variants in rounds and stop once the decision is settled.

ESI is a mean over variants, ``score = mean_l e_l`` with ``e_l`` the l-th variant's own
score. A guard needs the accept/flag decision, not the score's last decimal: after
``k`` variants the partial mean ``m_k`` estimates the full mean with a standard error
of about ``s_k / sqrt(k)`` (``s_k`` the spread of the ``k`` variant scores), so the
decision is taken as settled when

    |m_k - threshold| > constant * s_k / sqrt(k)

Rounds double the variants: ``min_variants``, ``2 * min_variants``, ... up to
``n_variants``, the last round always deciding. ``constant`` is not guessed: ``esi-guard
calibrate --min-variants`` fits it on the calibration run's variant scores so that the
early decisions differ from the full-L ones for at most a stated fraction of answers,
with an upper confidence bound (:func:`~esi_guard.calibration.thresholds.fit_stop_constant`).
Everything here is pure, so the guard and the calibration apply the same rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["schedule", "settled", "variants_used"]


def schedule(min_variants: int, n_variants: int) -> list[int]:
    """How many variants each round has scored by its end: doubling, ending at ``n_variants``."""
    sizes, k = [], max(min_variants, 1)
    while k < n_variants:
        sizes.append(k)
        k *= 2
    return [*sizes, n_variants]


def settled(variant_scores: Sequence[float], threshold: float, constant: float) -> bool:
    """True when the partial mean is far enough from the threshold (see the module)."""
    k = len(variant_scores)
    if k < 2:
        return False
    mean = math.fsum(variant_scores) / k
    spread = statistics.stdev(variant_scores)
    return abs(mean - threshold) > constant * spread / math.sqrt(k)


def variants_used(
    variant_scores: Sequence[float], threshold: float, constant: float, min_variants: int
) -> int:
    """How many of the (full-L) variant scores the sequential rule would have used."""
    sizes = schedule(min_variants, len(variant_scores))
    for k in sizes[:-1]:
        if settled(variant_scores[:k], threshold, constant):
            return k
    return sizes[-1]
