"""The decoding loops' grouping of prompts (``_decoding``): no model."""

from __future__ import annotations

from esi_guard.backends.llamacpp._decoding import groups


def test_prompts_are_stepped_together_in_order_within_the_sequence_and_cell_limits() -> None:
    assert groups([10, 20, 30], most=16, cells=100) == [[0, 1, 2]]
    assert groups([10, 20, 30], most=2, cells=100) == [[0, 1], [2]]
    assert groups([60, 30, 20, 50], most=16, cells=100) == [[0, 1], [2, 3]]
    assert groups([150, 10, 10], most=16, cells=100) == [[0], [1, 2]]  # too big: alone
    assert groups([], most=4, cells=100) == []
