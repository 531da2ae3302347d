"""``calibrate`` / ``evaluate --workers 2`` (a local Ray) against one process: same files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Side by side (pytest -n), one local Ray at a time: every Ray test and docs/ray.md on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.xdist_group("ray"),
]

pytest.importorskip("ray")

LIMIT = "8"


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "esi_guard.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ,
                                                       "RAY_ADDRESS": "local"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _records(cache: Path) -> list[dict[str, Any]]:
    lines = cache.read_text().splitlines()[1:]
    return sorted((json.loads(line) for line in lines), key=lambda r: r["index"])


def _file(path: Path) -> dict[str, Any]:
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "created"}


def test_two_workers_write_the_file_one_process_writes(shared_data: Path, tmp_path: Path) -> None:
    data = str(shared_data / "sciq" / "test.jsonl")
    # Short answers and four variants: what is compared is where each record is scored,
    # not the scores' settings (the defaults' 64 tokens and 10 variants cost 3x as much).
    common = ["calibrate", "--data", data, "--limit", LIMIT, "--select", "coverage",
              "--resamples", "100", "--batch-size", "2", "--n-variants", "4",
              "--max-new-tokens", "12"]  # fmt: skip
    _cli(*common, "--threads", "1", "--cache", str(tmp_path / "one.jsonl"),
         "--out", str(tmp_path / "one.json"))  # fmt: skip
    out = _cli(*common, "--workers", "2", "--cache", str(tmp_path / "two.jsonl"),
               "--out", str(tmp_path / "two.json"))  # fmt: skip
    assert "scored on 2 Ray workers" in out
    assert _records(tmp_path / "two.jsonl") == _records(tmp_path / "one.jsonl")
    assert _file(tmp_path / "two.json") == _file(tmp_path / "one.json")
    again = _cli(*common, "--workers", "2", "--cache", str(tmp_path / "two.jsonl"),
                 "--out", str(tmp_path / "again.json"))  # fmt: skip
    assert "no model loaded" in again  # resumed from the same cache

    # Two batches of two: one for each worker.
    evaluate = ["evaluate", "--threshold", str(tmp_path / "one.json"), "--data", data,
                "--limit", "4", "--resamples", "100", "--batch-size", "2"]  # fmt: skip
    _cli(*evaluate, "--threads", "1", "--cache", str(tmp_path / "e1.jsonl"))
    _cli(*evaluate, "--workers", "2", "--cache", str(tmp_path / "e2.jsonl"))
    assert _records(tmp_path / "e2.jsonl") == _records(tmp_path / "e1.jsonl")
