"""``python -m benchmarks.probe export``: what it refuses before loading any model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from benchmarks.probe.__main__ import main


def test_a_limit_beyond_the_collected_questions_is_refused_by_name(
    tmp_path: Path, write_run: Callable[..., None]
) -> None:
    write_run(tmp_path, "sciq-fake", np.random.default_rng(0), rag=False)  # 37 questions
    with pytest.raises(SystemExit, match="sciq-fake: fewer than --limit 100 questions collected"):
        main(["export", "--cache", str(tmp_path), "--name", "sciq-fake", "--model", "fake.gguf",
              "--out", str(tmp_path / "out.jsonl"), "--limit", "100"])  # fmt: skip
    assert not (tmp_path / "out.jsonl").exists()
