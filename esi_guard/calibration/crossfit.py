"""Cross-fitting a combined score on every labelled answer, and keeping only what pays.

``esi-guard calibrate --score combined`` (without ``--fit-fraction``): each candidate feature set
(:func:`candidates`) is fitted ``folds`` times, each without one stratified fold, which it then
scores, so every answer gets an out-of-fold ``p_wrong`` from a model that never saw it
(:func:`cross_fit`). The best by out-of-fold AUROC is kept, unless cheaper ones come within
``tolerance`` (then the best of the cheapest): a probe or ESI that does not pay is left out.

The kept fold models, averaged (:func:`~esi_guard.calibration.combined_fit.average`), are the
score and the threshold is chosen on their out-of-fold ``p_wrong``, so it holds its coverage on
new questions. The kept AUROC, best of several, is a little optimistic; ``nested`` reruns the
whole selection inside each fold for the figure to expect. A feature's contribution is the paired
out-of-fold AUROC difference with and without it (holding 0: a tie). AUROC is taken within each
fold and averaged (:func:`~esi_guard.calibration.metrics.bootstrap` with ``groups``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from esi_guard.backends.hidden import HiddenStates
from esi_guard.calibration.combined_fit import average, fit_combined
from esi_guard.calibration.metrics import Estimate, auroc, bootstrap, paired_difference
from esi_guard.calibration.probe_search import reductions_kept
from esi_guard.combined import HIDDEN, CombinedScore
from esi_guard.exceptions import ConfigurationError

__all__ = ["Candidate", "Selection", "candidates", "cross_fit", "select"]

TOLERANCE = 0.005
"""Out-of-fold AUROC a cheaper candidate may give up against the best one."""


@dataclass(frozen=True)
class Candidate:
    """A set of features a combined score may read."""

    features: tuple[str, ...]
    """Scalar signals, in the requested order."""
    hidden: bool = False
    """With the hidden-state probe."""

    @property
    def name(self) -> str:
        """``nll+entropy+hidden``."""
        return "+".join((*self.features, *((HIDDEN,) if self.hidden else ())))

    @property
    def cost(self) -> tuple[bool, bool]:
        """Sorts cheapest first: ESI (3-4x an answer), then the states; free signals cost 0."""
        return ("esi" in self.features, self.hidden)

    def without(self, name: str) -> Candidate:
        """This set less one feature."""
        if name == HIDDEN:
            return Candidate(self.features, hidden=False)
        return Candidate(tuple(f for f in self.features if f != name), self.hidden)

    def with_(self, name: str, order: Sequence[str]) -> Candidate:
        """This set plus one feature, signals in ``order``."""
        if name == HIDDEN:
            return Candidate(self.features, hidden=True)
        wanted = {*self.features, name}
        return Candidate(tuple(f for f in order if f in wanted), self.hidden)

    @property
    def parts(self) -> tuple[str, ...]:
        """Its features, the probe as ``hidden``."""
        return (*self.features, *((HIDDEN,) if self.hidden else ()))

    @property
    def empty(self) -> bool:
        """Reads nothing."""
        return not self.features and not self.hidden


def candidates(requested: Sequence[str]) -> list[Candidate]:
    """The feature sets a selection compares, cheapest first.

    Each requested signal alone, the probe alone, all the signals, all but ESI, each with the probe.
    """
    scalars = tuple(name for name in requested if name != HIDDEN)
    hidden = HIDDEN in requested
    found = [Candidate((name,)) for name in scalars]
    if hidden:
        found.append(Candidate((), hidden=True))
    sets = [scalars]
    if "esi" in scalars and len(scalars) > 1:
        sets.append(tuple(name for name in scalars if name != "esi"))
    for chosen in sets:
        if len(chosen) > 1:
            found.append(Candidate(chosen))
        if hidden and chosen:
            found.append(Candidate(chosen, hidden=True))
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda c: (c.cost, len(c.parts)))


def _splits(y: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedKFold

    return list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(y, y))


def cross_fit(
    signals: Sequence[Mapping[str, float]],
    y: np.ndarray,
    states: Sequence[HiddenStates] | None,
    candidate: Candidate,
    splits: list[tuple[np.ndarray, np.ndarray]],
    *,
    seed: int = 0,
) -> tuple[np.ndarray, list[CombinedScore]]:
    """Every answer's ``p_wrong`` from ``candidate`` fitted on the other folds; the fold models.

    Raises:
        ConfigurationError: A fold too small to fit on (too few answers of a class).
    """
    p = np.empty(len(y))
    models = []
    for train, test in splits:
        model = _fit(signals, y, states, candidate, train, seed)
        p[test] = [_p(model, signals[i], states, i) for i in test]
        models.append(model)
    return p, models


def _fit(
    signals: Sequence[Mapping[str, float]], y: np.ndarray, states: Sequence[HiddenStates] | None,
    candidate: Candidate, rows: np.ndarray, seed: int,
) -> CombinedScore:  # fmt: skip
    labels = y[rows]
    inner = int(min(5, labels.sum(), len(labels) - labels.sum()))
    if inner < 2:
        msg = f"{len(rows)} answers with {int(labels.sum())} wrong are too few to fit on"
        raise ConfigurationError(msg)
    hidden = None
    if candidate.hidden:
        assert states is not None  # select() checks
        hidden = [states[i] for i in rows]
    return fit_combined([signals[i] for i in rows], labels.astype(int).tolist(),
                        features=candidate.features, hidden=hidden, folds=inner,
                        seed=seed)  # fmt: skip


def _p(
    model: CombinedScore, signals: Mapping[str, float], states: Sequence[HiddenStates] | None,
    i: int,
) -> float:  # fmt: skip
    return model.p_wrong(signals, None if model.hidden is None or states is None else states[i])


@dataclass
class Selection:
    """What :func:`select` found: the kept score, its out-of-fold ``p_wrong``, the evidence."""

    chosen: Candidate
    model: CombinedScore
    """The kept candidate's fold models, averaged (:func:`average`)."""
    p_wrong: np.ndarray
    """Its out-of-fold ``p_wrong`` (what the threshold is chosen on)."""
    folds: np.ndarray
    """Each answer's fold (the ``groups`` of the cross-fitted AUROC)."""
    oof: dict[str, np.ndarray] = field(default_factory=dict)
    """Every fitted candidate's out-of-fold ``p_wrong``, by name."""
    members: dict[str, list[CombinedScore]] = field(default_factory=dict)
    """Every fitted candidate's fold models, by name."""
    nested: Estimate | None = None
    """The AUROC new questions should give: each fold scored by a selection made without it."""
    table: dict[str, Estimate] = field(default_factory=dict)
    """The candidates' out-of-fold AUROC (95% bootstrap), cheapest first."""
    contributions: dict[str, Estimate] = field(default_factory=dict)
    """Per feature: AUROC with it minus without it, paired, out of fold."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Candidates that could not be fitted, and why."""

    def report(self) -> dict[str, Any]:
        """As the threshold file's ``combined_report`` stores it."""
        return {
            "fit": "cross", "n_folds": int(self.folds.max() + 1), "chosen": self.chosen.name,
            "run_time": "fold_average",
            "candidates": {name: asdict(e) for name, e in self.table.items()},
            "contributions": {name: {**asdict(e), "verdict": verdict(e)}
                              for name, e in self.contributions.items()},
            "skipped": dict(self.skipped),
            **({"auroc_nested": asdict(self.nested)} if self.nested is not None else {}),
        }  # fmt: skip

    def fit_more(self, candidate: Candidate, fit: Any) -> np.ndarray:
        """``candidate``'s out-of-fold ``p_wrong``, cross-fitted now by ``fit`` if not yet."""
        if candidate.name not in self.oof:
            self.oof[candidate.name], self.members[candidate.name] = fit(candidate)
        return self.oof[candidate.name]

    def averaged(self, candidate: Candidate) -> CombinedScore:
        """``candidate``'s fold models (fitted by :meth:`fit_more`) as one score."""
        return average(self.members[candidate.name], n_fit=len(self.folds))


