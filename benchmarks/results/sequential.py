"""Sequential ESI in the benchmark: the stopping rule fitted on one half, measured on the other.

For a data set already run at full L (``run.py``'s L=10 pass), with each answer's
per-variant scores:

1. the decision threshold is the coverage-0.8 threshold of the full-L scores (the 80% lowest
   scores accepted);
2. the questions are split in two halves (even and odd positions); the stopping constant is
   fitted on each half (:func:`~esi_guard.calibration.thresholds.fit_stop_constant`) and
   used on the other, so no answer is decided by a rule fitted on it;
3. the guard then runs for real, side by side on the same questions, batch by batch: full
   L, and sequential with the other half's constant, both timed (each batch's results are
   cached, so the runs resume); the row reports the sequential guard's
   AUROC, ``variants_used_mean``, ``decision_agreement`` (its accept/flag decisions against
   the full-L guard's at the same threshold) and its seconds, whole and beyond the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.cache import Cache
from benchmarks.common import Answering, Clock
from esi_guard import ESIGuard, ESIResult, Intervention
from esi_guard.backends import Backend
from esi_guard.calibration.metrics import auroc, bootstrap, paired_difference
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
    indices: list[int],
    name: str,
    intervention: Intervention,
    cache: Cache,
    shard: tuple[int, int],
    generate_seconds: float,
    answering: Answering,
    batch: int,
    max_disagreement: float,
) -> dict[str, Any] | None:
    """The ``<name> sequential`` record (and its full-L twin's timing) on one data set.

    The guarded runs are cached per question (``cache``, its header extended with the
    threshold and the constants, so another plan never reuses them) and split over
    processes by batch (``shard``); None while another shard has batches left.
    """
    full = np.array([np.mean(r) for r in variant_scores])
    threshold = float(np.quantile(full, COVERAGE))
    halves = [list(range(0, len(full), 2)), list(range(1, len(full), 2))]
    rules = [
        _fit([variant_scores[i] for i in half], threshold, max_disagreement) for half in halves
    ]
    constants = [r and r.constant for r in rules]
    cache = Cache(cache.directory, cache.name, cache.header | {
        "threshold": threshold, "constants": constants, "min_variants": MIN_VARIANTS,
        "n": len(full)})  # fmt: skip
    settings = {"backend": backend, "threshold": threshold, "intervention": intervention,
                "n_variants": len(variant_scores[0]), "seed": 0,
                "max_new_tokens": answering.max_new_tokens,
                "stop": list(answering.stop) or None}  # fmt: skip
    full_guard = ESIGuard(**settings)
    chunks = [
        (half[start : start + batch], rule)
        for half, rule in zip(halves, reversed(rules), strict=True)  # the OTHER half's rule
        if rule is not None
        for start in range(0, len(half), batch)
    ]
    done = cache.done()
    k, n = shard
    for number, (chunk, rule) in enumerate(chunks):
        if number % n != k or all(indices[i] in done for i in chunk):
            continue
        guard = ESIGuard(**settings, min_variants=MIN_VARIANTS, stop_constant=rule.constant)
        clock = Clock()
        with clock.stage("full"):
            whole = full_guard.assess([messages[i] for i in chunk])
        with clock.stage("sequential"):
            early = guard.assess([messages[i] for i in chunk])
        cache.add(shard, [
            {"index": indices[i], "full": _kept(_result(f)), "sequential": _kept(_result(e)),
             "seconds": {stage: s / len(chunk) for stage, s in clock.seconds.items()}}
            for i, f, e in zip(chunk, whole, early, strict=True)
        ])  # fmt: skip
        print(f"  {name} sequential: batch {number + 1}/{len(chunks)}", flush=True)
    done = cache.done()
    if any(indices[i] not in done for chunk, _ in chunks for i in chunk):
        return None
    record: dict[str, Any] = {
        "method": f"{name} sequential",
        "note": f"min_variants={MIN_VARIANTS}, constants {constants} "
        f"fitted on the other half (max_disagreement={max_disagreement}, delta=0.1; "
        f"disagreement on the fitting half {[r and round(r.disagreement, 3) for r in rules]}, "
        f"its 90% upper bound {[r and round(r.bound, 3) for r in rules]}); "
        f"threshold: coverage {COVERAGE} of the full-L score",
    }
    position = {index: i for i, index in enumerate(indices)}
    ran = [done[indices[i]] for chunk, _ in chunks for i in chunk]
    scored = [r for r in ran if r["sequential"]["scored"] and r["full"]["scored"]]
    if not scored:
        return record | {"auroc": None, "n": 0}
    n_scored = len(scored)
    seconds = sum(r["seconds"]["sequential"] for r in ran) / n_scored
    full_seconds = sum(r["seconds"]["full"] for r in ran) / n_scored
    labels = [wrong[position[r["index"]]] for r in scored]
    values = [r["sequential"]["score"] for r in scored]
    agree = [r["sequential"]["decision"] == r["full"]["decision"] for r in scored]
    estimate = bootstrap(auroc, values, labels, n_resamples=2000)
    full_values = [r["full"]["score"] for r in scored]
    versus = paired_difference(auroc, values, full_values, labels, n_resamples=2000)
    return record | {
        "auroc": estimate.value,
        "auroc_low": estimate.low,
        "auroc_high": estimate.high,
        "n": n_scored,
        "seconds_per_example": seconds,
        "extra_seconds_per_example": seconds - generate_seconds,
        "full_guard_seconds_per_example": full_seconds,
        "sequential_over_full_guard": seconds / full_seconds,
        "variants_used_mean": float(np.mean([r["sequential"]["variants_used"] for r in scored])),
        "decision_agreement": float(np.mean(agree)),
        "auroc_minus_full": versus.value,  # the same questions, a paired interval
        "auroc_minus_full_low": versus.low,
        "auroc_minus_full_high": versus.high,
    }


def _result(outcome: ESIResult | Exception) -> dict[str, Any]:
    """A result as its metadata dict; a failure is the run's (a benchmark stops on it)."""
    if isinstance(outcome, Exception):
        raise outcome
    return outcome.as_dict()


def _kept(esi: dict[str, Any]) -> dict[str, Any]:
    """What the row needs of a result's metadata (JSON-ready)."""
    return {key: esi.get(key) for key in ("scored", "score", "decision", "variants_used")}
