"""``python -m benchmarks.timing gpu`` at a tiny shape on the CPU: the GPU run, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.timing import main


def test_the_gpu_benchmark_runs_at_a_tiny_shape(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    record = main(["gpu", "--tiny", "--device", "cpu", "--dtype", "float32", "--batches", "1", "4",
                   "--repeats", "1", "--json", str(out), "--profile", str(tmp_path)])  # fmt: skip
    assert json.loads(out.read_text()) == record
    assert record["shape"] == "tiny" and [r["batch"] for r in record["rows"]] == [1, 4]
    for row in record["rows"]:
        assert row["generate_seconds_per_example"] > 0
        assert set(row) >= {
            "full_extra_seconds_per_example",
            "free_extra_seconds_per_example",
            "probe_extra_seconds_per_example",
            "cascade_extra_seconds_per_example",
        }
        assert 0 <= row["cascade_esi_share"] <= 1
    profile = record["profile"]
    assert profile["batch"] == 4 and set(profile["host_seconds"]) == {
        "esi.batch", "esi.generate", "esi.teacher_force"}  # fmt: skip
    assert 0 < profile["host_seconds"]["esi.teacher_force"] < profile["host_seconds"]["esi.batch"]
    assert (tmp_path / "profile-batch4.txt").read_text().startswith("# one guarded batch of 4")
    assert (tmp_path / "trace-batch4.json.gz").stat().st_size > 0
