"""A combined, calibrated score: ESI and the free signals of the greedy answer -> P(wrong).

The guarded pass already holds the greedy answer's distributions, so its likelihood and entropies
cost nothing more. :class:`CombinedScore` maps :data:`SIGNALS` (:data:`FEATURES` by default) to
``p_wrong`` by a logistic model with weights >= 0 on standardised signals (``p_wrong`` never falls
as a signal rises), fitted by :func:`~esi_guard.calibration.combined_fit.fit_combined` and kept as
plain numbers in a threshold file (``esi-guard calibrate --score combined``). With hidden states
(``--features ...,hidden``) the residual stream behind the answer
(:class:`~esi_guard.backends.hidden.HiddenStates`) joins as a linear probe on PCA components,
folded into one weight vector over the raw states (:class:`HiddenProbe`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from esi_guard.backends.hidden import FINAL, POSITIONS, HiddenSpec, HiddenStates, Position
from esi_guard.exceptions import ConfigurationError, ScoringError
from esi_guard.scoring import TopK, ValueKind, token_logprobs, truncated_entropy

__all__ = [
    "FEATURES",
    "HIDDEN",
    "SIGNALS",
    "CombinedScore",
    "HiddenProbe",
    "answer_signals",
    "free_signals",
    "probe_window",
    "repetition",
    "token_logprobs",
]

FEATURES = ("esi", "nll", "entropy")
"""The signals a combined score uses by default, in order."""

SIGNALS = ("esi", "nll", "entropy", "max_nll", "repetition")
"""Every scalar signal a combined score can use."""

HIDDEN = "hidden"
"""The feature name of the hidden-state probe (``--features ...,hidden``)."""

DEPTHS = (0.4, 0.5, 0.6, 0.7, 0.8)
"""Where in the model's depth the probe's candidate layers sit (plus the final norm's)."""


def repetition(text: str) -> float:
    """The share of ``text``'s word pairs (lower-cased) that repeat an earlier pair.

    Near 1 for a degenerate loop; from the text, not the tokens, so the same on every tokenizer.
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
    logprobs: np.ndarray | None = None,
) -> dict[str, float]:
    """``nll``, ``entropy`` and ``max_nll`` of an answer from its original top-k (no model call).

    ``nll``: its tokens' summed negative log-probabilities over their top-k (:func:`token_logprobs`,
    reused if given as ``logprobs``), ``max_nll`` the largest; ``entropy``: the mean ``alpha_t``
    (``ESIScore.alphas``, reused if given as ``alphas``); with ``text``, :func:`repetition` too.
    """
    entropy = truncated_entropy(original) if alphas is None else alphas
    if logprobs is None:
        logprobs = token_logprobs(original, answer_ids, kind)
    values = logprobs.tolist()
    signals = {
        "nll": _neg_log_likelihood(values),
        "entropy": float(np.mean(entropy)),
        "max_nll": float(-min(values)) if values else 0.0,
    }
    if text is not None:
        signals["repetition"] = repetition(text)
    return signals


def answer_signals(
    topk: TopK | None, answer_ids: Sequence[int], kind: ValueKind, text: str
) -> dict[str, float] | None:
    """An answer's :func:`free_signals`; None without tokens or finite top-k (NaN reads certain)."""
    if topk is None or not answer_ids or not topk.finite:
        return None
    return free_signals(topk, answer_ids, kind, text=text)


def probe_window(hidden_layers: Sequence[int]) -> HiddenSpec:
    """What a probe's fit chooses from: blocks at :data:`DEPTHS`, the final norm, every position."""
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
    """The positions read (:data:`~esi_guard.backends.hidden.POSITIONS`)."""
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
    """``p_wrong = sigmoid(intercept + sum_i w_i * (signal_i - mean_i) / scale_i [+ hidden])``."""

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


def _neg_log_likelihood(token_logprobs: list[float]) -> float:
    """-log P(answer) from its tokens' log-probabilities."""
    if not token_logprobs:
        msg = "neg_log_likelihood needs at least one answer token"
        raise ScoringError(msg)
    return -float(sum(token_logprobs))
