"""How well a score separates wrong answers from right ones, with bootstrap intervals.

``scores`` are uncertainty scores (higher = less trusted, as ESI); ``wrong`` is 1 for a wrong
answer. Selective prediction at coverage ``c`` keeps the ``ceil(c * n)`` lowest scores (ties in
input order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "COVERAGES",
    "Estimate",
    "aurc",
    "auroc",
    "bootstrap",
    "expected_calibration_error",
    "paired_difference",
    "prr",
    "risk_coverage",
    "selective_accuracy",
    "summarise",
    "undefined_because",
]

COVERAGES = (0.9, 0.8, 0.7)
"""Coverages at which selective accuracy is reported."""

Metric = Callable[[NDArray[np.float64], NDArray[np.int_]], float]


def _arrays(scores: ArrayLike, wrong: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.int_]]:
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(wrong).astype(np.int_)
    if s.ndim != 1 or s.shape != w.shape or s.size == 0:
        msg = f"need two non-empty 1-D arrays of the same length, got {s.shape} and {w.shape}"
        raise ValueError(msg)
    if not np.isfinite(s).all():
        msg = "scores hold NaN or infinite values"
        raise ValueError(msg)
    return s, w


def auroc(scores: ArrayLike, wrong: ArrayLike) -> float:
    """Area under the ROC curve for detecting wrong answers by their score (NaN: one class).

    Mann-Whitney (a tie counts half): ``roc_auc_score`` without its input checks, for bootstraps.
    """
    from scipy.stats import rankdata

    s, w = _arrays(scores, wrong)
    positives = int(w.sum())
    negatives = w.size - positives
    if positives == 0 or negatives == 0:
        return math.nan  # undefined with one class
    ranks = rankdata(s)  # ties get their mean rank
    u = float(ranks[w == 1].sum()) - positives * (positives + 1) / 2
    return u / (positives * negatives)


def undefined_because(wrong: ArrayLike) -> str | None:
    """Why AUROC and PRR are NaN on these labels (one class only), or None; commands print it."""
    w = np.asarray(wrong).astype(np.int_)
    if w.size == 0:
        return "no labelled answer"
    if not w.any():
        return "no wrong answer"
    if w.all():
        return "no right answer"
    return None


def risk_coverage(scores: ArrayLike, wrong: ArrayLike) -> tuple[NDArray[np.float64], ...]:
    """Coverage ``i/n`` and selective risk of the ``i`` lowest-scored answers, i = 1..n."""
    s, w = _arrays(scores, wrong)
    order = np.argsort(s, kind="stable")
    errors = np.cumsum(w[order])
    kept = np.arange(1, s.size + 1)
    return kept / s.size, errors / kept


def aurc(scores: ArrayLike, wrong: ArrayLike) -> float:
    """Area under the risk-coverage curve: mean selective risk over coverages 1/n..1."""
    _, risk = risk_coverage(scores, wrong)
    return float(risk.mean())


def prr(scores: ArrayLike, wrong: ArrayLike) -> float:
    """Prediction rejection ratio: the share of the oracle's AURC gain over random.

    ``(AURC_random - AURC) / (AURC_random - AURC_oracle)``: 1 is perfect, 0 random.
    """
    s, w = _arrays(scores, wrong)
    random = float(w.mean())
    oracle = aurc(w.astype(np.float64), w)
    if random - oracle <= 0:
        return math.nan  # no wrong answers (or all wrong): nothing to reject
    return (random - aurc(s, w)) / (random - oracle)


def selective_accuracy(scores: ArrayLike, wrong: ArrayLike, coverage: float) -> float:
    """Accuracy of the ``ceil(coverage * n)`` lowest-scored answers."""
    if not 0 < coverage <= 1:
        msg = f"coverage must be in (0, 1], got {coverage}"
        raise ValueError(msg)
    s, w = _arrays(scores, wrong)
    keep = max(1, math.ceil(coverage * s.size - 1e-9))
    order = np.argsort(s, kind="stable")[:keep]
    return float(1.0 - w[order].mean())


@dataclass(frozen=True)
class Estimate:
    """A metric's value and its bootstrap confidence interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def expected_calibration_error(p_wrong: ArrayLike, wrong: ArrayLike, bins: int = 10) -> float:
    """Expected calibration error of ``p_wrong`` over ``bins`` equal-width bins (share-weighted)."""
    p, y = _arrays(p_wrong, wrong)
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.mean() * abs(float(p[inside].mean()) - float(y[inside].mean()))
    return total


