"""The hidden-state probe's search, shared by the combined score's fit and the ESI probe's.

A probe reads one layer's states at some positions, standardised and PCA-reduced, beside the
free signals. Its settings are chosen by cross-validation with the caller's model and error
(:func:`search_states`), then folded into weights on the raw states
(:class:`~esi_guard.combined.HiddenProbe`). Pure: numpy.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import numpy as np

from esi_guard.backends.hidden import HiddenStates, Position
from esi_guard.combined import HiddenProbe
from esi_guard.exceptions import ConfigurationError

__all__ = [
    "COMPONENTS",
    "KEPT_BYTES",
    "POSITION_SETS",
    "Reduced",
    "StateFit",
    "reductions_kept",
    "search_states",
    "standard",
]

POSITION_SETS: tuple[tuple[Position, ...], ...] = (
    ("prompt_last",),
    ("answer_mean",),
    ("prompt_last", "answer_mean"),
    ("answer_last",),
)
"""The positions a probe may read, tried by cross-validation."""

COMPONENTS = (8, 16, 32)
"""PCA sizes cross-validation chooses from (capped by the answers at hand)."""

Splits = list[tuple[np.ndarray, np.ndarray]]
Fit = Callable[
    [Sequence[np.ndarray], Sequence[np.ndarray], Sequence[tuple[int, int, float]]],
    list[tuple[np.ndarray, float]],
]
"""``(xs, ys, [(which, width, strength)]) -> [(weights, intercept)]``: the model fitted on
the first ``width`` columns of ``xs[which]`` (labels ``ys[which]``) at ``strength``, for each
in order (one call per candidate: its every fold, PCA size and strength, for a fit that
solves them together)."""


def standard(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and standard deviations (1 where a column is constant)."""
    mean, scale = raw.mean(axis=0), raw.std(axis=0)
    return mean, np.where(scale > 1e-12 * (1.0 + np.abs(mean)), scale, 1.0)


class Reduced:
    """Standardise then PCA, fitted on some answers' states; applied to any."""

    def __init__(self, states: np.ndarray, components: int) -> None:
        self.mean, self.scale = standard(states)
        z = (states - self.mean) / self.scale
        self.center = z.mean(axis=0)
        self.basis = _principal_axes(z - self.center, components)
        self.projections: dict[
            tuple[int, ...], tuple[tuple[HiddenStates, ...], tuple[np.ndarray, np.ndarray]]
        ] = {}
        """Rows already projected, kept by :func:`_projected` (within :func:`reductions_kept`)."""

    @property
    def nbytes(self) -> int:
        """Its arrays' bytes (the projections kept with it, a few dozen columns, aside)."""
        return sum(a.nbytes for a in (self.mean, self.scale, self.center, self.basis))

    def __call__(self, states: np.ndarray, components: int) -> np.ndarray:
        """The states' first ``components`` principal components."""
        z = (states - self.mean) / self.scale - self.center
        return np.asarray(z @ self.basis[:components].T)


KEPT_BYTES = 1 << 30
"""The most bytes of PCA fits :func:`reductions_kept` holds (the least recently used go)."""


class _Kept:
    """PCA fits by the answers (and layer, positions, size) they were fitted on."""

    def __init__(self) -> None:
        self.fits: OrderedDict[tuple[object, ...], tuple[tuple[HiddenStates, ...], Reduced]] = (
            OrderedDict()
        )
        self.bytes = 0

    def get(self, key: tuple[object, ...], answers: tuple[HiddenStates, ...]) -> Reduced | None:
        found = self.fits.get(key)
        if found is None or any(a is not b for a, b in zip(found[0], answers, strict=True)):
            return None
        self.fits.move_to_end(key)
        return found[1]

    def put(self, key: tuple[object, ...], answers: tuple[HiddenStates, ...], fit: Reduced) -> None:
        self.fits[key] = (answers, fit)
        self.bytes += fit.nbytes
        while self.bytes > KEPT_BYTES and len(self.fits) > 1:
            _, (_, old) = self.fits.popitem(last=False)
            self.bytes -= old.nbytes


_KEPT: ContextVar[_Kept | None] = ContextVar("reductions", default=None)


@contextmanager
def reductions_kept() -> Iterator[None]:
    """Within it, each search reuses the PCA fits of earlier searches on the same answers.

    A selection (:func:`~esi_guard.calibration.crossfit.select`) fits the same reductions for
    many candidates, its costliest step. Each is kept (up to :data:`KEPT_BYTES`, LRU) with its
    states, so one answer is never taken for another: the same numbers as refitting.
    """
    if _KEPT.get() is not None:  # within another: its fits are these
        yield
        return
    token = _KEPT.set(_Kept())
    try:
        yield
    finally:
        _KEPT.reset(token)


def _reduced(
    hidden: Sequence[HiddenStates], rows: np.ndarray, states: np.ndarray,
    where: tuple[object, ...], components: int,
) -> Reduced:  # fmt: skip
    """``Reduced(states[rows], components)``, or the same fit kept by :func:`reductions_kept`."""
    kept = _KEPT.get()
    if kept is None:
        return Reduced(states[rows], components)
    answers = tuple(hidden[i] for i in rows)
    key = (*where, components, *map(id, answers))
    found = kept.get(key, answers)
    if found is None:
        found = Reduced(states[rows], components)
        kept.put(key, answers, found)
    return found


