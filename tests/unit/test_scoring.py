"""The ESI estimator against hand-computed values and its defining properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from esi_guard.exceptions import ScoringError
from esi_guard.scoring import (
    DISTANCES,
    TopK,
    esi_score,
    fill_value,
    truncated_entropy,
    union_distributions,
)


def softmax(values: list[float]) -> list[float]:
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


def topk(ids: list[list[int]], values: list[list[float]]) -> TopK:
    return TopK(np.array(ids), np.array(values))


# Original keeps tokens {1, 2}; the variant keeps {2, 3}. Union {1, 2, 3}.
P_IDS, P_VALS = [1, 2], [2.0, 1.0]
Q_IDS, Q_VALS = [2, 3], [3.0, 1.0]
# Paper's rule (positive minimum logit): a missing token gets min / 10.
P_UNION = softmax([2.0, 1.0, 1.0 / 10])  # tokens 1, 2, 3 (3 missing from p)
Q_UNION = softmax([1.0 / 10, 3.0, 1.0])  # tokens 1, 2, 3 (1 missing from q)


def union_pair() -> tuple[list[float], list[float]]:
    log_p, log_q = union_distributions(
        np.array(P_IDS), np.array(P_VALS), np.array(Q_IDS), np.array(Q_VALS)
    )
    p = np.exp(log_p)
    q = np.exp(log_q)
    # Slots: p's tokens (1, 2), then q's tokens (2 dropped: p has it, 3 kept).
    return [p[0], p[1], p[3]], [q[0], q[1], q[3]]


def test_union_uses_the_papers_fill_rule_for_positive_logits() -> None:
    p, q = union_pair()
    assert p == pytest.approx(P_UNION, abs=1e-12)
    assert q == pytest.approx(Q_UNION, abs=1e-12)


def test_duplicate_slot_carries_no_mass() -> None:
    log_p, log_q = union_distributions(
        np.array(P_IDS), np.array(P_VALS), np.array(Q_IDS), np.array(Q_VALS)
    )
    assert np.exp(log_p[2]) == 0.0
    assert np.exp(log_q[2]) == 0.0
    assert np.exp(log_p).sum() == pytest.approx(1.0)
    assert np.exp(log_q).sum() == pytest.approx(1.0)


def hand_distance(name: str, p: list[float], q: list[float]) -> float:
    if name == "hellinger":
        return math.sqrt(hand_distance("squared_hellinger", p, q))
    if name == "squared_hellinger":
        return 0.5 * sum((math.sqrt(a) - math.sqrt(b)) ** 2 for a, b in zip(p, q, strict=True))
    if name == "kl":  # KL(original || variant), the paper's Appendix B
        return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    return -math.log(sum(math.sqrt(a * b) for a, b in zip(p, q, strict=True)))


@pytest.mark.parametrize("name", sorted(DISTANCES))
def test_each_distance_matches_its_formula(name: str) -> None:
    log_p, log_q = union_distributions(
        np.array(P_IDS), np.array(P_VALS), np.array(Q_IDS), np.array(Q_VALS)
    )
    got = float(DISTANCES[name](log_p, log_q))
    assert got == pytest.approx(hand_distance(name, P_UNION, Q_UNION), rel=1e-10)
    assert got > 0.0


def test_fill_rule_for_logits_negative_minimum_and_logprobs() -> None:
    valid = np.ones(3, dtype=bool)
    assert fill_value(np.array([5.0, 3.0, 2.0]), valid, "logits") == pytest.approx(0.2)
    assert fill_value(np.array([5.0, 3.0, -2.0]), valid, "logits") == pytest.approx(
        -2.0 - math.log(10)
    )
    assert fill_value(np.array([-0.1, -1.0, -3.0]), valid, "logprobs") == pytest.approx(
        -3.0 - math.log(10)
    )


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ([5.0, 3.0, 0.5], "logits"),
        ([0.4, -1.0, -7.5], "logits"),
        ([-0.01, -2.0, -9.0], "logprobs"),
        ([0.0, 0.0, 0.0], "logits"),
    ],
)
def test_missing_tokens_stay_below_every_kept_token(values: list[float], kind: str) -> None:
    array = np.array(values)
    assert fill_value(array, np.ones(3, dtype=bool), kind) < array.min()  # type: ignore[arg-type]


def test_logprob_fill_is_shift_invariant() -> None:
    """Logprobs are logits minus a constant: both must give the same distributions."""
    logits_p = np.array([-1.0, -2.0, -4.0])
    logits_q = np.array([-1.5, -1.0, -3.0])
    ids_p, ids_q = np.array([1, 2, 3]), np.array([2, 4, 1])
    shift_p, shift_q = 7.3, -2.1
    a = union_distributions(ids_p, logits_p, ids_q, logits_q, "logprobs")
    b = union_distributions(ids_p, logits_p - shift_p, ids_q, logits_q - shift_q, "logprobs")
    np.testing.assert_allclose(np.exp(a[0]), np.exp(b[0]), atol=1e-12)
    np.testing.assert_allclose(np.exp(a[1]), np.exp(b[1]), atol=1e-12)


def test_entropy_weight_is_over_the_original_topk_alone() -> None:
    probs = softmax(P_VALS)
    expected = -sum(p * math.log(p) for p in probs)
    assert truncated_entropy(topk([P_IDS], [P_VALS]))[0] == pytest.approx(expected)


def test_esi_score_by_hand_two_positions_two_variants() -> None:
    original = topk([P_IDS, [7, 8]], [P_VALS, [4.0, 4.0]])
    same = topk([P_IDS, [7, 8]], [P_VALS, [4.0, 4.0]])
    moved = topk([Q_IDS, [8, 7]], [Q_VALS, [4.0, 4.0]])
    result = esi_score(original, [same, moved])
    alpha0 = -sum(p * math.log(p) for p in softmax(P_VALS))
    alpha1 = math.log(2)
    d_moved0 = hand_distance("hellinger", P_UNION, Q_UNION)
    # Position 1: same tokens, same values in another order -> distance 0.
    expected_tokens = [alpha0 * (0.0 + d_moved0) / 2, alpha1 * 0.0]
    assert result.token_scores == pytest.approx(expected_tokens, abs=1e-12)
    assert result.score == pytest.approx(sum(expected_tokens) / 2, abs=1e-12)
    assert result.distances.shape == (2, 2)


def test_ragged_topk_padding_is_ignored() -> None:
    original = topk([[1, 2, -1]], [[2.0, 1.0, 0.0]])
    variant = topk([[2, 3, -1]], [[3.0, 1.0, 99.0]])
    padded = esi_score(original, [variant]).score
    plain = esi_score(topk([P_IDS], [P_VALS]), [topk([Q_IDS], [Q_VALS])]).score
    assert padded == pytest.approx(plain, abs=1e-12)


@pytest.mark.parametrize(
    ("original", "variants", "message"),
    [
        (TopK(np.zeros((0, 2), dtype=int), np.zeros((0, 2))), [], "no tokens"),
        (topk([[1, 2]], [[1.0, 0.5]]), [], "at least one variant"),
        (topk([[1, 2]], [[1.0, 0.5]]), [topk([[1, 2], [1, 2]], [[1.0, 0.5]] * 2)], "positions"),
        (topk([[1, 2]], [[1.0, float("nan")]]), [topk([[1, 2]], [[1.0, 0.5]])], "NaN"),
        (topk([[-1, -1]], [[1.0, 0.5]]), [topk([[1, 2]], [[1.0, 0.5]])], "no kept token"),
    ],
)
def test_unscorable_inputs_raise_a_clear_error(
    original: TopK, variants: list[TopK], message: str
) -> None:
    with pytest.raises(ScoringError, match=message):
        esi_score(original, variants)


def test_unknown_distance_is_named() -> None:
    with pytest.raises(ScoringError, match="'cosine'"):
        esi_score(topk([[1]], [[1.0]]), [topk([[1]], [[1.0]])], distance="cosine")  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------

finite = st.floats(min_value=-50, max_value=50, allow_nan=False)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    k = draw(st.integers(1, 6))
    ids_p = draw(st.lists(st.integers(0, 12), min_size=k, max_size=k, unique=True))
    ids_q = draw(st.lists(st.integers(0, 12), min_size=k, max_size=k, unique=True))
    vals_p = draw(st.lists(finite, min_size=k, max_size=k))
    vals_q = draw(st.lists(finite, min_size=k, max_size=k))
    return np.array(ids_p), np.array(vals_p), np.array(ids_q), np.array(vals_q)


@settings(max_examples=200, deadline=None)
@given(pairs(), st.sampled_from(["logits", "logprobs"]))
def test_distances_are_bounded_finite_and_symmetric_where_they_should_be(
    pair: tuple[np.ndarray, ...], kind: str
) -> None:
    ids_p, vals_p, ids_q, vals_q = pair
    log_p, log_q = union_distributions(ids_p, vals_p, ids_q, vals_q, kind)  # type: ignore[arg-type]
    # The same union built from the other side: q's tokens first, p's after.
    back_q, back_p = union_distributions(ids_q, vals_q, ids_p, vals_p, kind)  # type: ignore[arg-type]
    for name, fn in DISTANCES.items():
        value = float(fn(log_p, log_q))
        assert math.isfinite(value) and value >= 0.0, name
        assert float(fn(back_p, back_q)) == pytest.approx(value, abs=1e-9), name
        if name != "kl":
            assert float(fn(log_q, log_p)) == pytest.approx(value, abs=1e-9), name
    assert float(DISTANCES["hellinger"](log_p, log_q)) <= 1.0


@settings(max_examples=100, deadline=None)
@given(pairs())
def test_identical_distributions_score_zero(pair: tuple[np.ndarray, ...]) -> None:
    ids, vals, _, _ = pair
    original = TopK(ids[None], vals[None])
    result = esi_score(original, [original, original])
    assert result.score == pytest.approx(0.0, abs=1e-7)
    for name in DISTANCES:
        assert esi_score(original, [original], distance=name).score == pytest.approx(0.0, abs=1e-7)  # type: ignore[arg-type]


def test_unobserved_positions_score_the_bound_and_their_rows_are_ignored() -> None:
    original = topk([[1, 2], [3, 4], [5, 6]], [[2.0, 1.0], [1.5, 0.5], [3.0, 0.1]])
    moved = topk([[1, 2], [4, 3], [-1, -1]], [[1.0, 2.0], [2.0, 0.5], [0.0, 0.0]])
    full = esi_score(original, [moved, original], kind="logprobs", observed=[2, 3])
    assert full.distances[0, 2] == 1.0  # past the divergence: the Hellinger bound
    assert 0 < full.distances[0, 1] < 1  # measured
    assert np.allclose(full.distances[1], 0.0)
    whole = topk([[1, 2], [4, 3], [7, 8]], [[1.0, 2.0], [2.0, 0.5], [1.0, 0.0]])
    exact = esi_score(original, [whole, original], kind="logprobs", observed=[3, 3])
    np.testing.assert_allclose(exact.distances[:, :2], full.distances[:, :2])
    none = esi_score(original, [moved], kind="logprobs", observed=[0])
    assert np.all(none.distances == 1.0)
    assert none.score == pytest.approx(float(truncated_entropy(original).mean()))


def test_unobserved_positions_need_a_bounded_distance_and_valid_counts() -> None:
    original = topk([[1, 2]], [[2.0, 1.0]])
    with pytest.raises(ScoringError, match="upper bound"):
        esi_score(original, [original], distance="kl", observed=[0])
    with pytest.raises(ScoringError, match="observed"):
        esi_score(original, [original], observed=[0, 1])
    with pytest.raises(ScoringError, match="observed"):
        esi_score(original, [original], observed=[2])
    # Fully observed: any distance works.
    assert esi_score(original, [original], distance="kl", observed=[1]).score == 0.0


def test_head_keeps_the_first_k_columns_of_sorted_rows() -> None:
    topk = TopK(np.array([[7, 3, 5], [1, 2, 9]]), np.array([[3.0, 2.0, 1.0], [0.5, 0.1, -2.0]]))
    top2 = topk.head(2)
    assert top2.ids.tolist() == [[7, 3], [1, 2]]
    assert top2.values.tolist() == [[3.0, 2.0], [0.5, 0.1]]


def _expanded(ids: np.ndarray, values: np.ndarray, support: list[int]) -> np.ndarray:
    """A row's truncated distribution on ``support``, missing tokens at the fill value."""
    fill = values.min() / 10 if values.min() > 0 else values.min() - math.log(10)
    own = dict(zip(ids.tolist(), values.tolist(), strict=True))
    full = np.array([own.get(token, fill) for token in support])
    return np.exp(full - full.max()) / np.exp(full - full.max()).sum()


