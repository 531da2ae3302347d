"""from_calibration's threshold is the file's: a threshold= given beside it is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard.calibration.file import ThresholdFile


def test_a_threshold_given_to_from_calibration_is_refused_not_reported_as_the_files(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "t.json"
    threshold_file(threshold=0.3).write(path)
    with pytest.raises(ConfigurationError, match="threshold"):
        guard = ESIGuard.from_calibration(path, backend=FakeBackend(), threshold=0.9)
        # before the fix: the file's source, another threshold
        assert (guard.threshold, guard.threshold_source) == (0.3, f"file:{path}")
    assert ESIGuard.from_calibration(path, backend=FakeBackend()).threshold == 0.3
