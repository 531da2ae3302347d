"""Fitting a cascade's parts: the label-free ESI probe and the band around the threshold.

:func:`fit_esi_probe` (``esi-guard distill``) fits an :class:`~esi_guard.cascade.ESIProbe`, a
ridge regression, to *unlabelled* questions' full-L ESI; :func:`fit_band` (``calibrate
--esi-probe``, ``--cascade``) a :class:`~esi_guard.cascade.Band` on calibration data, and
:func:`label_free_band` on a probe's held-out estimates. Run time is :mod:`esi_guard.cascade`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from esi_guard.backends.hidden import HiddenStates
from esi_guard.calibration.probe_search import search_states, standard
from esi_guard.calibration.thresholds import risk_bound
from esi_guard.cascade import PROBE_SIGNALS, Band, ESIProbe
from esi_guard.exceptions import ConfigurationError

__all__ = ["RIDGE_STRENGTHS", "fit_band", "fit_esi_probe", "held_out", "label_free_band"]

RIDGE_STRENGTHS = (1e-4, 1e-3, 1e-2, 0.1, 1.0)
"""The L2 strengths (on the mean squared error) cross-validation chooses from."""


def label_free_band(
    probe: ESIProbe, threshold: float, *, max_disagreement: float = 0.02, delta: float = 0.1
) -> Band:
    """The band a cascade deciding on ESI gets without labels.

    :func:`fit_band` on the probe's held-out estimates; too few to certify a band: ESI everywhere
    (``fitted["reason"]``). Without held-out estimates: the threshold +- :attr:`ESIProbe.band`.
    """
    if not probe.held_out_esi:
        return Band(low=threshold - probe.band, high=threshold + probe.band)
    band = fit_band(probe.held_out_estimates, probe.held_out_esi, threshold,
                    max_disagreement=max_disagreement, delta=delta)  # fmt: skip
    if band is None:
        reason = (
            f"{len(probe.held_out_esi)} distillation answers cannot certify "
            f"{max_disagreement:g} disagreement at {1 - delta:g}: ESI runs on every answer"
        )
        return Band(low=-math.inf, high=math.inf, fitted={"reason": reason})
    return band


def _ridge(x: np.ndarray, y: np.ndarray, strength: float) -> tuple[np.ndarray, float]:
    """Minimise mean squared error + strength * |w|^2 (intercept free)."""
    ((w, b),) = _ridge_path([x], [y], [(0, x.shape[1], strength)])
    return w, b


def _ridge_path(
    xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], problems: Sequence[tuple[int, int, float]]
) -> list[tuple[np.ndarray, float]]:
    """:func:`_ridge` on ``xs[which]``'s first ``width`` columns at ``strength``, for each."""
    grams: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, float]] = {}
    fits = []
    for which, width, strength in problems:
        if which not in grams:
            x, y = xs[which], ys[which]
            mx, my = x.mean(axis=0), float(y.mean())
            xc = x - mx
            grams[which] = (xc.T @ xc / len(y), xc.T @ (y - my) / len(y), mx, my)
        gram, target, mx, my = grams[which]
        w = np.linalg.solve(gram[:width, :width] + strength * np.eye(width), target[:width])
        fits.append((w, my - float(mx[:width] @ w)))
    return fits


