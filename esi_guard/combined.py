"""A combined, calibrated score: ESI and the free signals of the greedy answer -> P(wrong).

The guarded pass already holds, beside ESI, the greedy answer's distributions: its
tokens' negative log-likelihood and the entropy of each position cost nothing more. A
:class:`CombinedScore` maps them to the probability that the answer is wrong with a
logistic model whose weights are all >= 0 on standardised signals, so ``p_wrong`` never
falls when a signal rises (monotone in each), fitted by :func:`fit_combined` with its L2
strength chosen by stratified cross-validation. It is small enough to live in a threshold
file as plain numbers (no pickle): ``esi-guard calibrate --score combined``.

Signals (:data:`SIGNALS`; :data:`FEATURES` is the default set): ``esi`` (the score),
``nll`` (the answer's negative log-probability, its tokens' summed, each normalised over
its position's top-k, as the benchmark's "NLL (greedy)"), ``entropy`` (mean entropy of
those truncated distributions, ESI's ``alpha_t``, as "mean token entropy") and
``max_nll`` (the largest of the tokens' negative log-probabilities: the answer's least
likely token) and ``repetition`` (the share of the answer's word pairs that repeat an
earlier pair: a small model's degenerate loops, :func:`repetition`).

**Hidden states** (``calibrate --features esi,nll,entropy,hidden``): the model's residual
stream at the positions behind the answer (:class:`~esi_guard.backends.base.HiddenStates`,
read from the answer's own forward passes) joins the signals as a *probe*: the states are
standardised and reduced by PCA, and the logistic model takes the components beside the
signals (signals' weights still >= 0; the components' free). Which layer, which positions,
how many components and the L2 strength are chosen by cross-validation on the fitting
answers. Standardising, PCA and the logistic model are all linear, so the fitted probe is
folded into one weight vector over the raw states (:class:`HiddenProbe`): ``p_wrong`` is
``sigmoid(intercept + w . z(signals) + v . states)``, plain numbers in the threshold file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from esi_guard.backends.hidden import FINAL, POSITIONS, HiddenSpec, HiddenStates, Position
from esi_guard.exceptions import ConfigurationError
from esi_guard.scoring import TopK, ValueKind, fill_value, truncated_entropy

__all__ = [
    "FEATURES",
    "HIDDEN",
    "SIGNALS",
    "CombinedScore",
    "HiddenProbe",
    "fit_combined",
    "free_signals",
    "probe_window",
    "repetition",
]

FEATURES = ("esi", "nll", "entropy")
"""The signals a combined score uses by default, in order."""

SIGNALS = ("esi", "nll", "entropy", "max_nll", "repetition")
"""Every scalar signal a combined score can use."""

HIDDEN = "hidden"
"""The feature name of the hidden-state probe (``--features ...,hidden``)."""

POSITION_SETS: tuple[tuple[Position, ...], ...] = (
    ("prompt_last",),
    ("answer_mean",),
    ("prompt_last", "answer_mean"),
    ("answer_last",),
)
"""The positions a probe may read, tried by cross-validation."""

DEPTHS = (0.4, 0.5, 0.6, 0.7, 0.8)
"""Where in the model's depth the probe's candidate layers sit (plus the final norm's)."""

COMPONENTS = (8, 16, 32)
"""PCA sizes cross-validation chooses from (capped by the answers at hand)."""

STRENGTHS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
"""The L2 strengths (on the mean log-loss) that cross-validation chooses from."""


def repetition(text: str) -> float:
    """The share of ``text``'s word pairs (lower-cased) that repeat an earlier pair.

    0 for an answer of fewer than three words or without a repeat; near 1 for a loop
    ("la femme au roi, la femme au roi, la femme au roi..."). From the text, not the
    tokens: the same on every engine and tokenizer.
    """
    words = _WORDS.findall(text.lower())
    pairs = list(pairwise(words))
    if len(pairs) < 2:
        return 0.0
    return 1.0 - len(set(pairs)) / len(pairs)


_WORDS = re.compile(r"\w+")


def free_signals(
    original: TopK,
    answer_ids: Sequence[int],
    kind: ValueKind,
    alphas: np.ndarray | None = None,
    *,
    text: str | None = None,
) -> dict[str, float]:
    """``nll``, ``entropy`` and ``max_nll`` of an answer from its original top-k (no model call).

    With the answer's ``text``, its :func:`repetition` too.

    ``nll`` is :func:`~esi_guard.baselines.neg_log_likelihood` of the answer's tokens, each
    normalised over its position's top-k (the benchmark's "NLL (greedy)"); a token missing
    from its top-k (a forced, non-greedy answer) gets the fill value ESI gives a missing
    token. ``entropy`` is the mean of ESI's ``alpha_t``: pass them (``ESIScore.alphas``)
    when they are at hand, else they are computed.
    """
    from esi_guard.baselines import neg_log_likelihood

    valid = original.ids >= 0
    values = np.where(valid, original.values, -np.inf)
    fill = fill_value(original.values, valid, kind)
    ids = np.asarray(answer_ids)[:, None]
    found = (original.ids == ids) & valid
    value = np.where(found.any(axis=1), np.where(found, values, -np.inf).max(axis=1), fill)
    # A missing token joins its row at the fill value: the row's mass then includes it.
    norm = np.logaddexp.reduce(values, axis=1)
    norm = np.where(found.any(axis=1), norm, np.logaddexp(norm, fill))
    entropy = truncated_entropy(original) if alphas is None else alphas
    logprobs = (value - norm).tolist()
    signals = {
        "nll": neg_log_likelihood(logprobs),
        "entropy": float(np.mean(entropy)),
        "max_nll": float(-min(logprobs)) if logprobs else 0.0,
    }
    if text is not None:
        signals["repetition"] = repetition(text)
    return signals


def probe_window(hidden_layers: Sequence[int]) -> HiddenSpec:
    """The states a probe's fit chooses from, read with every calibration answer.

    Blocks at :data:`DEPTHS` of the model's depth and the final norm's output, at every
    position.
    """
    blocks = sorted(layer for layer in hidden_layers if layer != FINAL)
    if not blocks:
        return HiddenSpec((FINAL,), POSITIONS)
    last = len(blocks) - 1
    picks = tuple(dict.fromkeys(blocks[min(last, int(f * last + 0.5))] for f in DEPTHS))
    return HiddenSpec((*picks, FINAL) if FINAL in hidden_layers else picks, POSITIONS)


class HiddenProbe(BaseModel):
    """The hidden-state term of a combined score, folded to ``weights . states``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: tuple[int, ...]
    """The layers read (block indices, or -1 for the final norm's output)."""
    positions: tuple[Position, ...]
    """The positions read (:data:`~esi_guard.backends.base.POSITIONS`)."""
    hidden_size: int
    """The model's hidden width: a backend of another width is refused."""
    weights: tuple[float, ...]
    """Over the states' values, layer-major (``HiddenStates.features()``)."""
    components: int
    """The PCA components it was fitted through."""
    selection: dict[str, float] = {}
    """Cross-validated log-loss of the best fit per candidate (``layer/positions``)."""

    @property
    def spec(self) -> HiddenSpec:
        """What a backend must read for it."""
        return HiddenSpec(self.layers, self.positions)

    def term(self, states: HiddenStates) -> float:
        """Its contribution to the logit of ``p_wrong``."""
        x = states.select(self.spec).features()
        if x.shape != (len(self.weights),):
            msg = (
                f"the probe reads {len(self.weights)} values ({self.hidden_size} per layer "
                f"and position); the states give {x.shape[0]}"
            )
            raise ConfigurationError(msg)
        return float(np.dot(self.weights, x))


class CombinedScore(BaseModel):
    """``p_wrong = sigmoid(intercept + sum_i weight_i * (signal_i - mean_i) / scale_i [+ probe])``.

    With a :class:`HiddenProbe` (``hidden``), its term ``v . states`` joins the sum.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    features: tuple[str, ...] = FEATURES
    """The scalar signals, among :data:`SIGNALS` (none: the probe alone)."""
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    """All >= 0: monotone non-decreasing in every signal."""
    intercept: float
    strength: float
    """The L2 strength cross-validation chose."""
    n_fit: int
    """Answers it was fitted on."""
    hidden: HiddenProbe | None = None
    """The hidden-state probe, when fitted with hidden states."""

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The states a backend must read for it; None: none."""
        return None if self.hidden is None else self.hidden.spec

    @property
    def uses_esi(self) -> bool:
        """Whether it reads the ESI score: without it a guard forces no variant."""
        return "esi" in self.features

    def logit(self, signals: Mapping[str, float], hidden: HiddenStates | None = None) -> float:
        """``log(p_wrong / (1 - p_wrong))``."""
        z, term = self._parts(signals, hidden)
        return z if term is None else z + term

    def p_wrong(self, signals: Mapping[str, float], hidden: HiddenStates | None = None) -> float:
        """The probability that the answer with these signals (and states) is wrong."""
        return float(_sigmoid(self.logit(signals, hidden)))

    def scored(
        self, signals: Mapping[str, float], hidden: HiddenStates | None = None
    ) -> tuple[float, float | None]:
        """``p_wrong`` and the probe's term in its logit (None without a probe), at once."""
        z, term = self._parts(signals, hidden)
        return float(_sigmoid(z if term is None else z + term)), term

    def _parts(
        self, signals: Mapping[str, float], hidden: HiddenStates | None
    ) -> tuple[float, float | None]:
        """The logit's signal part (intercept included) and the probe's term."""
        missing = [name for name in self.features if name not in signals]
        if missing:
            msg = f"the combined score needs the signals {missing} (got {sorted(signals)})"
            raise ConfigurationError(msg)
        x = (np.array([signals[n] for n in self.features]) - self.mean) / np.array(self.scale)
        z = self.intercept + float(np.dot(self.weights, x))
        if self.hidden is None:
            return z, None
        if hidden is None:
            msg = "the combined score has a hidden-state probe and got no hidden states"
            raise ConfigurationError(msg)
        return z, self.hidden.term(hidden)


def _sigmoid(z: Any) -> Any:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z)))


