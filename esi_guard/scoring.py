"""The ESI estimator: pure, vectorised math over top-k distributions (no model, HTTP, LangChain).

For an answer of ``N`` tokens (end-of-sequence excluded), the original prompt's top-k at each
answer position ``t`` and each of ``L`` intervened prompts' top-k there under teacher forcing give
``ESI = 1 / (L * N) * sum_l sum_t alpha_t * D(p_t, q_{l,t})``. ``p_t`` and ``q_{l,t}`` are
truncated distributions, a softmax over the kept values on the union of the two top-k sets
(``support="pair"``) or of all the answer's (``"all"``, the authors' code), a token one side lacks
taking its :func:`fill_value`; ``alpha_t`` is the entropy (nats) of the original's alone; ``D`` is
one of :data:`DISTANCES`. Ragged top-k arrays are padded with id ``-1``, which is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray

from esi_guard.exceptions import ScoringError

__all__ = [
    "DISTANCES",
    "DISTANCE_BOUNDS",
    "Distance",
    "ESIScore",
    "Support",
    "TopK",
    "ValueKind",
    "esi_score",
    "fill_value",
    "token_logprobs",
    "truncated_entropy",
    "union_distributions",
]

Distance = Literal["hellinger", "squared_hellinger", "kl", "bhattacharyya"]
"""Names of the distance functions ESI can use."""

Support = Literal["pair", "all"]
"""What two truncated distributions are compared on: the union of their own top-k sets,
or the union over all the distributions of an answer."""

ValueKind = Literal["logits", "logprobs"]
"""What top-k values are: raw model logits (white-box) or log-probabilities (APIs)."""

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

_LN10 = math.log(10.0)


def _f64(array: Any) -> FloatArray:
    return np.asarray(array, dtype=np.float64)


@dataclass(frozen=True)
class TopK:
    """Top-k token ids and values at each answer position (row ``t``); ids ``< 0`` mark padding."""

    ids: IntArray
    """Token ids, shape ``(N, k)``."""
    values: FloatArray
    """Logits or logprobs of those tokens, shape ``(N, k)``."""

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids, dtype=np.int64)
        values = np.asarray(self.values, dtype=np.float64)
        if ids.ndim != 2 or ids.shape != values.shape:
            msg = (
                "TopK needs ids and values of the same 2-D shape (positions, k); "
                f"got ids {ids.shape} and values {values.shape}"
            )
            raise ScoringError(msg)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "values", values)

    @property
    def n_positions(self) -> int:
        """Number of answer positions ``N``."""
        return int(self.ids.shape[0])

    @property
    def finite(self) -> bool:
        """Whether every kept (not padding) value is finite."""
        return bool(np.isfinite(self.values[self.ids >= 0]).all())

    def head(self, k: int) -> TopK:
        """The top-``k`` (the first ``k`` columns: every backend sorts rows highest first)."""
        return TopK(self.ids[:, :k], self.values[:, :k])


@dataclass(frozen=True)
class ESIScore:
    """The ESI estimate and its parts."""

    score: float
    """The ESI score: mean over variants and tokens of ``alpha_t * D``."""
    token_scores: FloatArray
    """Per-token contributions, shape ``(N,)``: mean over variants of ``alpha_t * D``."""
    alphas: FloatArray
    """Entropy weights ``alpha_t`` (nats), shape ``(N,)``."""
    distances: FloatArray
    """Unweighted distances ``D(p_t, q_{l,t})``, shape ``(L, N)``."""

    @property
    def variant_scores(self) -> FloatArray:
        """Per-variant mean ``alpha_t * D`` over tokens, shape ``(L,)``; ``score`` is their mean."""
        scores: FloatArray = (self.alphas[None, :] * self.distances).mean(axis=1)
        return scores


def fill_value(values: FloatArray, valid: NDArray[np.bool_], kind: ValueKind) -> FloatArray:
    """Value given to a token missing from one side's top-k, strictly below every kept one.

    ``m / 10`` for logits whose least kept value ``m`` is positive (the paper's rule), else
    ``m - ln 10``: a tenth of the least kept token's mass, shift-invariant, so logits and the
    logprobs derived from them give the same truncated distributions.

    Args:
        values: Kept values, shape ``(..., k)``.
        valid: Which entries are kept (not padding), same shape.
        kind: What the values are.

    Returns:
        The fill value for each row, shape ``(...)``.
    """
    minimum = np.where(valid, values, np.inf).min(axis=-1)
    shifted = minimum - _LN10
    if kind == "logprobs":
        return _f64(shifted)
    return _f64(np.where(minimum > 0, minimum / 10.0, shifted))


def _log_softmax(values: FloatArray) -> FloatArray:
    """Log-softmax along the last axis; ``-inf`` entries get probability 0."""
    top = values.max(axis=-1, keepdims=True)
    shifted = values - top
    with np.errstate(divide="ignore"):
        return _f64(shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))


def truncated_entropy(topk: TopK) -> FloatArray:
    """Entropy (nats) of each position's truncated distribution over its own top-k.

    Returns:
        Shape ``(N,)``: the ``alpha_t`` weights of ESI.
    """
    valid = topk.ids >= 0
    logp = _log_softmax(np.where(valid, topk.values, -np.inf))
    safe = np.where(np.isfinite(logp), logp, 0.0)
    return _f64(-(np.exp(safe) * safe * np.isfinite(logp)).sum(axis=-1))


def token_logprobs(original: TopK, answer_ids: Sequence[int], kind: ValueKind) -> np.ndarray:
    """Each answer token's log-probability over its top-k (a missing token: its fill), ``(N,)``."""
    valid = original.ids >= 0
    values = np.where(valid, original.values, -np.inf)
    fill = fill_value(original.values, valid, kind)
    ids = np.asarray(answer_ids)[:, None]
    found = (original.ids == ids) & valid
    value = np.where(found.any(axis=1), np.where(found, values, -np.inf).max(axis=1), fill)
    norm = np.logaddexp.reduce(values, axis=1)
    norm = np.where(found.any(axis=1), norm, np.logaddexp(norm, fill))
    return np.asarray(value - norm, dtype=np.float64)


def union_distributions(
    p_ids: IntArray,
    p_values: FloatArray,
    q_ids: IntArray,
    q_values: FloatArray,
    kind: ValueKind = "logits",
    support_size: int | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Log-probabilities of two truncated distributions on the union of their supports.

    Inputs broadcast to ``(..., k)``; the union is ``2k`` slots, ``p``'s tokens then those only
    ``q`` has (the rest ``-inf``). ``support_size`` (``support="all"``) adds a slot for the ``c``
    support tokens neither side kept, at ``c`` times each side's fill mass: every distance sums
    terms that scale with ``c`` for equal pairs, so one slot scores as ``c`` would.

    Returns:
        ``(log_p, log_q)``, each of shape ``(..., 2k)``, or ``(..., 2k + 1)``.
    """
    p_ids, q_ids = np.broadcast_arrays(p_ids, q_ids)
    p_valid, q_valid = p_ids >= 0, q_ids >= 0
    # Padding's values are anything (NaN, inf): 0 here, where the -inf masks below add to them.
    p_values = np.where(p_valid, p_values, 0.0)
    q_values = np.where(q_valid, q_values, 0.0)
    p_in_q, p_found, q_found = _matches(p_ids, p_valid, q_ids, q_valid)

    p_fill = fill_value(p_values, p_valid, kind)[..., None]
    q_fill = fill_value(q_values, q_valid, kind)[..., None]

    # q's value on each of p's tokens: its own where it has the token, else its fill.
    q_on_p = np.take_along_axis(q_values, p_in_q, axis=-1)
    q_first = np.where(p_found, q_on_p, q_fill)
    # q's own tokens that p lacks get p's fill; the rest of q's slots are dropped.
    q_only = q_valid & ~q_found

    first = np.where(p_valid, 0.0, -np.inf)
    second = np.where(q_only, 0.0, -np.inf)
    p_parts, q_parts = [p_values + first, p_fill + second], [q_first + first, q_values + second]
    if support_size is not None:
        rest = support_size - p_valid.sum(axis=-1) - q_only.sum(axis=-1)
        with np.errstate(divide="ignore"):
            log_rest = np.log(np.maximum(rest, 0))[..., None]  # -inf: nothing left out
        p_parts.append(p_fill + log_rest)
        q_parts.append(q_fill + log_rest)
    log_p = _log_softmax(np.concatenate(p_parts, axis=-1))
    log_q = _log_softmax(np.concatenate(q_parts, axis=-1))
    return log_p, log_q


def _matches(
    p_ids: IntArray, p_valid: np.ndarray, q_ids: IntArray, q_valid: np.ndarray
) -> tuple[IntArray, np.ndarray, np.ndarray]:
    """Per row, by sorting: each ``p`` slot's ``q`` slot (0: none), and which tokens both hold."""
    shape = p_ids.shape
    k = shape[-1]
    slots = np.arange(2 * k)
    both = np.concatenate([p_ids, q_ids], axis=-1).astype(np.int64).reshape(-1, 2 * k)
    valid = np.concatenate([p_valid, q_valid], axis=-1).reshape(-1, 2 * k)
    # Padding gets a key of its own (never equal to another); p's slot sorts before q's.
    keys = np.where(valid, both, -2 - slots) * 2 + (slots >= k)
    order = np.argsort(keys, axis=-1)
    ranked = np.take_along_axis(keys, order, axis=-1) // 2
    pair = ranked[:, 1:] == ranked[:, :-1]
    first, second = order[:, :-1], order[:, 1:]
    if (pair & ((first >= k) | (second < k))).any():
        return _matches_pairwise(p_ids, p_valid, q_ids, q_valid)
    rows, at = np.nonzero(pair)
    p_slot, q_slot = first[rows, at], second[rows, at] - k
    p_in_q = np.zeros((len(keys), k), dtype=np.int64)
    p_found = np.zeros((len(keys), k), dtype=bool)
    q_found = np.zeros((len(keys), k), dtype=bool)
    p_in_q[rows, p_slot] = q_slot
    p_found[rows, p_slot] = True
    q_found[rows, q_slot] = True
    return p_in_q.reshape(shape), p_found.reshape(shape), q_found.reshape(shape)


def _matches_pairwise(
    p_ids: IntArray, p_valid: np.ndarray, q_ids: IntArray, q_valid: np.ndarray
) -> tuple[IntArray, np.ndarray, np.ndarray]:
    """:func:`_matches` by comparing every pair (a token held twice: its first slot)."""
    same = (p_ids[..., :, None] == q_ids[..., None, :]) & p_valid[..., :, None]
    same &= q_valid[..., None, :]
    return same.argmax(axis=-1), same.any(axis=-1), same.any(axis=-2)


def _bhattacharyya_coefficient(log_p: FloatArray, log_q: FloatArray) -> FloatArray:
    return _f64(np.exp(0.5 * (log_p + log_q)).sum(axis=-1))


def _squared_hellinger(log_p: FloatArray, log_q: FloatArray) -> FloatArray:
    diff = np.exp(0.5 * log_p) - np.exp(0.5 * log_q)
    return _f64(np.clip(0.5 * (diff * diff).sum(axis=-1), 0.0, 1.0))


def _hellinger(log_p: FloatArray, log_q: FloatArray) -> FloatArray:
    return _f64(np.sqrt(_squared_hellinger(log_p, log_q)))


def _kl(log_p: FloatArray, log_q: FloatArray) -> FloatArray:
    """KL(p || q), the original against the variant, as the paper's Appendix B and code have it."""
    kept = np.isfinite(log_q) & np.isfinite(log_p)
    safe_q, safe_p = np.where(kept, log_q, 0.0), np.where(kept, log_p, 0.0)
    terms = np.where(kept, np.exp(safe_p) * (safe_p - safe_q), 0.0)
    return _f64(np.maximum(terms.sum(axis=-1), 0.0))


def _bhattacharyya(log_p: FloatArray, log_q: FloatArray) -> FloatArray:
    coefficient = np.clip(_bhattacharyya_coefficient(log_p, log_q), 1e-300, 1.0)
    return _f64(-np.log(coefficient))


DISTANCES: dict[str, Callable[[FloatArray, FloatArray], FloatArray]] = {
    "hellinger": _hellinger,
    "squared_hellinger": _squared_hellinger,
    "kl": _kl,
    "bhattacharyya": _bhattacharyya,
}
"""Distance functions on log-probabilities ``(log_p original, log_q variant)``.

``hellinger`` (default) and ``squared_hellinger`` (in [0, 1], symmetric), ``kl`` (KL(original ||
variant), >= 0, the paper's direction), ``bhattacharyya`` (>= 0, symmetric).
"""

DISTANCE_BOUNDS: dict[str, float] = {"hellinger": 1.0, "squared_hellinger": 1.0}
"""The bounded distances' maximum: what an unobserved position scores (:func:`esi_score`)."""


def _check(topk: TopK, name: str, n_positions: int, n_observed: int | None = None) -> None:
    if topk.n_positions != n_positions:
        msg = (
            f"{name} covers {topk.n_positions} answer positions, expected {n_positions} "
            "(one per answer token)"
        )
        raise ScoringError(msg)
    valid = topk.ids[:n_observed] >= 0
    if not valid.any(axis=-1).all():
        msg = f"{name} has an answer position with no kept token"
        raise ScoringError(msg)
    if not np.isfinite(topk.values[:n_observed][valid]).all():
        msg = f"{name} holds NaN or infinite values among its kept tokens"
        raise ScoringError(msg)


def _pad_to(topk: TopK, k: int) -> tuple[IntArray, FloatArray]:
    extra = k - topk.ids.shape[1]
    if extra == 0:
        return topk.ids, topk.values
    ids = np.pad(topk.ids, ((0, 0), (0, extra)), constant_values=-1)
    values = np.pad(topk.values, ((0, 0), (0, extra)), constant_values=0.0)
    return ids, values


def esi_score(
    original: TopK,
    variants: Sequence[TopK],
    *,
    distance: Distance = "hellinger",
    kind: ValueKind = "logits",
    observed: Sequence[int] | None = None,
    support: Support = "pair",
) -> ESIScore:
    """Compute the ESI score of one answer.

    Args:
        original: Top-k at each answer position under the original prompt.
        variants: Per intervened prompt (L of them), the top-k at the same positions, answer forced.
        distance: Name of the distance function, one of :data:`DISTANCES`.
        kind: Whether values are raw logits or logprobs (decides the fill rule).
        observed: Per variant, how many leading positions an approximate backend saw exactly
            (``None``: all); the rest, where the answer left the original's, score the distance's
            bound (:data:`DISTANCE_BOUNDS`; an unbounded one is refused), their rows ignored.
        support: Compare each pair on ``"pair"``, the union of the two top-k sets, or ``"all"``,
            the union over every distribution of the answer (the authors' code).

    Returns:
        The score, the per-token contributions, the weights and the raw distances.

    Raises:
        ScoringError: On an empty answer, no variants, mismatched positions or non-finite values.
    """
    if distance not in DISTANCES:
        msg = f"unknown distance {distance!r}; expected one of {sorted(DISTANCES)}"
        raise ScoringError(msg)
    if kind not in get_args(ValueKind):
        msg = f"unknown value kind {kind!r}; expected one of {get_args(ValueKind)}"
        raise ScoringError(msg)
    if support not in get_args(Support):
        msg = f"unknown support {support!r}; expected one of {get_args(Support)}"
        raise ScoringError(msg)
    n_positions = original.n_positions
    if n_positions == 0:
        msg = "the answer has no tokens to score"
        raise ScoringError(msg)
    if not variants:
        msg = "ESI needs at least one variant"
        raise ScoringError(msg)
    _check(original, "original top-k", n_positions)
    limits = _observed(observed, len(variants), n_positions, distance)
    for index, variant in enumerate(variants):
        _check(variant, f"variant {index} top-k", n_positions, limits[index])

    k = max(original.ids.shape[1], *(v.ids.shape[1] for v in variants))
    p_ids, p_values = _pad_to(original, k)
    padded = [_pad_to(v, k) for v in variants]
    q_ids = np.stack([ids for ids, _ in padded])
    q_values = np.stack([values for _, values in padded])
    for index, limit in enumerate(limits):
        if limit is not None:  # unobserved rows: anything, replaced before the math
            q_ids[index, limit:], q_values[index, limit:] = p_ids[limit:], p_values[limit:]

    size = None
    if support == "all":
        everything = np.concatenate([p_ids.ravel(), q_ids.ravel()])
        size = int(np.unique(everything[everything >= 0]).size)
    log_p, log_q = union_distributions(p_ids[None], p_values[None], q_ids, q_values, kind, size)
    distances = DISTANCES[distance](log_p, log_q)
    for index, limit in enumerate(limits):
        if limit is not None:
            distances[index, limit:] = DISTANCE_BOUNDS[distance]
    alphas = truncated_entropy(original)
    weighted = alphas[None, :] * distances
    token_scores = weighted.mean(axis=0)
    return ESIScore(
        score=float(weighted.mean()),
        token_scores=token_scores,
        alphas=alphas,
        distances=distances,
    )


def _observed(
    observed: Sequence[int] | None, n_variants: int, n_positions: int, distance: str
) -> list[int | None]:
    """Per variant, the first unobserved position, or ``None`` when all are observed."""
    if observed is None:
        return [None] * n_variants
    if len(observed) != n_variants:
        msg = f"observed has {len(observed)} entries for {n_variants} variants"
        raise ScoringError(msg)
    if any(not 0 <= count <= n_positions for count in observed):
        msg = f"observed counts must lie in [0, {n_positions}], got {list(observed)}"
        raise ScoringError(msg)
    limits = [int(count) if count < n_positions else None for count in observed]
    if any(limit is not None for limit in limits) and distance not in DISTANCE_BOUNDS:
        msg = (
            f"unobserved positions score the distance's upper bound, and {distance!r} has "
            f"none; use one of {sorted(DISTANCE_BOUNDS)} with an approximate backend"
        )
        raise ScoringError(msg)
    return limits
