"""The ESI probe and cascade rows (``python -m benchmarks.results.cascade``) of a synthetic run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from benchmarks.results import cascade
from benchmarks.results.run import markdown


def test_the_cascade_rows_of_a_synthetic_run_render_in_run_pys_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_run: Callable[..., None]
) -> None:
    monkeypatch.setattr(cascade, "RESAMPLES", 50)
    write_run(tmp_path, "sciq-fake", np.random.default_rng(1), rag=False, n=80)
    records = cascade.evaluate(tmp_path, "sciq-fake", repeats=1, coverage=0.8)
    by = {r["method"]: r for r in records}
    assert by["ESI probe"]["n"] == 80 and -1 <= by["ESI probe"]["spearman"] <= 1
    for row in (cascade.CERTIFIED, cascade.QUANTILE):
        assert 0 <= by[row]["esi_share"] <= 1 and 0 <= by[row]["agreement"] <= 1
        assert by[row]["guarded_over_plain"] <= by[row]["full_esi_over_plain"]
    assert by[cascade.CERTIFIED]["esi_share"] == 1.0  # 40 answers certify nothing: all ESI
    table = markdown(records)
    assert "| sciq-fake | 80 (40) | ESI cascade |" in table
    assert "| ESI probe |" in table
