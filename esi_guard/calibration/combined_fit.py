"""Fitting a :class:`~esi_guard.combined.CombinedScore` on answers' signals and labels.

A logistic model whose weights are all >= 0 on standardised signals, so ``p_wrong``
never falls when a signal rises, with its L2 strength chosen by stratified
cross-validation (held-out log-loss). With hidden states, the probe's layer, positions,
PCA size and strength are chosen by the same cross-validation
(:func:`~esi_guard.calibration.probe_search.search_states`), the components' weights
free. ``esi-guard calibrate --score combined`` fits through
:mod:`esi_guard.calibration.calibrate_combined`; the score at run time is
:mod:`esi_guard.combined`'s.

Pure: numpy, scipy and scikit-learn, no model.
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
    """Weights and an intercept minimising mean log-loss + strength/2 * |w|^2.

    The first ``bounded`` weights (all by default) are >= 0; the others are free. Solved
    by projected Newton steps (:func:`fit_path`, one problem), with L-BFGS-B to finish
    should they not converge.
    """
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

    Each problem's weights and intercept minimise the mean log-loss + ``strength``/2 *
    |w|^2 on the first ``width`` columns of ``xs[which]`` (labels ``ys[which]``), the
    first ``bounded`` weights >= 0 (all by default): the probe search's
    :data:`~esi_guard.calibration.probe_search.Fit`. Projected Newton steps are taken for
    every problem at once (stacked Hessians, one batched solve, a backtracking line search
    per problem; a column past a problem's width is held at 0, a row past its data weighs
    nothing): a
    probe's search fits every fold, PCA size and strength of each candidate, thousands of
    fits of a few dozen features, where one fit at a time spends its time in numpy's
    per-call overhead. A problem whose steps do not converge is finished by L-BFGS-B.
    Problems on data of different widths, or too many for :data:`_BATCH_BYTES`, are fitted
    in batches.
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

    ``features``: the scalar signals to use (:data:`SIGNALS`). ``hidden``: each answer's
    hidden states (the same layers and positions for all), for a probe; its layer, positions,
    PCA size and the L2 strength are chosen by stratified ``folds``-fold cross-validation
    (held-out log-loss) on these answers only.

    Raises:
        ConfigurationError: An unknown signal, no signal and no states, too few answers, or
            only one class among them.
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
    # The probe: (layer, positions) x PCA size x strength by held-out log-loss, the signals'
    # weights >= 0 and the components' free.
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

    Cross-fitting leaves one model per fold, each fitted without its fold and scoring it:
    the threshold is chosen on those out-of-fold ``p_wrong``. At run time every question
    is new to every fold model, so their mean is a score whose values sit where the
    out-of-fold ones sat (a model refitted on every answer, its probe's settings chosen
    again, sits elsewhere: the threshold then misses its coverage). Every part is
    linear, so the mean folds into one :class:`CombinedScore`: the signals' weights on
    the raw signals averaged (still >= 0), the probes' weights over the union of their
    layers and positions (0 where a fold's probe does not read).

    ``n_fit``: the answers behind them all (default: the members' sum).

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
