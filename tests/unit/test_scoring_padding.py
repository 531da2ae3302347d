"""Padded top-k entries never reach the score, whatever their value (hand-computed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esi_guard.scoring import TopK, esi_score, union_distributions


def _hand_score() -> float:
    """p = softmax(2, 1), q = softmax(1, 2) on the same two tokens."""
    a = 1 / (1 + math.e)  # the smaller probability
    b = 1 - a
    hellinger = math.sqrt(0.5 * 2 * (math.sqrt(b) - math.sqrt(a)) ** 2)
    entropy = -(a * math.log(a) + b * math.log(b))
    return entropy * hellinger  # ~0.19587


@pytest.mark.parametrize("pad", [np.nan, np.inf, -np.inf, 0.0])
@pytest.mark.parametrize("support", ["pair", "all"])
@pytest.mark.parametrize("side", ["original", "variant"])
def test_padding_values_never_reach_the_score(pad: float, support: str, side: str) -> None:
    # "Top-k arrays may be ragged: pad them with id -1; padded entries are ignored."
    p = TopK(np.array([[1, 2]]), np.array([[2.0, 1.0]]))
    q = TopK(np.array([[1, 2]]), np.array([[1.0, 2.0]]))
    padded = (np.array([[1, 2, -1]]), np.array([[2.0, 1.0, pad]]))
    if side == "original":
        p = TopK(*padded)
    else:
        q = TopK(padded[0], np.array([[1.0, 2.0, pad]]))
    score = esi_score(p, [q], support=support)  # type: ignore[arg-type]
    assert math.isfinite(score.score)
    assert score.score == pytest.approx(_hand_score(), abs=1e-12)


def test_union_distributions_ignores_padding_values() -> None:
    log_p, log_q = union_distributions(
        np.array([[1, -1]]), np.array([[0.0, np.nan]]), np.array([[1, -1]]), np.array([[0.0, 5.0]])
    )
    assert np.allclose(np.exp(log_p).sum(-1), 1.0) and np.allclose(np.exp(log_q).sum(-1), 1.0)
    assert np.exp(log_p)[0, 0] == 1.0 and np.exp(log_q)[0, 0] == 1.0