def _fit(
    x: np.ndarray, y: np.ndarray, strength: float, bounded: int | None = None
) -> tuple[np.ndarray, float]:
    """Weights and an intercept minimising mean log-loss + strength/2 * |w|^2.

    The first ``bounded`` weights (all by default) are >= 0; the others are free. Solved
    by projected Newton steps (a few dozen features: each step is one small linear solve;
    cross-validating a probe runs thousands of these fits), with L-BFGS-B to finish
    should they not converge.
    """
    n, d = x.shape
    bounded = d if bounded is None else bounded
    problem = _Problem(np.hstack([x, np.ones((n, 1))]), y, np.append(np.full(d, strength), 0.0))
    lower = np.append(np.zeros(bounded), np.full(d - bounded + 1, -np.inf))
    theta = np.append(np.zeros(d), math.log((y.mean() + 1e-9) / (1 - y.mean() + 1e-9)))
    current, grad = problem(theta)
    for _ in range(_NEWTON_STEPS):
        held = (theta <= lower) & (grad > 0)  # at a bound and pushed against it
        if np.max(np.abs(np.where(held, 0.0, grad))) < _TOLERANCE:
            return theta[:-1], float(theta[-1])
        free = ~held
        step = np.zeros_like(theta)
        step[free] = -np.linalg.solve(problem.hessian(theta, free), grad[free])
        for _ in range(30):  # backtracking along the projected path
            trial = np.maximum(theta + step, lower)
            after, after_grad = problem(trial)
            if after <= current + 1e-4 * float(grad @ (trial - theta)):
                break
            step *= 0.5
        else:
            break
        theta, current, grad = trial, after, after_grad
    from scipy.optimize import minimize

    bounds = [(0.0, None)] * bounded + [(None, None)] * (d - bounded + 1)
    out = minimize(problem, theta, jac=True, method="L-BFGS-B", bounds=bounds)
    return out.x[:-1], float(out.x[-1])


