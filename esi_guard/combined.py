"""A combined, calibrated score: ESI and the free signals of the greedy answer -> P(wrong).

The guarded pass already holds, beside ESI, the greedy answer's distributions: its
tokens' negative log-likelihood and the entropy of each position cost nothing more. A
:class:`CombinedScore` maps them to the probability that the answer is wrong with a
logistic model whose weights are all >= 0 on standardised signals, so ``p_wrong`` never
falls when a signal rises (monotone in each), fitted by
:func:`~esi_guard.calibration.combined_fit.fit_combined` with its L2 strength chosen by
stratified cross-validation. It is small enough to live in a threshold file as plain
numbers (no pickle): ``esi-guard calibrate --score combined``. This module is the score at
run time; the fitting lives in :mod:`esi_guard.calibration`.

Signals (:data:`SIGNALS`; :data:`FEATURES` is the default set): ``esi`` (the score),
``nll`` (the answer's negative log-probability, its tokens' summed, each normalised over
its position's top-k, as the benchmark's "NLL (greedy)"), ``entropy`` (mean entropy of
those truncated distributions, ESI's ``alpha_t``, as "mean token entropy") and
``max_nll`` (the largest of the tokens' negative log-probabilities: the answer's least
likely token) and ``repetition`` (the share of the answer's word pairs that repeat an
earlier pair: a small model's degenerate loops, :func:`repetition`).

**Hidden states** (``calibrate --features esi,nll,entropy,hidden``): the model's residual
stream at the positions behind the answer (:class:`~esi_guard.backends.hidden.HiddenStates`,
read from the answer's own forward passes) joins the signals as a *probe*: the states are
standardised and reduced by PCA, and the logistic model takes the components beside the
signals (signals' weights still >= 0; the components' free). Which layer, which positions,
how many components and the L2 strength are chosen by cross-validation on the fitting
answers. Standardising, PCA and the logistic model are all linear, so the fitted probe is
folded into one weight vector over the raw states (:class:`HiddenProbe`): ``p_wrong`` is
``sigmoid(intercept + w . z(signals) + v . states)``, plain numbers in the threshold file.
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
    logprobs: np.ndarray | None = None,
) -> dict[str, float]:
    """``nll``, ``entropy`` and ``max_nll`` of an answer from its original top-k (no model call).

    With the answer's ``text``, its :func:`repetition` too; with its tokens' ``logprobs``
    (:func:`token_logprobs`, where the caller has them) they are not computed again.

    ``nll`` is the negative log-likelihood of the answer's tokens, each
    normalised over its position's top-k (the benchmark's "NLL (greedy)"); a token missing
    from its top-k (a forced, non-greedy answer) gets the fill value ESI gives a missing
    token. ``entropy`` is the mean of ESI's ``alpha_t``: pass them (``ESIScore.alphas``)
    when they are at hand, else they are computed.
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
    """An answer's :func:`free_signals` from its own pass; None without tokens or finite top-k.

    A top-k holding NaN or infinite values gives none: its rows would read as certain.
    """
    if topk is None or not answer_ids or not topk.finite:
        return None
    return free_signals(topk, answer_ids, kind, text=text)


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


def _neg_log_likelihood(token_logprobs: list[float]) -> float:
    """-log P(answer) from its tokens' log-probabilities."""
    if not token_logprobs:
        msg = "neg_log_likelihood needs at least one answer token"
        raise ScoringError(msg)
    return -float(sum(token_logprobs))
