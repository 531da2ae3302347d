"""How well a score separates wrong answers from right ones, with bootstrap intervals.

AUROC, AURC, PRR and selective accuracy at fixed coverages.

Conventions: ``scores`` are uncertainty scores (higher = less trusted, as ESI);
``wrong`` is 1 where the answer was wrong. Selective prediction keeps the answers with
the lowest scores; at coverage ``c`` it keeps the ``ceil(c * n)`` lowest (ties broken by
input order, stable).
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
    """Area under the ROC curve for detecting wrong answers by their score.

    The Mann-Whitney form (a tie counts one half), equal to scikit-learn's
    ``roc_auc_score`` and without its input checks: a bootstrap calls it thousands of
    times.
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
    """Why AUROC and PRR are undefined on these labels, or None where they are defined.

    Both compare the wrong answers with the right ones: with one kind only there is
    nothing to compare, and :func:`auroc` and :func:`prr` return NaN. Commands print the
    reason instead of the NaN.
    """
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
    """Expected calibration error of predicted probabilities that answers are wrong.

    Over ``bins`` equal-width bins of ``p_wrong``: the share-weighted mean of |mean
    predicted - observed rate of wrong answers|.
    """
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

    Resamples where the metric is undefined (NaN, e.g. one class only) are skipped.
    ``groups`` (one label per example) is for scores made by different fitted models, as
    cross-fitting makes them: the metric is taken within each group and averaged, and
    each resample draws within each group. Pooling the groups would rank one model's
    outputs against another's, which no deployed model does.
    ``clusters`` (one label per example) is for examples that are not independent draws,
    as the sentences of one answer are not: each resample draws whole clusters with
    replacement (within each group), all of a cluster's examples together.
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
    """``metric(first) - metric(second)`` on the same examples, with a paired interval.

    A percentile bootstrap in which each resample picks the same examples for both scores
    (within each of ``groups``, whole ``clusters`` at a time, as :func:`bootstrap`).

    An interval that excludes 0 says one score is better on these data; one that holds
    0 is a tie.
    """
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
    """What a resample draws, per group: examples, or with ``clusters`` the clusters' ids.

    The second value: each cluster's example indices (None without ``clusters``).
    """
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
    """``statistic`` of all the examples, with a percentile interval.

    The interval is over resamples of the example indices, each part resampled within
    itself; undefined (NaN) ones are skipped. With ``members`` the parts hold cluster
    ids, each drawn with all its examples (``members[id]``). ``whole``: the examples of
    each part in their order, for the value on the data (default: ``parts``).
    """

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
    """Every reported metric with its 95% bootstrap interval, by name.

    ``clusters``: one label per example where examples come in groups that are not
    independent draws (the sentences of one answer): the bootstrap then draws whole
    clusters (:func:`bootstrap`).
    """
    metrics: dict[str, Metric] = {"auroc": auroc, "aurc": aurc, "prr": prr}
    for coverage in COVERAGES:
        metrics[f"selective_accuracy@{coverage:.0%}"] = partial(_at_coverage, coverage=coverage)
    return {
        name: bootstrap(
            metric, scores, wrong, n_resamples=n_resamples, seed=seed, clusters=clusters
        )
        for name, metric in metrics.items()
    }