_NEWTON_STEPS = 50
"""Most projected Newton steps :func:`_fit` takes before L-BFGS-B finishes the fit."""
_TOLERANCE = 1e-9
"""Largest projected-gradient entry at which :func:`_fit` stops."""


class _Problem:
    """:func:`_fit`'s objective on ``theta = (w, b)``: its value and gradient, its Hessian."""

    def __init__(self, xb: np.ndarray, y: np.ndarray, ridge: np.ndarray) -> None:
        self.xb, self.y, self.ridge = xb, y, ridge

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = self.xb @ theta
        value = np.mean(np.logaddexp(0.0, z) - self.y * z) + 0.5 * float(self.ridge @ theta**2)
        grad = self.xb.T @ (_sigmoid(z) - self.y) / len(self.y) + self.ridge * theta
        return float(value), grad

    def hessian(self, theta: np.ndarray, free: np.ndarray) -> np.ndarray:
        """The Hessian's rows and columns ``free``."""
        p = _sigmoid(self.xb @ theta)
        cols = self.xb[:, free]
        h = (cols * (p * (1 - p) / len(self.y))[:, None]).T @ cols
        h[np.diag_indices_from(h)] += self.ridge[free] + 1e-12
        return np.asarray(h)


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
    mean, scale = _standard(raw)
    x = (raw - mean) / scale
    splits = list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y))
    common = {"features": names, "mean": tuple(map(float, mean)),
              "scale": tuple(map(float, scale)), "n_fit": len(y)}  # fmt: skip
    if hidden is None:
        strength = min(STRENGTHS, key=lambda c: _held_out(x, y, splits, c))
        weights, intercept = _fit(x, y, strength)
        return CombinedScore(**common, weights=tuple(float(max(w, 0.0)) for w in weights),
                             intercept=intercept, strength=strength)  # fmt: skip
    return _fit_probe(x, y, splits, list(hidden), common)


