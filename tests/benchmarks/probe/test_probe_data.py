"""What a collected probe run is read back as: the candidate states of a fitted score."""

from __future__ import annotations

from benchmarks.probe.collect import hidden_spec
from benchmarks.probe.data import window
from esi_guard.backends import FINAL, POSITIONS, HiddenSpec


def test_the_window_is_the_blocks_at_40_to_80_percent_depth_and_final() -> None:
    assert window(hidden_spec(30), "window").layers == (12, 15, 18, 21, 24, FINAL)
    assert window(hidden_spec(18), "window").layers == (9, 11, 13, 14, FINAL)
    assert window(hidden_spec(30), "prompt").positions == ("prompt_last",)
    assert window(hidden_spec(30), "final") == HiddenSpec((FINAL,), POSITIONS)
