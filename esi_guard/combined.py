"""A combined, calibrated score: ESI and the free signals of the greedy answer -> P(wrong).

The guarded pass already holds, beside ESI, the greedy answer's distributions: its
tokens' negative log-likelihood and the entropy of each position cost nothing more. A
:class:`CombinedScore` maps them to the probability that the answer is wrong with a
logistic model whose weights are all >= 0 on standardised signals, so ``p_wrong`` never
falls when a signal rises (monotone in each), fitted by :func:`fit_combined` with its L2
strength chosen by stratified cross-validation. It is small enough to live in a threshold
file as plain numbers (no pickle): ``esi-guard calibrate --score combined``.

Signals (:data:`FEATURES`): ``esi`` (the score), ``nll`` (the answer's negative
log-probability, its tokens' summed, each normalised over its position's top-k, as the
benchmark's "NLL (greedy)") and ``entropy`` (mean entropy of those truncated
distributions, ESI's ``alpha_t``, as "mean token entropy").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from esi_guard.exceptions import ConfigurationError
from esi_guard.scoring import TopK, ValueKind, fill_value, truncated_entropy

__all__ = ["FEATURES", "CombinedScore", "fit_combined", "free_signals"]

FEATURES = ("esi", "nll", "entropy")
"""The signals a combined score uses, in order."""

STRENGTHS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
"""The L2 strengths (on the mean log-loss) that cross-validation chooses from."""


def free_signals(
    original: TopK, answer_ids: Sequence[int], kind: ValueKind, alphas: np.ndarray | None = None
) -> dict[str, float]:
    """``nll`` and ``entropy`` of an answer from its original top-k (no model call).

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
    return {"nll": neg_log_likelihood((value - norm).tolist()), "entropy": float(np.mean(entropy))}


class CombinedScore(BaseModel):
    """``p_wrong = sigmoid(intercept + sum_i weight_i * (signal_i - mean_i) / scale_i)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    features: tuple[str, ...] = FEATURES
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    """All >= 0: monotone non-decreasing in every signal."""
    intercept: float
    strength: float
    """The L2 strength cross-validation chose."""
    n_fit: int
    """Answers it was fitted on."""

    def p_wrong(self, signals: Mapping[str, float]) -> float:
        """The probability that the answer with these signals is wrong."""
        missing = [name for name in self.features if name not in signals]
        if missing:
            msg = f"the combined score needs the signals {missing} (got {sorted(signals)})"
            raise ConfigurationError(msg)
        x = (np.array([signals[n] for n in self.features]) - self.mean) / np.array(self.scale)
        return float(_sigmoid(self.intercept + float(np.dot(self.weights, x))))


def _sigmoid(z: Any) -> Any:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z)))


def _fit(x: np.ndarray, y: np.ndarray, strength: float) -> tuple[np.ndarray, float]:
    """Weights >= 0 and an intercept minimising mean log-loss + strength/2 * |w|^2."""
    from scipy.optimize import minimize

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:-1], theta[-1]
        z = x @ w + b
        p = _sigmoid(z)
        value = np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * strength * float(w @ w)
        grad_z = (p - y) / len(y)
        return float(value), np.append(x.T @ grad_z + strength * w, grad_z.sum())

    start = np.append(np.zeros(x.shape[1]), math.log((y.mean() + 1e-9) / (1 - y.mean() + 1e-9)))
    bounds = [(0.0, None)] * x.shape[1] + [(None, None)]
    out = minimize(loss, start, jac=True, method="L-BFGS-B", bounds=bounds)
    return out.x[:-1], float(out.x[-1])


def fit_combined(
    signals: Sequence[Mapping[str, float]],
    wrong: Sequence[int],
    *,
    folds: int = 5,
    seed: int = 0,
) -> CombinedScore:
    """Fit a :class:`CombinedScore` on answers' signals and wrong-answer labels.

    Raises:
        ConfigurationError: Too few answers, or only one class among them.
    """
    from sklearn.model_selection import StratifiedKFold

    y = np.asarray(wrong, dtype=np.float64)
    raw = np.array([[s[name] for name in FEATURES] for s in signals], dtype=np.float64)
    counts = int(y.sum()), int(len(y) - y.sum())
    if min(counts) < folds:
        msg = (
            f"a combined score needs at least {folds} wrong and {folds} right answers to "
            f"fit; got {counts[0]} wrong and {counts[1]} right"
        )
        raise ConfigurationError(msg)
    mean, scale = raw.mean(axis=0), raw.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    x = (raw - mean) / scale
    splits = list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y))

    def held_out_loss(strength: float) -> float:
        total = 0.0
        for train, test in splits:
            w, b = _fit(x[train], y[train], strength)
            z = x[test] @ w + b
            total += float(np.sum(np.logaddexp(0.0, z) - y[test] * z))
        return total / len(y)

    strength = min(STRENGTHS, key=held_out_loss)
    weights, intercept = _fit(x, y, strength)
    return CombinedScore(
        mean=tuple(map(float, mean)), scale=tuple(map(float, scale)),
        weights=tuple(float(max(w, 0.0)) for w in weights), intercept=intercept,
        strength=strength, n_fit=len(y),
    )  # fmt: skip