def _standard(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and standard deviations (1 where a column is constant)."""
    mean, scale = raw.mean(axis=0), raw.std(axis=0)
    return mean, np.where(scale > 1e-12 * (1.0 + np.abs(mean)), scale, 1.0)


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


class _Reduced:
    """Standardise then PCA, fitted on some answers' states; applied to any."""

    def __init__(self, states: np.ndarray, components: int) -> None:
        self.mean, self.scale = _standard(states)
        z = (states - self.mean) / self.scale
        self.center = z.mean(axis=0)
        self.basis = _principal_axes(z - self.center, components)

    def __call__(self, states: np.ndarray, components: int) -> np.ndarray:
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


def _fit_probe(
    x: np.ndarray,
    y: np.ndarray,
    splits: list[tuple[np.ndarray, np.ndarray]],
    hidden: list[HiddenStates],
    common: dict[str, Any],
) -> CombinedScore:
    """The probe: candidates (layer, positions) x PCA size x strength by held-out log-loss."""
    layers, positions = hidden[0].layers, hidden[0].positions
    if any(h.layers != layers or h.positions != positions for h in hidden):
        msg = "every answer's hidden states must have the same layers and positions"
        raise ConfigurationError(msg)
    values = np.stack([np.asarray(h.values, dtype=np.float64) for h in hidden])
    smallest = min(len(train) for train, _ in splits)
    sizes = sorted({min(k, max(1, smallest // 8)) for k in COMPONENTS})
    free = x.shape[1]
    scores: dict[tuple[int, tuple[Position, ...], int, float], float] = {}
    for li, layer in enumerate(layers):
        for chosen in POSITION_SETS:
            if not set(chosen) <= set(positions):
                continue
            pi = [positions.index(p) for p in chosen]
            states = values[:, li, pi, :].reshape(len(y), -1)
            losses = {(k, c): 0.0 for k in sizes for c in STRENGTHS}
            for train, test in splits:
                reduce = _Reduced(states[train], max(sizes))
                for k in sizes:
                    xa = np.hstack([x[train], reduce(states[train], k)])
                    xb = np.hstack([x[test], reduce(states[test], k)])
                    for c in STRENGTHS:
                        w, b = _fit(xa, y[train], c, free)
                        z = xb @ w + b
                        losses[k, c] += float(np.sum(np.logaddexp(0.0, z) - y[test] * z))
            for (k, c), loss in losses.items():
                scores[layer, chosen, k, c] = loss / len(y)
    layer, chosen, k, strength = min(scores, key=scores.__getitem__)
    li, pi = layers.index(layer), [positions.index(p) for p in chosen]
    states = values[:, li, pi, :].reshape(len(y), -1)
    reduce = _Reduced(states, k)
    w, b = _fit(np.hstack([x, reduce(states, k)]), y, strength, free)
    # Fold standardising, PCA and the components' weights into weights on the raw states.
    direction = reduce.basis[:k].T @ w[free:]
    weights = direction / reduce.scale
    intercept = b - float(np.dot(reduce.mean / reduce.scale + reduce.center, direction))
    best: dict[str, float] = {}
    for (lay, pos, _, _), loss in scores.items():
        key = f"{lay}/{'+'.join(pos)}"
        best[key] = min(loss, best.get(key, math.inf))
    probe = HiddenProbe(layers=(layer,), positions=chosen, hidden_size=values.shape[-1],
                        weights=tuple(map(float, weights)), components=k,
                        selection=best)  # fmt: skip
    return CombinedScore(**common, weights=tuple(float(max(v, 0.0)) for v in w[:free]),
                         intercept=intercept, strength=strength, hidden=probe)  # fmt: skip
