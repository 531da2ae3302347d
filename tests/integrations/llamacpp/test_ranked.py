"""integrations/llamacpp/ranked.py: numpy's ranking gives the list Python's sort gives."""

from __future__ import annotations

import numpy as np
import pytest

from integrations.llamacpp.ranked import ranked, scores_zip


def python_ranking(scores: object) -> list[tuple[object, int]]:
    return sorted(zip(scores, range(len(scores)), strict=False), reverse=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["array", "list"])
def test_the_ranking_is_pythons_with_its_ties_and_types(kind: str) -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=5000).astype(np.float32)
    values[[3, 10, 4000]] = values[7]  # ties: the higher index first, as reversed tuples sort
    values[[20, 21]] = -np.inf
    scores = values if kind == "array" else values.tolist()
    expected = python_ranking(scores)
    got = ranked(scores_zip(scores, range(len(scores))), reverse=True)
    assert got == expected
    assert [type(v) for v, _ in got[:50]] == [type(v) for v, _ in expected[:50]]
    assert [type(i) for _, i in got[:50]] == [int] * 50
    ascending = ranked(scores_zip(scores, range(len(scores))))
    assert ascending == sorted(zip(scores, range(len(scores)), strict=False))


def test_every_other_zip_and_sort_is_the_builtin() -> None:
    pairs = scores_zip([3, 1], ["a", "b"])
    assert list(pairs) == [(3, "a"), (1, "b")]
    assert isinstance(scores_zip(np.ones((2, 2)), range(2)), zip)  # rows, not scores
    assert list(scores_zip([1, 2], range(3))) == [(1, 0), (2, 1)]
    with pytest.raises(ValueError):
        list(scores_zip([1, 2], range(3), strict=True))
    assert ranked([3, 1, 2], reverse=True) == [3, 2, 1]
    assert ranked(["b", "a"], key=str.upper) == ["a", "b"]
    ranked_zip = scores_zip([0.5, 0.25], range(2))
    assert ranked(ranked_zip, key=lambda pair: pair[1]) == [(0.5, 0), (0.25, 1)]
