"""``python -m benchmarks.results.decisions`` on a synthetic run: every answer is scored by
fits that never saw it, and the tables render."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.probe.data import usable
from benchmarks.results import decisions


def test_calibration_and_the_value_cascade_on_a_synthetic_run(
    tmp_path: Path, write_run: Callable[..., None]
) -> None:
    write_run(tmp_path, "sciq-fake", np.random.default_rng(0), rag=False, n=120)
    run = usable(tmp_path, "sciq-fake")
    cal = decisions.calibration(run, 60, repeats=1, seed=0)
    (one,) = cal["rounds"]
    assert one["n_cal"] == 60 and one["n_test"] == 60
    assert set(one["auroc"]) == {"selected", "full", "esi", "best_free"}
    assert one["auroc"]["selected"]["value"] > 0.6  # the signals and states carry the labels
    cascade = decisions.cascade(run, seed=0)
    assert cascade["n"] == 120 and 0 <= cascade["esi_share"] <= 1
    assert len(cascade["bands"]) == 5 and cascade["agreement"] >= 0.9
    table = decisions.markdown([cal, cascade]).splitlines()
    assert len(table) == 2 and all(line.startswith("| sciq-fake |") for line in table)


def test_coverage_on_unseen_questions_before_and_after(
    tmp_path: Path, write_run: Callable[..., None]
) -> None:
    write_run(tmp_path, "sciq-fake", np.random.default_rng(1), rag=False, n=160)
    run = usable(tmp_path, "sciq-fake")
    record = decisions.coverage(run, 100, repeats=2, seed=0, nested=False)
    assert record["size"] == 100 and len(record["rounds"]) == 2
    for one in record["rounds"]:
        assert one["n_cal"] == 100 and one["n_test"] == 60
        assert set(one["coverage"]) == {"esi", "after", "average_oof_threshold", "before"}
        assert all(0.0 <= c <= 1.0 for c in one["coverage"].values())
        assert one["auroc"]["reported_nested"] is None
    assert 0.6 <= record["mean_coverage"]["after"] <= 1.0
    (line,) = decisions.markdown([record]).splitlines()
    assert line.startswith("| sciq-fake | 100 / 60 | 2 | 0.80 |")


def test_the_learning_curve_on_unanswerable_questions_is_drawn(
    tmp_path: Path, write_run: Callable[..., None]
) -> None:
    write_run(tmp_path, "squad2-fake", np.random.default_rng(2), rag=True, n=120)
    run = usable(tmp_path, "squad2-fake")
    records = [decisions.calibration(run, n, repeats=2, seed=0, label="unanswerable")
               for n in (40, 60)]  # fmt: skip
    assert [r["label"] for r in records] == ["unanswerable", "unanswerable"]
    assert [one["n_cal"] for r in records for one in r["rounds"]] == [40, 40, 60, 60]
    # the positives are the unanswerable questions: a stratified draw holds their share
    share = run.labels["unanswerable"].mean()
    assert all(abs(one["wrong_cal"] - 60 * share) <= 1 for one in records[1]["rounds"])
    wrong = decisions.calibration(run, 60, repeats=1, seed=0)
    assert wrong["label"] == "wrong"
    path = tmp_path / "curve.png"
    decisions.plot([*records, wrong], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
