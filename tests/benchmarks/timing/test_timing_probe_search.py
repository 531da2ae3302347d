"""``python -m benchmarks.timing probe-search``: both arms find the same fit, recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.timing import main


def test_both_arms_choose_the_same_probe_and_the_record_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "probe.json"
    main(["probe-search", "--answers", "40", "--hidden", "8", "--layers", "2",
          "--rounds", "1", "--json", str(out)])  # fmt: skip
    record = json.loads(out.read_text())
    assert record["identical"] is True
    assert record["candidates"] == 8 and record["answers"] == 40
    assert record["ratio"] == pytest.approx(record["per_candidate_s"] / record["batched_s"])
    assert "the same fit: True" in capsys.readouterr().out
