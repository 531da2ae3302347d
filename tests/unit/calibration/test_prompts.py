"""The prompts a calibration run renders its questions with."""

from __future__ import annotations

import pytest

from esi_guard import InputError
from esi_guard.calibration.data import Example
from esi_guard.calibration.prompts import run_prompts


def test_passage_and_closed_book_data_are_not_mixed() -> None:
    mixed = [Example("q", ("a",), context="passage"), Example("r", ("b",))]
    with pytest.raises(InputError, match="mixes"):
        run_prompts(mixed, None, None, None)
