"""ESI only where the decision needs it: a label-free ESI probe, and the cascade it drives.

An :class:`ESIProbe` reads ESI off what the answer's own pass already holds: its free
signals (``nll``, ``entropy``, ``max_nll``, :func:`~esi_guard.combined.free_signals`)
and its hidden states (:class:`~esi_guard.backends.base.HiddenStates`). It is a ridge
regression on the standardised signals and the PCA components of one layer's states at
some positions, fitted to the full-L ESI scores of *unlabelled* questions
(:func:`fit_esi_probe`; ``esi-guard distill``), its layer, positions, PCA size and
strength chosen by cross-validated squared error. Standardising, PCA and the regression
are linear, so it is folded into plain numbers: ``intercept + w . z(signals) + v .
states``, one portable JSON file. Its cost at run time is a dot product.

A :class:`Cascade` decides on a cheap score where that score is far enough from the
threshold and lets full ESI decide elsewhere. The cheap score is the probe's estimate of
ESI (a guard deciding on ESI), or a combined score's ``p_wrong`` with the probe's
estimate in ESI's place (a guard deciding on ``p_wrong``, with its hidden-state term
when it has one). ESI runs when the cheap score falls in ``[low, high]``; below it the
answer is accepted, above it the guard's action is taken. The band comes either from
the probe alone (the threshold +- :attr:`ESIProbe.band`, the held-out quantile of
``|ESI - estimate|`` at the probe's ``coverage``: no labels needed) or from calibration
data (:func:`fit_band`, ``esi-guard calibrate --esi-probe``): the narrowest band, of a
family growing around the threshold, whose decisions differ from full-ESI decisions on at
most ``max_disagreement`` of the answers with confidence ``1 - delta`` (one-sided
Clopper-Pearson, bands tested from the widest inwards, a fixed sequence, so no level is
spent on the search).

Pure: numpy and scipy, no model, no LangChain.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from esi_guard.backends.hidden import HiddenSpec, HiddenStates, Position
from esi_guard.combined import (
    COMPONENTS,
    POSITION_SETS,
    CombinedScore,
    HiddenProbe,
    _Reduced,
    _standard,
)
from esi_guard.exceptions import ConfigurationError
from esi_guard.result import ScoringConfig

__all__ = [
    "ESI_PROBE_FORMAT",
    "PROBE_SIGNALS",
    "Band",
    "Cascade",
    "ESIProbe",
    "fit_band",
    "fit_esi_probe",
]

ESI_PROBE_FORMAT = "esi-guard/esi-probe"

PROBE_SIGNALS = ("nll", "entropy", "max_nll")
"""The free signals an ESI probe reads by default (ESI is entropy-weighted: mean token
entropy alone has a Spearman of ~0.8 with it on the embedded model)."""

RIDGE_STRENGTHS = (1e-4, 1e-3, 1e-2, 0.1, 1.0)
"""The L2 strengths (on the mean squared error) cross-validation chooses from."""


class ESIProbe(BaseModel):
    """``estimate = intercept + sum_i w_i * (signal_i - mean_i) / scale_i [+ v . states]``.

    Fitted to full-L ESI scores by :func:`fit_esi_probe`; written by ``esi-guard distill``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["esi-guard/esi-probe"] = "esi-guard/esi-probe"
    version: Literal[1] = 1
    model: str = ""
    """The backend's ``model_id`` it was distilled on."""
    model_sha256: str | None = None
    """The weights' digest (a GGUF's) where the backend has one."""
    engine: str | None = None
    """The engine whose states it reads (``llamacpp``, ``transformers``)."""
    scoring: ScoringConfig | None = None
    """The ESI it estimates: L, k, distance, intervention... (a guard must match it)."""
    features: tuple[str, ...] = PROBE_SIGNALS
    """The free signals it reads."""
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    intercept: float
    strength: float
    """The L2 strength cross-validation chose."""
    hidden: HiddenProbe | None = None
    """The states' term (its ``selection``: held-out mean squared error per candidate)."""
    band: float = Field(ge=0)
    """Held-out quantile of ``|ESI - estimate|`` at ``coverage``: a label-free cascade
    runs ESI where the estimate is within this of the threshold."""
    coverage: float = Field(gt=0, lt=1)
    n_fit: int
    """Answers it was fitted on."""
    quality: dict[str, Any] = {}
    """Held out (nested cross-validation): ``spearman`` and ``r2`` with their 95%
    intervals, ``n``; ``signals_only``: the same for a probe on the free signals alone."""
    held_out_estimates: tuple[float, ...] = ()
    """The distillation answers' estimates by probes fitted without them (nested
    cross-validation), beside :attr:`held_out_esi`: what a label-free cascade certifies
    its band on, at whatever threshold the guard has."""
    held_out_esi: tuple[float, ...] = ()
    """Those answers' full-L ESI scores."""
    created: str | None = None
    esi_guard_version: str | None = None

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The states a backend must read for it; None: none."""
        return None if self.hidden is None else self.hidden.spec

    def estimate(self, signals: Mapping[str, float], hidden: HiddenStates | None = None) -> float:
        """The answer's estimated ESI score."""
        missing = [name for name in self.features if name not in signals]
        if missing:
            msg = f"the ESI probe needs the signals {missing} (got {sorted(signals)})"
            raise ConfigurationError(msg)
        x = (np.array([signals[n] for n in self.features]) - self.mean) / np.array(self.scale)
        value = self.intercept + float(np.dot(self.weights, x))
        if self.hidden is not None:
            if hidden is None:
                msg = "the ESI probe reads hidden states and got none"
                raise ConfigurationError(msg)
            value += self.hidden.term(hidden)
        return value

    def write(self, path: str | Path) -> None:
        """Write as indented JSON."""
        Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> ESIProbe:
        """Read and validate; every problem is a :class:`ConfigurationError` naming the file."""
        where = Path(path)
        try:
            raw = json.loads(where.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            msg = f"ESI probe file not found: {where}"
            raise ConfigurationError(msg) from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = f"ESI probe file {where} is not readable JSON: {exc}"
            raise ConfigurationError(msg) from exc
        if not isinstance(raw, dict) or raw.get("format") != ESI_PROBE_FORMAT:
            msg = (
                f"{where} is not an esi-guard ESI probe (format {ESI_PROBE_FORMAT!r} "
                "expected; `esi-guard distill` writes one)"
            )
            raise ConfigurationError(msg)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            msg = f"ESI probe file {where} is invalid: {exc}"
            raise ConfigurationError(msg) from exc


class Band(BaseModel):
    """Where the cheap score is too close to the threshold to decide on: ESI runs there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float
    high: float
    fitted: dict[str, Any] | None = None
    """From :func:`fit_band`: ``disagreement`` (cascade vs full-ESI decisions on the
    calibration answers), its upper ``bound`` at ``1 - delta``, ``max_disagreement``,
    ``delta``, ``esi_share`` (answers that ran ESI), ``n``. None: from the probe's own
    band (label-free)."""


class Cascade(BaseModel):
    """The cheap score (a probe, or a no-ESI combined score), the band; pure routing.

    Two kinds: with ``probe`` (an ESI-probe cascade) the cheap score is the probe's
    estimate of ESI, or ``combined``'s ``p_wrong`` with that estimate in ESI's place; with
    ``free`` (a value-of-information cascade, ``esi-guard calibrate --cascade``) it is the
    ``p_wrong`` of a combined score fitted without ESI, and where it falls inside the band
    ESI runs and ``combined`` (fitted with ESI) decides.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    probe: ESIProbe | None = None
    band: Band
    combined: CombinedScore | None = None
    """When set, the cheap score is its ``p_wrong`` with the probe's estimate as ``esi``
    (an ESI-probe cascade); with ``free``, what decides inside the band."""
    free: CombinedScore | None = None
    """A value-of-information cascade's cheap score: a combined score without ESI."""

    @model_validator(mode="after")
    def _one_cheap_score(self) -> Cascade:
        if (self.probe is None) == (self.free is None):
            msg = "a cascade has either an ESI probe or a no-ESI combined score (free)"
            raise ValueError(msg)
        if self.free is not None and ("esi" in self.free.features or self.combined is None):
            msg = "a value-of-information cascade needs free without esi, and combined with it"
            raise ValueError(msg)
        return self

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The states the cheap score reads (the probe's, and the combined scores')."""
        scores = (self.probe, self.combined, self.free)
        specs = [s.needs_hidden for s in scores if s is not None and s.needs_hidden is not None]
        if not specs:
            return None
        layers = tuple(dict.fromkeys(layer for s in specs for layer in s.layers))
        positions = tuple(dict.fromkeys(p for s in specs for p in s.positions))
        return HiddenSpec(layers, positions)

    def cheap(
        self, signals: Mapping[str, float], hidden: HiddenStates | None
    ) -> tuple[float | None, float]:
        """The probe's ESI estimate (None without a probe) and the cheap score."""
        if self.free is not None:
            return None, self.free.p_wrong(signals, hidden)
        assert self.probe is not None  # the validator's
        estimate = self.probe.estimate(signals, hidden)
        if self.combined is None:
            return estimate, estimate
        return estimate, self.combined.p_wrong({**signals, "esi": estimate}, hidden)

    def route(self, cheap: float) -> Literal["accept", "untrusted"] | None:
        """The cheap score's decision, or None: inside the band, ESI decides."""
        if cheap < self.band.low:
            return "accept"
        if cheap > self.band.high:
            return "untrusted"
        return None


def label_free_band(
    probe: ESIProbe, threshold: float, *, max_disagreement: float = 0.02, delta: float = 0.1
) -> Band:
    """The band a cascade deciding on ESI gets without labels.

    Fitted by :func:`fit_band` at ``threshold`` on the probe's held-out estimates of its
    distillation answers (no label is needed: only full ESI's decisions); when those
    answers are too few to certify any band, ESI runs everywhere (``fitted["reason"]``
    says so). A probe without held-out estimates: the threshold +- :attr:`ESIProbe.band`.
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


# -- fitting --------------------------------------------------------------------------------


def _ridge(x: np.ndarray, y: np.ndarray, strength: float) -> tuple[np.ndarray, float]:
    """Minimise mean squared error + strength * |w|^2 (intercept free)."""
    mx, my = x.mean(axis=0), y.mean()
    xc = x - mx
    gram = xc.T @ xc / len(y) + strength * np.eye(x.shape[1])
    w = np.linalg.solve(gram, xc.T @ (y - my) / len(y))
    return w, float(my - mx @ w)


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

    ``hidden``: each answer's states (the same layers and positions for all); the layer,
    positions, PCA size and strength are chosen by ``folds``-fold cross-validation on
    these answers. The probe's :attr:`~ESIProbe.band` is the ``coverage`` quantile of the
    out-of-fold ``|ESI - estimate|`` of the chosen settings. ``quality`` is left empty:
    :func:`held_out` measures it without the selection's optimism.

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
    mean, scale = _standard(raw)
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
    return _fit_with_states(x, y, splits, list(hidden), common)


def _cv_errors(
    x: np.ndarray, y: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]], strength: float
) -> np.ndarray:
    out = np.empty_like(y)
    for train, test in splits:
        w, b = _ridge(x[train], y[train], strength)
        out[test] = y[test] - (x[test] @ w + b)
    return out


def _fit_with_states(
    x: np.ndarray,
    y: np.ndarray,
    splits: list[tuple[np.ndarray, np.ndarray]],
    hidden: list[HiddenStates],
    common: dict[str, Any],
) -> ESIProbe:
    """Candidates (layer, positions) x PCA size x strength by held-out squared error."""
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
            out = {(k, c): np.empty_like(y) for k in sizes for c in RIDGE_STRENGTHS}
            for train, test in splits:
                reduce = _Reduced(states[train], max(sizes))
                for k in sizes:
                    xa = np.hstack([x[train], reduce(states[train], k)])
                    xb = np.hstack([x[test], reduce(states[test], k)])
                    for c in RIDGE_STRENGTHS:
                        w, b = _ridge(xa, y[train], c)
                        out[k, c][test] = y[test] - (xb @ w + b)
            for (k, c), r in out.items():
                residuals[layer, chosen, k, c] = r
    mse = {key: float(np.mean(r**2)) for key, r in residuals.items()}
    best = min(mse, key=mse.__getitem__)
    layer, chosen, k, strength = best
    li, pi = layers.index(layer), [positions.index(p) for p in chosen]
    states = values[:, li, pi, :].reshape(len(y), -1)
    reduce = _Reduced(states, k)
    w, b = _ridge(np.hstack([x, reduce(states, k)]), y, strength)
    direction = reduce.basis[:k].T @ w[free:]
    weights = direction / reduce.scale
    intercept = b - float(np.dot(reduce.mean / reduce.scale + reduce.center, direction))
    selection: dict[str, float] = {}
    for (lay, pos, _, _), value in mse.items():
        key = f"{lay}/{'+'.join(pos)}"
        selection[key] = min(value, selection.get(key, math.inf))
    probe = HiddenProbe(layers=(layer,), positions=chosen, hidden_size=values.shape[-1],
                        weights=tuple(map(float, weights)), components=k,
                        selection=selection)  # fmt: skip
    band = float(np.quantile(np.abs(residuals[best]), common["coverage"]))
    return ESIProbe(**common, weights=tuple(map(float, w[:free])), intercept=intercept,
                    strength=strength, hidden=probe, band=band)  # fmt: skip


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

    ``cheap``: each calibration answer's cheap score; ``full``: its full score (ESI, or
    the combined ``p_wrong`` with ESI). The family: ``|g(cheap) - g(threshold)| <= b``
    runs ESI (``g`` the identity, or the logit for probabilities), for ``b`` from the
    widest (every answer runs ESI: no disagreement) inwards; the narrowest ``b`` before
    the first whose Clopper-Pearson bound on the disagreement exceeds
    ``max_disagreement`` is kept. None: not even the widest tested band passes (too
    few answers for the bound).
    """
    from esi_guard.calibration.thresholds import risk_bound

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
