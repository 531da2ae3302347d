"""Sequential ESI in the benchmark: the stopping rule fitted on one half, measured on the other.

For a data set already run at full L (``run.py``'s L=10 pass), with each answer's
per-variant scores:

1. the decision threshold is the coverage-0.8 threshold of the full-L scores (the 80% lowest
   scores accepted);
2. the questions are split in two halves (even and odd positions); the stopping constant is
   fitted on each half (:func:`~esi_guard.calibration.thresholds.fit_stop_constant`) and
   used on the other, so no answer is decided by a rule fitted on it;
3. the guard then runs for real, side by side on the same questions: full L, and sequential
   with the other half's constant, both timed; the row reports the sequential guard's
   AUROC, ``variants_used_mean``, ``decision_agreement`` (its accept/flag decisions against
   the full-L guard's at the same threshold) and its seconds, whole and beyond the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from esi_guard import ESIGuard, Intervention
from esi_guard.backends import Backend
from esi_guard.calibration.metrics import auroc, bootstrap
from esi_guard.calibration.thresholds import StopRule, fit_stop_constant

__all__ = ["MIN_VARIANTS", "sequential_row"]

MIN_VARIANTS = 2
COVERAGE = 0.8


def _fit(rows: Sequence[Sequence[float]], threshold: float, most: float) -> StopRule | None:
    return fit_stop_constant(rows, threshold, min_variants=MIN_VARIANTS, max_disagreement=most,
                             delta=0.1)  # fmt: skip


def sequential_row(
    backend: Backend,
    messages: list[Any],
    variant_scores: list[list[float]],
    wrong: list[int],
    *,
    name: str,
    intervention: Intervention,
    clock: Any,
    generate_seconds: float,
    max_new_tokens: int,
    batch: int,
    max_disagreement: float,
) -> dict[str, Any]:
    """The ``<name> sequential`` record (and its full-L twin's timing) on one data set."""
    full = np.array([np.mean(r) for r in variant_scores])
    threshold = float(np.quantile(full, COVERAGE))
    halves = [list(range(0, len(full), 2)), list(range(1, len(full), 2))]
    rules = [
        _fit([variant_scores[i] for i in half], threshold, max_disagreement) for half in halves
    ]
    settings = {"backend": backend, "threshold": threshold, "intervention": intervention,
                "n_variants": len(variant_scores[0]), "max_new_tokens": max_new_tokens,
                "seed": 0}  # fmt: skip
    full_guard = ESIGuard(**settings)
    results: dict[int, dict[str, Any]] = {}
    full_results: dict[int, dict[str, Any]] = {}
    for half, rule in zip(halves, reversed(rules), strict=True):  # the OTHER half's rule
        if rule is None:
            continue
        guard = ESIGuard(**settings, min_variants=MIN_VARIANTS, stop_constant=rule.constant)
        for start in range(0, len(half), batch):
            chunk = half[start : start + batch]
            with clock.stage(f"{name} guarded full"):
                done = full_guard.batch([messages[i] for i in chunk])
            full_results |= {
                i: m.response_metadata["esi"] for i, m in zip(chunk, done, strict=True)
            }
            with clock.stage(f"{name} guarded sequential"):
                done = guard.batch([messages[i] for i in chunk])
            results |= {i: m.response_metadata["esi"] for i, m in zip(chunk, done, strict=True)}
    record: dict[str, Any] = {
        "method": f"{name} sequential",
        "note": f"min_variants={MIN_VARIANTS}, constants {[r and r.constant for r in rules]} "
        f"fitted on the other half (max_disagreement={max_disagreement}, delta=0.1); "
        f"threshold: coverage {COVERAGE} of the full-L score",
    }
    scored = [i for i in sorted(results) if results[i]["scored"] and full_results[i]["scored"]]
    if not scored:
        return record | {"auroc": None, "n": 0}
    n = len(scored)
    seconds = clock.seconds[f"{name} guarded sequential"] / n
    full_seconds = clock.seconds[f"{name} guarded full"] / n
    labels = [wrong[i] for i in scored]
    values = [results[i]["score"] for i in scored]
    agree = [results[i]["decision"] == full_results[i]["decision"] for i in scored]
    estimate = bootstrap(auroc, values, labels, n_resamples=2000)
    return record | {
        "auroc": estimate.value,
        "auroc_low": estimate.low,
        "auroc_high": estimate.high,
        "n": n,
        "seconds_per_example": seconds,
        "extra_seconds_per_example": seconds - generate_seconds,
        "full_guard_seconds_per_example": full_seconds,
        "sequential_over_full_guard": seconds / full_seconds,
        "variants_used_mean": float(np.mean([results[i]["variants_used"] for i in scored])),
        "decision_agreement": float(np.mean(agree)),
    }