def _splits(n: int, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import KFold

    return list(KFold(folds, shuffle=True, random_state=seed).split(np.zeros(n)))


def fit_esi_probe(
    signals: Sequence[Mapping[str, float]],
    esi: Sequence[float] | np.ndarray,
    *,
    hidden: Sequence[HiddenStates] | None = None,
    features: Sequence[str] = PROBE_SIGNALS,
    coverage: float = 0.98,
    folds: int = 5,
    seed: int = 0,
) -> ESIProbe:
    """Fit an :class:`ESIProbe` to answers' full-L ESI scores (no labels).

    ``hidden``: each answer's states (settings by ``folds``-fold CV); :attr:`~ESIProbe.band`: the
    ``coverage`` quantile of out-of-fold ``|ESI - estimate|``. ``quality`` is left empty:
    :func:`held_out` measures it.

    Raises:
        ConfigurationError: Too few answers, or no signal and no states.
    """
    y = np.asarray(esi, dtype=np.float64)
    names = tuple(features)
    if len(y) < 4 * folds:
        msg = f"an ESI probe needs at least {4 * folds} scored answers to fit; got {len(y)}"
        raise ConfigurationError(msg)
    if not names and hidden is None:
        msg = "an ESI probe needs at least one signal or the hidden states"
        raise ConfigurationError(msg)
    raw = np.array([[s[n] for n in names] for s in signals], dtype=np.float64)
    raw = raw.reshape(len(y), len(names))
    mean, scale = standard(raw)
    x = (raw - mean) / scale
    splits = _splits(len(y), folds, seed)
    common = {"features": names, "mean": tuple(map(float, mean)),
              "scale": tuple(map(float, scale)), "n_fit": len(y), "coverage": coverage}  # fmt: skip
    if hidden is None:
        errors = {c: _cv_errors(x, y, splits, c) for c in RIDGE_STRENGTHS}
        strength = min(errors, key=lambda c: float(np.mean(errors[c] ** 2)))
        w, b = _ridge(x, y, strength)
        band = float(np.quantile(np.abs(errors[strength]), coverage))
        return ESIProbe(**common, weights=tuple(map(float, w)), intercept=b,
                        strength=strength, band=band)  # fmt: skip
    # Candidates (layer, positions) x PCA size x strength by held-out squared error.
    found = search_states(x, y, splits, list(hidden), strengths=RIDGE_STRENGTHS,
                          fit=_ridge_path,
                          error=lambda held, z: held - z,
                          score=lambda r: float(np.mean(r**2)))  # fmt: skip
    band = float(np.quantile(np.abs(found.errors), coverage))
    return ESIProbe(**common, weights=tuple(map(float, found.weights)),
                    intercept=found.intercept, strength=found.strength, hidden=found.probe,
                    band=band)  # fmt: skip


def _cv_errors(
    x: np.ndarray, y: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]], strength: float
) -> np.ndarray:
    out = np.empty_like(y)
    for train, test in splits:
        w, b = _ridge(x[train], y[train], strength)
        out[test] = y[test] - (x[test] @ w + b)
    return out


def held_out(
    signals: Sequence[Mapping[str, float]],
    esi: Sequence[float] | np.ndarray,
    *,
    hidden: Sequence[HiddenStates] | None = None,
    features: Sequence[str] = PROBE_SIGNALS,
    folds: int = 5,
    seed: int = 0,
) -> np.ndarray:
    """Each answer's estimate by a probe fitted (settings chosen too) without it."""
    y = np.asarray(esi, dtype=np.float64)
    out = np.empty_like(y)
    for train, test in _splits(len(y), folds, seed + 1):
        probe = fit_esi_probe([signals[i] for i in train], y[train],
                              hidden=None if hidden is None else [hidden[i] for i in train],
                              features=features, folds=folds, seed=seed)  # fmt: skip
        for i in test:
            out[i] = probe.estimate(signals[i], None if hidden is None else hidden[i])
    return out


def fit_band(
    cheap: Sequence[float],
    full: Sequence[float],
    threshold: float,
    *,
    max_disagreement: float = 0.02,
    delta: float = 0.1,
    logit: bool = False,
) -> Band | None:
    """The narrowest band around ``threshold`` keeping cascade decisions close to full ones.

    ESI runs where ``|g(cheap) - g(threshold)| <= b`` (``g``: the logit if ``logit``, else the
    identity); ``b`` shrinks from the widest while the Clopper-Pearson bound on disagreement with
    ``full`` (at ``1 - delta``) stays within ``max_disagreement``. None: too few for any band.
    """
    c, f = np.asarray(cheap, dtype=np.float64), np.asarray(full, dtype=np.float64)
    if c.shape != f.shape or c.size == 0:
        msg = f"fit_band needs as many cheap as full scores, got {c.size} and {f.size}"
        raise ConfigurationError(msg)
    g = _logit if logit else (lambda v: np.asarray(v, dtype=np.float64))
    distance = np.abs(g(c) - g(np.float64(threshold)))
    full_untrusted = f > threshold
    cheap_untrusted = c > threshold
    n = c.size
    chosen: tuple[float, int] | None = None
    for b in np.unique(distance)[::-1]:
        decided = distance > b
        errors = int(np.sum(decided & (cheap_untrusted != full_untrusted)))
        if risk_bound(errors, n, delta) > max_disagreement:
            break
        chosen = (float(b), errors)
    if chosen is None:
        return None
    b, errors = chosen
    low, high = (_expit(g(threshold) - b), _expit(g(threshold) + b)) if logit else (
        threshold - b, threshold + b)  # fmt: skip
    share = float(np.mean(distance <= b))
    fitted = {"disagreement": errors / n, "bound": risk_bound(errors, n, delta),
              "max_disagreement": max_disagreement, "delta": delta, "esi_share": share,
              "n": n, "scale": "logit" if logit else "score"}  # fmt: skip
    return Band(low=float(low), high=float(high), fitted=fitted)


def _logit(p: Any) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return np.asarray(np.log(q) - np.log1p(-q))


def _expit(z: Any) -> float:
    return float(0.5 * (1.0 + np.tanh(0.5 * float(z))))