def _projected(
    hidden: Sequence[HiddenStates], train: np.ndarray, test: np.ndarray, states: np.ndarray,
    where: tuple[object, ...], components: int,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The ``train`` and ``test`` rows' components by the reduction fitted on ``train`` (kept)."""
    reduce = _reduced(hidden, train, states, where, components)
    if _KEPT.get() is None:
        return reduce(states[train], components), reduce(states[test], components)
    held = tuple(hidden[i] for i in test)
    found = reduce.projections.get(tuple(map(id, held)))
    if found is not None and all(a is b for a, b in zip(found[0], held, strict=True)):
        return found[1]
    pair = (reduce(states[train], components), reduce(states[test], components))
    reduce.projections[tuple(map(id, held))] = (held, pair)
    return pair


def _principal_axes(centred: np.ndarray, components: int) -> np.ndarray:
    """The ``components`` leading principal axes (rows) of centred data, via the smaller Gram."""
    n, d = centred.shape
    if n >= d:
        values, vectors = np.linalg.eigh(centred.T @ centred)
        order = np.argsort(values)[::-1][:components]
        return np.asarray(vectors[:, order].T)
    values, vectors = np.linalg.eigh(centred @ centred.T)
    order = np.argsort(values)[::-1][:components]
    singular = np.sqrt(np.maximum(values[order], 0.0))
    axes = (centred.T @ vectors[:, order]) / np.where(singular > 1e-12, singular, 1.0)
    return np.asarray(axes.T)


class StateFit(NamedTuple):
    """The chosen candidate refitted on every answer."""

    probe: HiddenProbe
    """The states' term, folded onto the raw states (``selection``: each candidate's best)."""
    weights: np.ndarray
    """The free signals' weights (as fitted: the caller bounds them if it must)."""
    intercept: float
    """With the states' standardising and PCA folded in."""
    strength: float
    errors: np.ndarray
    """The chosen candidate's out-of-fold values of ``error`` for every answer."""


def search_states(
    x: np.ndarray,
    y: np.ndarray,
    splits: Splits,
    hidden: list[HiddenStates],
    *,
    strengths: Sequence[float],
    fit: Fit,
    error: Callable[[np.ndarray, np.ndarray], np.ndarray],
    score: Callable[[np.ndarray], float],
) -> StateFit:
    """Candidates (layer, positions) x PCA size x strength by held-out error.

    ``x``: the standardised signals; ``fit``: the model; ``error(y, z)``: a held-out answer's error
    at prediction ``z``; ``score``: a candidate's errors as one number (least wins, first on ties).
    """
    layers, positions = hidden[0].layers, hidden[0].positions
    if any(h.layers != layers or h.positions != positions for h in hidden):
        msg = "every answer's hidden states must have the same layers and positions"
        raise ConfigurationError(msg)
    values = np.stack([np.asarray(h.values, dtype=np.float64) for h in hidden])
    smallest = min(len(train) for train, _ in splits)
    sizes = sorted({min(k, max(1, smallest // 8)) for k in COMPONENTS})
    free = x.shape[1]
    xas: list[np.ndarray] = []
    yas: list[np.ndarray] = []
    xbs: list[tuple[np.ndarray, np.ndarray]] = []  # each fit's held-out rows and their labels
    asked: list[tuple[int, tuple[Position, ...], int, float]] = []
    problems: list[tuple[int, int, float]] = []
    for li, layer in enumerate(layers):
        for chosen in POSITION_SETS:
            if not set(chosen) <= set(positions):
                continue
            pi = [positions.index(p) for p in chosen]
            states = values[:, li, pi, :].reshape(len(y), -1)
            for train, test in splits:
                # Each PCA size's components are the first of the largest's.
                fitted, held = _projected(hidden, train, test, states, (layer, chosen), max(sizes))
                xas.append(np.hstack([x[train], fitted]))
                xbs.append((np.hstack([x[test], held]), test))
                yas.append(y[train])
                for k in sizes:
                    for c in strengths:
                        asked.append((layer, chosen, k, c))
                        problems.append((len(xas) - 1, min(free + k, xas[-1].shape[1]), c))
    # Every candidate's every fold in one call: the fit's per-call overhead paid once.
    residuals = {key: np.empty_like(y) for key in asked}
    fits = fit(xas, yas, problems)
    for candidate, (which, width, _), (w, b) in zip(asked, problems, fits, strict=True):
        held, test = xbs[which]
        residuals[candidate][test] = error(y[test], held[:, :width] @ w + b)
    scores = {key: score(r) for key, r in residuals.items()}
    best = min(scores, key=scores.__getitem__)
    layer, chosen, k, strength = best
    li, pi = layers.index(layer), [positions.index(p) for p in chosen]
    states = values[:, li, pi, :].reshape(len(y), -1)
    reduce = _reduced(hidden, np.arange(len(y)), states, (layer, chosen), k)
    chosen_x = np.hstack([x, reduce(states, k)])
    ((w, b),) = fit([chosen_x], [y], [(0, chosen_x.shape[1], strength)])
    # Fold standardising, PCA and the components' weights into weights on the raw states.
    direction = reduce.basis[:k].T @ w[free:]
    weights = direction / reduce.scale
    intercept = b - float(np.dot(reduce.mean / reduce.scale + reduce.center, direction))
    selection: dict[str, float] = {}
    for (lay, pos, _, _), value in scores.items():
        key = f"{lay}/{'+'.join(pos)}"
        selection[key] = min(value, selection.get(key, math.inf))
    probe = HiddenProbe(layers=(layer,), positions=chosen, hidden_size=values.shape[-1],
                        weights=tuple(map(float, weights)), components=k,
                        selection=selection)  # fmt: skip
    return StateFit(probe, w[:free], intercept, strength, residuals[best])