def verdict(difference: Estimate) -> str:
    """``gain``, ``loss`` or ``tie`` (the interval holds 0)."""
    if difference.low > 0:
        return "gain"
    if difference.high < 0:
        return "loss"
    return "tie"


def select(
    signals: Sequence[Mapping[str, float]],
    wrong: Sequence[int],
    *,
    requested: Sequence[str],
    states: Sequence[HiddenStates] | None = None,
    folds: int = 5,
    seed: int = 0,
    tolerance: float = TOLERANCE,
    resamples: int = 1000,
    explain: bool = True,
    nested: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Selection:
    """Cross-fit every candidate of ``requested``, keep the best (cheapest near it), fold-averaged.

    ``explain``: also each feature's contribution; ``nested``: also the AUROC with each fold out of
    its own selection (``folds`` more selections); ``progress``: told each step.

    Raises:
        ConfigurationError: ``hidden`` asked for without states, or too few answers of a class.
    """
    y = np.asarray(wrong, dtype=np.float64)
    counts = int(y.sum()), int(len(y) - y.sum())
    if min(counts) < max(folds, 4):
        msg = (
            f"cross-fitting a combined score on {folds} folds needs at least "
            f"{max(folds, 4)} wrong and {max(folds, 4)} right answers; got {counts[0]} wrong "
            f"and {counts[1]} right"
        )
        raise ConfigurationError(msg)
    if HIDDEN in requested and states is None:
        msg = "the hidden-state probe was asked for and the answers have no states"
        raise ConfigurationError(msg)
    with reductions_kept():
        return _select(signals, y, requested, states, folds, seed, tolerance, resamples,
                       explain, nested, progress)  # fmt: skip


def _select(
    signals: Sequence[Mapping[str, float]], y: np.ndarray, requested: Sequence[str],
    states: Sequence[HiddenStates] | None, folds: int, seed: int, tolerance: float,
    resamples: int, explain: bool, nested: bool, progress: Callable[[str], None] | None,
) -> Selection:  # fmt: skip
    say = progress or (lambda _: None)
    splits = _splits(y, folds, seed)
    fold_of = np.empty(len(y), dtype=np.int_)
    for k, (_, test) in enumerate(splits):
        fold_of[test] = k

    def fit(candidate: Candidate) -> tuple[np.ndarray, list[CombinedScore]]:
        return cross_fit(signals, y, states, candidate, splits, seed=seed)

    selection = Selection(Candidate(()), CombinedScore(mean=(), scale=(), weights=(),
                          intercept=0.0, strength=0.0, n_fit=0), y, fold_of)  # fmt: skip
    listed = candidates(requested)
    say(f"cross-fitting {len(listed)} candidate scores on {folds} folds"
        + (" (the hidden-state probe's search: the longest step)" if states else ""))  # fmt: skip
    for candidate in listed:
        try:
            selection.fit_more(candidate, fit)
        except ConfigurationError as exc:
            selection.skipped[candidate.name] = str(exc)
            continue
        selection.table[candidate.name] = bootstrap(
            auroc, selection.oof[candidate.name], y, groups=fold_of, n_resamples=resamples,
            seed=seed,
        )  # fmt: skip
    if not selection.table:
        msg = "no candidate combined score could be fitted: " + "; ".join(
            f"{name}: {why}" for name, why in selection.skipped.items()
        )
        raise ConfigurationError(msg)
    chosen = _keep([c for c in listed if c.name in selection.table], selection.table, tolerance)
    selection.chosen, selection.model = chosen, selection.averaged(chosen)
    selection.p_wrong = selection.oof[chosen.name]
    order = tuple(name for name in requested if name != HIDDEN)
    contributors = _contributors(chosen, requested) if explain else []
    if contributors:
        say(f"cross-fitting what {', '.join(contributors)} add{'s' * (len(contributors) == 1)}")
    for name in contributors:
        bigger = chosen.with_(name, order) if name not in chosen.parts else chosen
        smaller = bigger.without(name)
        if smaller.empty:
            continue
        try:
            a, b = selection.fit_more(bigger, fit), selection.fit_more(smaller, fit)
        except ConfigurationError:
            continue
        selection.contributions[name] = paired_difference(
            auroc, a, b, y, groups=fold_of, n_resamples=resamples, seed=seed
        )
    if nested:
        selection.nested = _nested(signals, y, states, requested, splits, fold_of, seed=seed,
                                   tolerance=tolerance, resamples=resamples, say=say)  # fmt: skip
    return selection


def _keep(fitted: list[Candidate], table: Mapping[str, Estimate], tolerance: float) -> Candidate:
    """The best candidate by out-of-fold AUROC, or the best of the cheapest within ``tolerance``."""
    best = max(table[c.name].value for c in fitted)
    near = [c for c in fitted if table[c.name].value >= best - tolerance]
    cheapest = min(c.cost for c in near)
    return max((c for c in near if c.cost == cheapest),
               key=lambda c: (table[c.name].value, -len(c.parts)))  # fmt: skip


def _nested(
    signals: Sequence[Mapping[str, float]], y: np.ndarray,
    states: Sequence[HiddenStates] | None, requested: Sequence[str],
    splits: list[tuple[np.ndarray, np.ndarray]], fold_of: np.ndarray, *, seed: int,
    tolerance: float, resamples: int, say: Callable[[str], None],
) -> Estimate | None:  # fmt: skip
    """The selection's AUROC on each fold when the fold took no part in it (None: too few)."""
    p = np.empty(len(y))
    for k, (train, test) in enumerate(splits):
        say(f"nested estimate: the selection again without fold {k + 1} of {len(splits)}")
        try:
            inner = select([signals[i] for i in train], y[train].astype(int).tolist(),
                           requested=requested, folds=len(splits), seed=seed,
                           states=None if states is None else [states[i] for i in train],
                           tolerance=tolerance, resamples=1, explain=False)  # fmt: skip
        except ConfigurationError:
            return None
        p[test] = [_p(inner.model, signals[i], states, i) for i in test]
    return bootstrap(auroc, p, y, groups=fold_of, n_resamples=resamples, seed=seed)


def _contributors(chosen: Candidate, requested: Sequence[str]) -> list[str]:
    """The features whose contribution is reported: the kept set's, and ESI's if asked for."""
    names = list(chosen.parts) if len(chosen.parts) > 1 else []
    if "esi" in requested and "esi" not in chosen.parts:
        names.insert(0, "esi")
    return names
