"""The hidden-state probe's report (``python -m benchmarks.probe report``) on synthetic runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.probe import report as probe_report
from benchmarks.probe.data import runs
from benchmarks.probe.report import out_of_fold, report
from benchmarks.results.run import markdown


class _Spy:
    """A fitted 'score' that says whether it was fitted on the question it scores."""

    def __init__(self, fitted: set[int]) -> None:
        self.fitted = fitted

    def p_wrong(self, signals: dict[str, float], hidden: Any = None) -> float:
        return float(int(signals["id"]) in self.fitted)


def _spy_fit(signals: list[dict[str, float]], wrong: Any, **_: Any) -> _Spy:
    return _Spy({int(s["id"]) for s in signals})


def test_out_of_fold_never_scores_a_question_with_a_score_fitted_on_it() -> None:
    y = np.array([0, 1] * 20)
    signals = [{"id": float(i)} for i in range(len(y))]
    p, folds = out_of_fold(signals, y, None, features=(), folds=5, repeats=3, fit=_spy_fit)
    assert np.all(p == 0.0)  # no held-out question was in its score's fitting part
    assert all(np.all(f.p_train == 1.0) for f in folds)
    assert len(folds) == 15
    seen = np.zeros(len(y))
    for f in folds:
        assert not set(f.train) & set(f.test)
        seen[f.test] += 1
    assert np.all(seen == 3)  # each question held out once per repeat


def test_the_report_of_synthetic_runs_renders_in_run_pys_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_run: Callable[..., None]
) -> None:
    monkeypatch.setattr(probe_report, "RESAMPLES", 50)
    rng = np.random.default_rng(0)
    write_run(tmp_path, "sciq-fake", rng, rag=False)
    write_run(tmp_path, "squad2-fake", rng, rag=True)
    assert runs(tmp_path) == ["sciq-fake", "squad2-fake"]
    records = report(tmp_path, runs(tmp_path), folds=2, repeats=1)
    by = {(r["dataset"], r.get("target"), r["method"]): r for r in records if "auroc" in r
          and not r.get("transfer")}  # fmt: skip
    assert by["sciq-fake", None, "hidden probe"]["n"] == 36
    assert by["squad2-fake", "unanswerable", "hidden probe, before answering"]["out_of_fold"]
    old = {"dataset": "sciq", "method": "NLL (greedy)", "auroc": 0.6, "auroc_low": 0.5,
           "auroc_high": 0.7, "seconds_per_example": 1.0, "n": 10, "accuracy": 0.2,
           "labels": "containment"}  # fmt: skip
    others = [old, {**old, "method": "ESI(SOC) L=10"},
              {**old, "method": "plain greedy answer", "auroc": None}]  # fmt: skip
    table = markdown(others + records)
    assert "| NLL (greedy) | 0.600 [0.50, 0.70] | 1.00 |" in table  # the run's own table
    for row in ("| hidden probe |", "| combined + hidden |", "| hidden probe, before answering |",
                "| combined + hidden - best free signal |", "fitted on \\ measured on",
                "squad2-fake (unanswerable)", "abstain before generating"):  # fmt: skip
        assert row in table
