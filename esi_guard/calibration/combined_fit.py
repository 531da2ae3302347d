"""Fitting a :class:`~esi_guard.combined.CombinedScore` on answers' signals and labels.

A logistic model with weights >= 0 on standardised signals (``p_wrong`` never falls as a signal
rises), its L2 strength and any probe's settings chosen by stratified cross-validation, the probe
components' weights free. The score at run time is :mod:`esi_guard.combined`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from esi_guard.backends.hidden import POSITIONS, HiddenStates
from esi_guard.calibration.probe_search import search_states, standard
from esi_guard.combined import FEATURES, HIDDEN, SIGNALS, CombinedScore, HiddenProbe, _sigmoid
from esi_guard.exceptions import ConfigurationError

__all__ = ["STRENGTHS", "average", "fit_combined", "fit_path"]

STRENGTHS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
"""The L2 strengths (on the mean log-loss) that cross-validation chooses from."""


def _fit(
    x: np.ndarray, y: np.ndarray, strength: float, bounded: int | None = None
) -> tuple[np.ndarray, float]:
    """Weights and intercept minimising log-loss + strength/2 * |w|^2, first ``bounded`` >= 0."""
    ((w, b),) = fit_path([x], [y], [(0, x.shape[1], strength)], bounded)
    return w, b


def _lbfgs(x: np.ndarray, y: np.ndarray, strength: float, bounded: int) -> tuple[np.ndarray, float]:
    """:func:`_fit`'s problem by scipy's L-BFGS-B: where the Newton steps do not converge."""
    from scipy.optimize import minimize

    n, d = x.shape
    xb, ridge = np.hstack([x, np.ones((n, 1))]), np.append(np.full(d, strength), 0.0)

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = xb @ theta
        value = float((np.logaddexp(0.0, z) - y * z).sum()) / n + 0.5 * float(ridge @ theta**2)
        return value, xb.T @ (_sigmoid(z) - y) / n + ridge * theta

    start = np.append(np.zeros(d), math.log((y.mean() + 1e-9) / (1 - y.mean() + 1e-9)))
    bounds = [(0.0, None)] * bounded + [(None, None)] * (d - bounded + 1)
    out = minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds)
    return out.x[:-1], float(out.x[-1])


def fit_path(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    problems: Sequence[tuple[int, int, float]],
    bounded: int | None = None,
) -> list[tuple[np.ndarray, float]]:
    """The monotone logistic fit of each ``(which, width, strength)`` of ``problems``, together.

    The probe search's :data:`~esi_guard.calibration.probe_search.Fit`, the first ``bounded``
    weights >= 0 (all by default). Batched projected Newton steps, as a search makes thousands of
    small fits (a batch per data width, within :data:`_BATCH_BYTES`); L-BFGS-B finishes a
    problem that does not converge.
    """
    d = xs[problems[0][0]].shape[1]
    most = max(len(y) for y in ys)
    step = max(1, _BATCH_BYTES // (most * (d + 1) * 8))
    rest = {n for n, (which, _, _) in enumerate(problems) if xs[which].shape[1] != d}
    if rest or len(problems) > step:
        # Each problem's fit is the same alone: fitted in batches of one data width (the
        # first problem's here, the rest's by the same call) and of bounded size.
        alike = [n for n in range(len(problems)) if n not in rest]
        batches = [alike[i : i + step] for i in range(0, len(alike), step)]
        by_problem: dict[int, tuple[np.ndarray, float]] = {}
        for batch in batches + ([sorted(rest)] if rest else []):
            found = fit_path(xs, ys, [problems[n] for n in batch], bounded)
            by_problem.update(zip(batch, found, strict=True))
        return [by_problem[n] for n in range(len(problems))]
    bounded = d if bounded is None else bounded
    # Every problem's data, padded to the longest with rows that weigh nothing.
    xb = np.zeros((len(problems), most, d + 1))
    yy, real = np.zeros((len(problems), most)), np.zeros((len(problems), most))
    for i, (at_data, _, _) in enumerate(problems):
        x, y = xs[at_data], ys[at_data]
        xb[i, : len(y), :d], xb[i, : len(y), d], yy[i, : len(y)], real[i, : len(y)] = x, 1, y, 1
    count = real.sum(axis=1)
    columns = np.arange(d + 1)
    widths = np.array([width for _, width, _ in problems])
    outside = (columns[None, :] >= widths[:, None]) & (columns[None, :] < d)  # held at 0
    ridge = np.where(columns[None, :] < d, np.array([c for _, _, c in problems])[:, None], 0.0)
    lower = np.append(np.zeros(bounded), np.full(d - bounded + 1, -np.inf))
    theta = np.zeros((len(problems), d + 1))
    rate = yy.sum(axis=1) / count
    theta[:, -1] = np.log((rate + 1e-9) / (1 - rate + 1e-9))

    def evaluate(at: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data, real_, yy_, count_, ridge_ = xb[rows], real[rows], yy[rows], count[rows], ridge[rows]
        z = np.matmul(data, at[:, :, None])[:, :, 0]  # batched BLAS, not einsum's loops
        p = _sigmoid(z)
        value = (real_ * (np.logaddexp(0.0, z) - yy_ * z)).sum(axis=1) / count_
        value += 0.5 * (ridge_ * at**2).sum(axis=1)
        residual = real_ * (p - yy_) / count_[:, None]
        return value, np.matmul(residual[:, None, :], data)[:, 0, :] + ridge_ * at, p

    value, grad, p = evaluate(theta, np.arange(len(problems)))
    left = np.ones(len(problems), dtype=bool)  # not converged and not given up on
    done = np.zeros(len(problems), dtype=bool)
    for _ in range(_NEWTON_STEPS):
        held = outside | ((theta <= lower) & (grad > 0))  # at a bound and pushed against it
        converged = left & (np.abs(np.where(held, 0.0, grad)).max(axis=1) < _TOLERANCE)
        done |= converged
        left &= ~converged
        rows = np.flatnonzero(left)
        if not len(rows):
            break
        # The free coordinates' Newton step; a held one's row and column decoupled, step 0.
        weight = real[rows] * p[rows] * (1 - p[rows]) / count[rows][:, None]
        data = xb[rows]
        hessian = np.matmul(np.swapaxes(data * weight[:, :, None], 1, 2), data)
        hessian[:, columns, columns] += ridge[rows] + 1e-12
        fixed = held[rows]
        hessian[fixed[:, :, None] | fixed[:, None, :]] = 0.0
        hessian[:, columns, columns] = np.where(fixed, 1.0, hessian[:, columns, columns])
        step = -np.linalg.solve(hessian, np.where(fixed, 0.0, grad[rows])[..., None])[..., 0]
        pending = np.ones(len(rows), dtype=bool)
        for _ in range(30):  # backtracking along the projected path, per problem
            at = rows[pending]
            trial = np.maximum(theta[at] + step[pending], lower)
            after, after_grad, after_p = evaluate(trial, at)
            ok = after <= value[at] + 1e-4 * ((grad[at] * (trial - theta[at])).sum(axis=1))
            taken = at[ok]
            theta[taken], value[taken], grad[taken], p[taken] = (
                trial[ok], after[ok], after_grad[ok], after_p[ok])  # fmt: skip
            waiting = np.flatnonzero(pending)
            pending[waiting[ok]] = False
            step[waiting[~ok]] *= 0.5
            if not pending.any():
                break
        left[rows[pending]] = False  # no step found: finished alone below
    fits = []
    for i, (at_data, width, strength) in enumerate(problems):
        if done[i]:
            fits.append((theta[i, :width], float(theta[i, -1])))
        else:
            x, y = xs[at_data], ys[at_data]
            fits.append(_lbfgs(x[:, :width], y, float(strength), min(bounded, width)))
    return fits


_NEWTON_STEPS = 50
"""Most projected Newton steps :func:`fit_path` takes before L-BFGS-B finishes a fit."""
_BATCH_BYTES = 4 << 20
"""Most bytes of padded data :func:`fit_path` fits at once (more problems: in batches)."""
_TOLERANCE = 1e-9
"""Largest projected-gradient entry at which :func:`fit_path` stops a fit."""


def fit_combined(
    signals: Sequence[Mapping[str, float]],
    wrong: Sequence[int],
    *,
    features: Sequence[str] = FEATURES,
    hidden: Sequence[HiddenStates] | None = None,
    folds: int = 5,
    seed: int = 0,
) -> CombinedScore:
    """Fit a :class:`CombinedScore` on answers' signals and wrong-answer labels.

    ``features``: scalar signals (:data:`SIGNALS`); ``hidden``: each answer's states, for a probe.
    Settings and strength: stratified ``folds``-fold CV (held-out log-loss) on these answers.

    Raises:
        ConfigurationError: An unknown signal, no signal nor states, too few answers of a class.
    """
    from sklearn.model_selection import StratifiedKFold

    names = tuple(features)
    unknown = [name for name in names if name not in SIGNALS]
    if unknown:
        msg = f"unknown signals {unknown}; known: {list(SIGNALS)} and {HIDDEN!r}"
        raise ConfigurationError(msg)
    if not names and hidden is None:
        msg = "a combined score needs at least one signal or the hidden states"
        raise ConfigurationError(msg)
    y = np.asarray(wrong, dtype=np.float64)
    raw = np.array([[s[name] for name in names] for s in signals], dtype=np.float64)
    raw = raw.reshape(len(y), len(names))
    counts = int(y.sum()), int(len(y) - y.sum())
    if min(counts) < folds:
        msg = (
            f"a combined score needs at least {folds} wrong and {folds} right answers to "
            f"fit; got {counts[0]} wrong and {counts[1]} right"
        )
        raise ConfigurationError(msg)
    mean, scale = standard(raw)
    x = (raw - mean) / scale
    splits = list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y))
    common = {"features": names, "mean": tuple(map(float, mean)),
              "scale": tuple(map(float, scale)), "n_fit": len(y)}  # fmt: skip
    if hidden is None:
        strength = min(STRENGTHS, key=lambda c: _held_out(x, y, splits, c))
        weights, intercept = _fit(x, y, strength)
        return CombinedScore(**common, weights=tuple(float(max(w, 0.0)) for w in weights),
                             intercept=intercept, strength=strength)  # fmt: skip
    # The probe: the signals' weights >= 0, the components' free.
    free = x.shape[1]
    found = search_states(
        x, y, splits, list(hidden), strengths=STRENGTHS,
        fit=lambda xs, ys, problems: fit_path(xs, ys, problems, free), error=_log_loss,
        score=lambda r: sum(float(np.sum(r[test])) for _, test in splits) / len(y),
    )  # fmt: skip
    return CombinedScore(**common, weights=tuple(float(max(v, 0.0)) for v in found.weights),
                         intercept=found.intercept, strength=found.strength,
                         hidden=found.probe)  # fmt: skip


def _held_out(
    x: np.ndarray, y: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]], strength: float,
    free: int | None = None,
) -> float:  # fmt: skip
    """Mean held-out log-loss of :func:`_fit` at ``strength`` over ``splits``."""
    total = 0.0
    for train, test in splits:
        w, b = _fit(x[train], y[train], strength, free)
        z = x[test] @ w + b
        total += float(np.sum(np.logaddexp(0.0, z) - y[test] * z))
    return total / len(y)


def _log_loss(y: np.ndarray, z: np.ndarray) -> np.ndarray:
    return np.asarray(np.logaddexp(0.0, z) - y * z)


def average(models: Sequence[CombinedScore], *, n_fit: int | None = None) -> CombinedScore:
    """One score whose logit is the mean of ``models``' logits (same features).

    A new question is new to every fold model, as each answer was to the one scoring it, so the
    mean's values sit where the out-of-fold ``p_wrong`` the threshold was chosen on sat (a refit on
    every answer's do not). All parts are linear: the mean is one :class:`CombinedScore`.
    ``n_fit``: default the members' sum.

    Raises:
        ConfigurationError: No model, or models over different signals.
    """
    if not models:
        msg = "average() needs at least one fitted score"
        raise ConfigurationError(msg)
    names = models[0].features
    if any(m.features != names for m in models):
        msg = f"average() needs scores over the same signals; got {[m.features for m in models]}"
        raise ConfigurationError(msg)
    means = np.array([m.mean for m in models]).reshape(len(models), len(names))
    scales = np.array([m.scale for m in models]).reshape(len(models), len(names))
    raw = np.array([m.weights for m in models]).reshape(len(models), len(names)) / scales
    offsets = np.array([m.intercept for m in models]) - np.sum(raw * means, axis=1)
    mean, scale, weight = means.mean(axis=0), scales.mean(axis=0), raw.mean(axis=0)
    intercept = float(offsets.mean() + np.dot(weight, mean))
    probes = [m.hidden for m in models if m.hidden is not None]
    if probes and len(probes) != len(models):
        msg = "average() needs every score with a hidden-state probe or none"
        raise ConfigurationError(msg)
    return CombinedScore(
        features=names, mean=tuple(map(float, mean)), scale=tuple(map(float, scale)),
        weights=tuple(float(max(w, 0.0)) for w in weight * scale), intercept=intercept,
        strength=float(np.mean([m.strength for m in models])),
        n_fit=sum(m.n_fit for m in models) if n_fit is None else n_fit,
        hidden=_average_probes(probes) if probes else None,
    )  # fmt: skip


def _average_probes(probes: Sequence[HiddenProbe]) -> HiddenProbe:
    """The mean of ``probes``' terms as one probe over the union of what they read."""
    layers = tuple(dict.fromkeys(layer for p in probes for layer in p.layers))
    read = {position for p in probes for position in p.positions}
    positions = tuple(p for p in POSITIONS if p in read)
    size = probes[0].hidden_size
    if any(p.hidden_size != size for p in probes):
        msg = f"average() needs probes of one hidden size; got {[p.hidden_size for p in probes]}"
        raise ConfigurationError(msg)
    total = np.zeros((len(layers), len(positions), size))
    for p in probes:
        w = np.asarray(p.weights).reshape(len(p.layers), len(p.positions), size)
        li = [layers.index(layer) for layer in p.layers]
        pi = [positions.index(position) for position in p.positions]
        total[np.ix_(li, pi)] += w
    shared = set.intersection(*(set(p.selection) for p in probes))
    return HiddenProbe(
        layers=layers, positions=positions, hidden_size=size,
        weights=tuple(map(float, (total / len(probes)).reshape(-1))),
        components=max(p.components for p in probes),
        selection={k: float(np.mean([p.selection[k] for p in probes])) for k in sorted(shared)},
    )  # fmt: skip
