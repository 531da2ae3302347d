"""The threshold file: a round trip, a guard built from it, and the clear errors for a
file that does not match the guard or is missing or corrupt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from esi_guard import ConfigurationError, ESIGuard, FakeBackend, SkipOneChar, Typo
from esi_guard.calibration.file import ThresholdFile


def test_threshold_file_round_trip_and_guard(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "threshold.json"
    threshold_file().write(path)
    assert ThresholdFile.read(path) == threshold_file()
    guard = ESIGuard.from_calibration(path, backend=FakeBackend(), action="abstain")
    assert guard.threshold == 0.3 and guard.n_variants == 10 and guard.action == "abstain"
    assert guard.intervention == SkipOneChar()


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"model": "another-model"}, "model"),
        ({"top_k": 20}, "top_k"),
        ({"intervention": Typo()}, "intervention"),
        ({"n_variants": 5}, "n_variants"),
        ({"support": "all"}, "support"),
        ({"intervention": SkipOneChar(distinct=False)}, "intervention"),
    ],
)
def test_a_mismatched_threshold_file_is_refused(
    tmp_path: Path,
    kwargs: dict[str, Any],
    problem: str,
    threshold_file: Callable[..., ThresholdFile],
) -> None:
    path = tmp_path / "threshold.json"
    model = kwargs.pop("model", None)
    threshold_file(**({"model": model} if model else {})).write(path)
    with pytest.raises(ConfigurationError, match=problem):
        ESIGuard.from_calibration(path, backend=FakeBackend(), **kwargs)


def test_a_file_from_before_distinct_variants_rebuilds_the_draws_it_was_calibrated_with(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "threshold.json"
    old = {"name": "skip_one_char", "p": 0.3, "min_chars": 3}  # esi-guard 0.1.0's describe()
    scoring = threshold_file().scoring.model_copy(update={"intervention": old})
    threshold_file(scoring=scoring).write(path)
    guard = ESIGuard.from_calibration(path, backend=FakeBackend())
    assert guard.intervention == SkipOneChar(distinct=False) and guard.support == "pair"
    with pytest.raises(ConfigurationError, match="intervention"):
        ESIGuard.from_calibration(path, backend=FakeBackend(), intervention=SkipOneChar())


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "not found"), ("{not json", "not readable JSON"), ('{"a": 1}', "not an esi-guard"),
     ('{"format": "esi-guard/threshold", "threshold": "x"}', "invalid")],
)  # fmt: skip
def test_a_missing_or_corrupt_threshold_file_is_a_clear_error(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "threshold.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigurationError, match=problem):
        ThresholdFile.read(path)
