"""The hidden-state probe's search, shared by the combined score's fit and the ESI probe's.

A probe reads one layer's states at some positions, standardised and reduced by PCA,
beside the standardised free signals. Which layer, which positions (:data:`POSITION_SETS`),
how many components (:data:`COMPONENTS`) and the regularisation strength are chosen by
cross-validation on the fitting answers (:func:`search_states`); the chosen candidate is
refitted on all of them and folded into one weight vector over the raw states
(:class:`~esi_guard.combined.HiddenProbe`). The model and its held-out error are the
caller's: a monotone logistic regression and its log-loss for
:func:`~esi_guard.calibration.combined_fit.fit_combined`, a ridge regression and its
squared error for :func:`~esi_guard.calibration.cascade_fit.fit_esi_probe`.

Pure: numpy, no model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from esi_guard.backends.hidden import HiddenStates, Position
from esi_guard.combined import HiddenProbe
from esi_guard.exceptions import ConfigurationError

__all__ = ["COMPONENTS", "POSITION_SETS", "Reduced", "StateFit", "search_states", "standard"]

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

    def __call__(self, states: np.ndarray, components: int) -> np.ndarray:
        """The states' first ``components`` principal components."""
        z = (states - self.mean) / self.scale - self.center
        return np.asarray(z @ self.basis[:components].T)


def _principal_axes(centred: np.ndarray, components: int) -> np.ndarray:
    """The ``components`` leading principal axes (rows) of centred data.

    From the eigenvectors of the smaller of its two Gram matrices, not a full SVD: a
    probe's fit has a few hundred answers and a few thousand state columns, and needs
    only the leading 8-32 axes, thousands of times over.
    """
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

    ``x``: the standardised signals; ``fit`` the model; ``error(y, z)`` each held-out
    answer's error at the prediction ``z``; ``score`` a candidate's out-of-fold errors
    made one number, the smallest of which is chosen (the first on a tie).
    """
    layers, positions = hidden[0].layers, hidden[0].positions
    if any(h.layers != layers or h.positions != positions for h in hidden):
        msg = "every answer's hidden states must have the same layers and positions"
        raise ConfigurationError(msg)
    values = np.stack([np.asarray(h.values, dtype=np.float64) for h in hidden])
    smallest = min(len(train) for train, _ in splits)
    sizes = sorted({min(k, max(1, smallest // 8)) for k in COMPONENTS})
    free = x.shape[1]
    residuals: dict[tuple[int, tuple[Position, ...], int, float], np.ndarray] = {}
    for li, layer in enumerate(layers):
        for chosen in POSITION_SETS:
            if not set(chosen) <= set(positions):
                continue
            pi = [positions.index(p) for p in chosen]
            states = values[:, li, pi, :].reshape(len(y), -1)
            out = {(k, c): np.empty_like(y) for k in sizes for c in strengths}
            xas, yas, xbs = [], [], []
            asked: list[tuple[int, int, float]] = []
            problems: list[tuple[int, int, float]] = []
            for fold, (train, test) in enumerate(splits):
                # The PCA sizes' components are the first of the largest's (as many as the
                # states give).
                reduce = Reduced(states[train], max(sizes))
                xas.append(np.hstack([x[train], reduce(states[train], max(sizes))]))
                xbs.append(np.hstack([x[test], reduce(states[test], max(sizes))]))
                yas.append(y[train])
                for k in sizes:
                    for c in strengths:
                        asked.append((fold, k, c))
                        problems.append((fold, min(free + k, xas[-1].shape[1]), c))
            fits = fit(xas, yas, problems)
            for (fold, k, c), (_, width, _), (w, b) in zip(asked, problems, fits, strict=True):
                test = splits[fold][1]
                out[k, c][test] = error(y[test], xbs[fold][:, :width] @ w + b)
            for (k, c), r in out.items():
                residuals[layer, chosen, k, c] = r
    scores = {key: score(r) for key, r in residuals.items()}
    best = min(scores, key=scores.__getitem__)
    layer, chosen, k, strength = best
    li, pi = layers.index(layer), [positions.index(p) for p in chosen]
    states = values[:, li, pi, :].reshape(len(y), -1)
    reduce = Reduced(states, k)
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