def bootstrap(
    metric: Metric,
    scores: ArrayLike,
    wrong: ArrayLike,
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    groups: ArrayLike | None = None,
    clusters: ArrayLike | None = None,
) -> Estimate:
    """The metric on the data, and a percentile bootstrap interval (resampling examples).

    NaN resamples are skipped. ``groups`` (e.g. cross-fit folds): the metric is taken and
    resampled within each group and averaged, never ranking one model's scores against another's.
    ``clusters`` (e.g. one answer's sentences): each resample draws whole clusters.
    """
    s, w = _arrays(scores, wrong)
    statistic = lambda picks: _mean_over(metric, s, w, picks)  # noqa: E731
    parts, members = _units(groups, clusters, s.size)
    return _resampled(statistic, parts, n_resamples=n_resamples, level=level, seed=seed,
                      members=members, whole=_parts(groups, s.size))  # fmt: skip


def paired_difference(
    metric: Metric,
    first: ArrayLike,
    second: ArrayLike,
    wrong: ArrayLike,
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    groups: ArrayLike | None = None,
    clusters: ArrayLike | None = None,
) -> Estimate:
    """``metric(first) - metric(second)``, paired interval as :func:`bootstrap`; 0 inside: a tie."""
    a, w = _arrays(first, wrong)
    b, _ = _arrays(second, wrong)
    statistic = lambda picks: _mean_over(metric, a, w, picks) - _mean_over(metric, b, w, picks)  # noqa: E731
    parts, members = _units(groups, clusters, a.size)
    return _resampled(statistic, parts, n_resamples=n_resamples, level=level, seed=seed,
                      members=members, whole=_parts(groups, a.size))  # fmt: skip


def _parts(groups: ArrayLike | None, size: int) -> list[NDArray[np.int_]]:
    """The example indices of each group (one group of all without ``groups``)."""
    if groups is None:
        return [np.arange(size)]
    labels = np.asarray(groups)
    if labels.shape != (size,):
        msg = f"groups needs one label per example ({size}), got shape {labels.shape}"
        raise ValueError(msg)
    return [np.flatnonzero(labels == label) for label in np.unique(labels)]


def _units(
    groups: ArrayLike | None, clusters: ArrayLike | None, size: int
) -> tuple[list[NDArray[np.int_]], list[NDArray[np.int_]] | None]:
    """What a resample draws per group (examples or cluster ids), each cluster's members or None."""
    parts = _parts(groups, size)
    if clusters is None:
        return parts, None
    labels = np.asarray(clusters)
    if labels.shape != (size,):
        msg = f"clusters needs one label per example ({size}), got shape {labels.shape}"
        raise ValueError(msg)
    _, cluster_of = np.unique(labels, return_inverse=True)
    cluster_of = cluster_of.reshape(-1)
    members = [np.flatnonzero(cluster_of == c) for c in range(int(cluster_of.max()) + 1)]
    units = [np.unique(cluster_of[part]) for part in parts]
    if sum(u.size for u in units) != len(members):
        msg = "a cluster's examples must all lie in one group"
        raise ValueError(msg)
    return units, members


def _mean_over(
    metric: Metric,
    scores: NDArray[np.float64],
    wrong: NDArray[np.int_],
    picks: list[NDArray[np.int_]],
) -> float:
    """The metric within each pick of examples, averaged (NaN if any is undefined)."""
    return float(np.mean([metric(scores[pick], wrong[pick]) for pick in picks]))


def _resampled(
    statistic: Callable[[list[NDArray[np.int_]]], float],
    parts: list[NDArray[np.int_]],
    *,
    n_resamples: int,
    level: float,
    seed: int,
    members: list[NDArray[np.int_]] | None = None,
    whole: list[NDArray[np.int_]] | None = None,
) -> Estimate:
    """``statistic`` of all examples, with a percentile interval resampling each part in itself."""

    def examples(picks: list[NDArray[np.int_]]) -> list[NDArray[np.int_]]:
        if members is None:
            return picks
        return [np.concatenate([members[int(c)] for c in pick]) for pick in picks]

    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_resamples):
        value = statistic(examples([part[rng.integers(0, part.size, part.size)]
                                    for part in parts]))  # fmt: skip
        if not math.isnan(value):
            values.append(value)
    point = statistic(parts if whole is None else whole)
    if not values:
        return Estimate(point, math.nan, math.nan)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Estimate(point, float(low), float(high))


def _at_coverage(scores: NDArray[np.float64], wrong: NDArray[np.int_], *, coverage: float) -> float:
    return selective_accuracy(scores, wrong, coverage)


def summarise(
    scores: Sequence[float] | ArrayLike,
    wrong: Sequence[int] | ArrayLike,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    clusters: Sequence[int] | ArrayLike | None = None,
) -> dict[str, Estimate]:
    """Every reported metric and its 95% interval, by name (``clusters``: see :func:`bootstrap`)."""
    metrics: dict[str, Metric] = {"auroc": auroc, "aurc": aurc, "prr": prr}
    for coverage in COVERAGES:
        metrics[f"selective_accuracy@{coverage:.0%}"] = partial(_at_coverage, coverage=coverage)
    return {
        name: bootstrap(
            metric, scores, wrong, n_resamples=n_resamples, seed=seed, clusters=clusters
        )
        for name, metric in metrics.items()
    }
