"""Baseline uncertainty scores, by hand on small samples the tests build."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from benchmarks.baselines import (
    Sample,
    cluster_by_equivalence,
    lexical_similarity,
    ln_pe,
    mean_token_entropy,
    neg_log_likelihood,
    p_true,
    semantic_entropy,
    sentence_sar,
)
from esi_guard import ScoringError


def same_text(texts: Sequence[str]) -> np.ndarray:
    """Similarity 1 between equal texts (case-insensitive), else 0."""
    keys = [t.lower() for t in texts]
    return np.array([[float(a == b) for b in keys] for a in keys])


def test_likelihood_and_entropy_baselines_by_hand() -> None:
    assert neg_log_likelihood([-0.5, -1.0]) == 1.5
    uniform = np.zeros((3, 4))  # three positions, four equal logits
    assert mean_token_entropy(uniform) == pytest.approx(math.log(4))
    peaked = np.array([[0.0, -np.inf, -np.inf]])  # padding carries no mass
    assert mean_token_entropy(peaked) == pytest.approx(0.0)
    samples = [Sample("a", (-1.0, -3.0)), Sample("b", (-0.5,))]
    assert ln_pe(samples) == pytest.approx((2.0 + 0.5) / 2)


def test_clusters_are_bidirectional_and_greedy() -> None:
    sim = np.array([[1, 0.9, 0.2], [0.9, 1, 0.9], [0.2, 0.9, 1]])
    assert cluster_by_equivalence(sim, 0.8) == [0, 0, 1]  # 2 matches 1, but not 1's head
    one_way = np.array([[1.0, 0.9], [0.1, 1.0]])
    assert cluster_by_equivalence(one_way, 0.8) == [0, 1]


def test_semantic_entropy_weights_clusters_by_likelihood() -> None:
    agree = [Sample("Paris", (-0.1,)), Sample("paris", (-0.2,))]
    assert semantic_entropy(agree, same_text, 0.5) == pytest.approx(0.0)
    split = [Sample("Paris", (-1.0,)), Sample("Lyon", (-1.0,))]
    assert semantic_entropy(split, same_text, 0.5) == pytest.approx(math.log(2))
    lopsided = [Sample("Paris", (-0.1,)), Sample("Lyon", (-3.0,))]
    p = 1 / (1 + math.exp(-2.9))
    expected = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert semantic_entropy(lopsided, same_text, 0.5) == pytest.approx(expected)


def test_lexical_similarity_uses_rouge_l() -> None:
    same = [Sample("the cat sat", (-1.0,))] * 3
    assert lexical_similarity(same) == pytest.approx(0.0)
    # LCS("the cat sat", "the cat sat down") = 3: P = 3/4, R = 1, F = 6/7.
    pair = [Sample("the cat sat", (-1.0,)), Sample("the cat sat down", (-1.0,))]
    assert lexical_similarity(pair) == pytest.approx(1 - 6 / 7)
    with pytest.raises(ScoringError, match="at least two"):
        lexical_similarity(same[:1])


def test_p_true_and_sentence_sar() -> None:
    assert p_true(0.0, 0.0) == pytest.approx(0.5)
    assert p_true(math.log(0.9), math.log(0.1)) == pytest.approx(0.1)
    samples = [Sample("Paris", (math.log(0.5),)), Sample("paris", (math.log(0.25),)),
               Sample("Lyon", (math.log(0.25),))]  # fmt: skip
    t = 0.5
    expected = -np.mean([math.log(0.5 + 0.25 / t), math.log(0.25 + 0.5 / t), math.log(0.25)])
    assert sentence_sar(samples, same_text, temperature=t) == pytest.approx(expected)
    opposed = [Sample("yes", (math.log(0.5),)), Sample("no", (math.log(0.5),))]
    anti = lambda texts: np.array([[1.0, -0.3], [-0.3, 1.0]])  # noqa: E731
    assert sentence_sar(opposed, anti) == pytest.approx(-math.log(0.5))  # no NaN from < 0


def test_bad_samples_are_clear_errors() -> None:
    with pytest.raises(ScoringError, match="at least one sample"):
        ln_pe([])
    with pytest.raises(ScoringError, match="non-finite"):
        ln_pe([Sample("x", (float("nan"),))])
    with pytest.raises(ScoringError, match="at least one answer token"):
        neg_log_likelihood([])
    with pytest.raises(ScoringError, match="finite"):
        p_true(float("-inf"), 0.0)
