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
                       "--repeats", "1", "--json", str(out)])  # fmt: skip
    assert json.loads(out.read_text()) == record
    assert record["shape"] == "tiny" and [r["batch"] for r in record["rows"]] == [1, 4]
    for row in record["rows"]:
        assert row["generate_seconds_per_example"] > 0
        assert 2 <= row["sequential_variants_used_mean"] <= 10
        assert set(row) >= {
            "full_extra_seconds_per_example",
            "sequential_extra_seconds_per_example",
        }