@pytest.mark.parametrize("distance", sorted(DISTANCES))
def test_support_all_compares_on_every_token_of_the_answer(distance: str) -> None:
    rng = np.random.default_rng(7)
    original = TopK(np.tile(np.arange(5), (3, 1)), rng.normal(3, 1, (3, 5)))
    variants = [TopK(np.stack([rng.choice(40, 5, replace=False) for _ in range(3)]),
                     rng.normal(3, 1, (3, 5))) for _ in range(4)]  # fmt: skip
    support = sorted(set(original.ids.ravel()) | {i for v in variants for i in v.ids.ravel()})
    by_hand = []
    for v in variants:
        row = []
        for t in range(3):
            p = _expanded(original.ids[t], original.values[t], support)
            q = _expanded(v.ids[t], v.values[t], support)
            row.append(hand_distance(distance, p.tolist(), q.tolist()))
        by_hand.append(row)
    got = esi_score(original, variants, distance=distance, support="all")  # type: ignore[arg-type]
    assert got.distances == pytest.approx(np.array(by_hand), rel=1e-9)
    pair = esi_score(original, variants, distance=distance)  # type: ignore[arg-type]
    assert got.score != pytest.approx(pair.score)  # the other tokens do count


def test_support_all_equals_pair_when_every_distribution_keeps_the_same_tokens() -> None:
    ids = np.tile(np.arange(6), (2, 1))
    original = TopK(ids, np.array([[5.0, 4, 3, 2, 1, 0.5]] * 2))
    variants = [TopK(ids, np.array([[4.0, 5, 3, 2, 1, 0.5]] * 2))]
    pair = esi_score(original, variants).score
    assert esi_score(original, variants, support="all").score == pytest.approx(pair, rel=1e-12)
    with pytest.raises(ScoringError, match="unknown support"):
        esi_score(original, variants, support="most")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_shared_tokens_found_by_sorting_are_those_every_pair_compared_finds(
    data: st.DataObject,
) -> None:
    """Padding anywhere, broadcast rows, a token held twice (then the pairwise way)."""
    from esi_guard.scoring import _matches, _matches_pairwise

    k = data.draw(st.integers(1, 8))
    rows = data.draw(st.integers(1, 4))
    token = st.integers(-1, 12)
    p_ids = np.array(data.draw(st.lists(st.lists(token, min_size=k, max_size=k),
                                        min_size=rows, max_size=rows)))  # fmt: skip
    q_ids = np.array(data.draw(st.lists(st.lists(token, min_size=k, max_size=k),
                                        min_size=rows, max_size=rows)))  # fmt: skip
    if data.draw(st.booleans()):  # top-k sets: each token once a side
        p_ids = np.array(
            [list(dict.fromkeys(r)) + [-1] * (k - len(set(r))) for r in p_ids.tolist()]
        )
        q_ids = np.array(
            [list(dict.fromkeys(r)) + [-1] * (k - len(set(r))) for r in q_ids.tolist()]
        )
    p_ids, q_ids = np.broadcast_arrays(p_ids[None], np.stack([q_ids, q_ids[::-1]]))
    sorted_way = _matches(p_ids, p_ids >= 0, q_ids, q_ids >= 0)
    pairwise = _matches_pairwise(p_ids, p_ids >= 0, q_ids, q_ids >= 0)
    slot, found, q_found = sorted_way
    assert np.array_equal(found, pairwise[1]) and np.array_equal(q_found, pairwise[2])
    assert np.array_equal(np.where(found, slot, 0), np.where(pairwise[1], pairwise[0], 0))
