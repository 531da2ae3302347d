"""The hidden-state probe's report (``benchmarks/probe.py report``) on synthetic runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import probe_report
from benchmarks.cache import Cache
from benchmarks.probe import _save_hidden, hidden_spec, runs
from benchmarks.probe_report import out_of_fold, report, window
from benchmarks.run import markdown
from esi_guard.backends import Generation
from esi_guard.backends.base import FINAL, POSITIONS, HiddenSpec, HiddenStates
from esi_guard.scoring import TopK


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


def test_the_window_is_the_blocks_at_40_to_80_percent_depth_and_final() -> None:
    assert window(hidden_spec(30), "window").layers == (12, 15, 18, 21, 24, FINAL)
    assert window(hidden_spec(18), "window").layers == (9, 11, 13, 14, FINAL)
    assert window(hidden_spec(30), "prompt").positions == ("prompt_last",)
    assert window(hidden_spec(30), "final") == HiddenSpec((FINAL,), POSITIONS)


def _write_run(folder: Path, name: str, rng: np.random.Generator, rag: bool, n: int = 36) -> None:
    """A run as ``collect`` writes it: Cache records, states saved by ``_save_hidden``."""
    layers = (4, 8, 9, FINAL)
    header = {"labels": "containment", "model": "fake", "engine": "fake",
              "layers": list(layers), "positions": list(POSITIONS)}  # fmt: skip
    cache = Cache(folder, name, header)
    wrong = np.array([0, 1] * (n // 2) + [0])  # the last: SOC changed nothing, no ESI
    chunk = [(i, None) for i in range(n + 1)]
    topk = TopK(np.zeros((1, 2), np.int64), np.zeros((1, 2)))
    values = rng.normal(size=(n + 1, len(layers), len(POSITIONS), 4)) + wrong[:, None, None, None]
    gens = [Generation("a", (0,), topk, "stop", hidden=HiddenStates(layers, POSITIONS, v))
            for v in values.astype(np.float32)]  # fmt: skip
    file = _save_hidden(folder / f"{name}-hidden", (0, 1), chunk, gens)  # type: ignore[arg-type]
    records = []
    for i in range(n + 1):
        labels = {"wrong": int(wrong[i])} | ({"unanswerable": int(wrong[i])} if rag else {})
        signals = ("esi", "nll", "entropy", "max_nll") if i < n else ("nll", "entropy", "max_nll")
        scores = {k: float(rng.normal() + wrong[i]) for k in signals}
        records.append({"index": i, "hidden": file, "labels": labels, "scores": scores,
                        "seconds": {"generate": 1.0}})  # fmt: skip
    cache.add((0, 1), records)


def test_the_report_of_synthetic_runs_renders_in_run_pys_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe_report, "RESAMPLES", 50)
    rng = np.random.default_rng(0)
    _write_run(tmp_path, "sciq-fake", rng, rag=False)
    _write_run(tmp_path, "squad2-fake", rng, rag=True)
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


def test_the_cascade_rows_of_a_synthetic_run_render_in_run_pys_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import cascade

    monkeypatch.setattr(cascade, "RESAMPLES", 50)
    _write_run(tmp_path, "sciq-fake", np.random.default_rng(1), rag=False, n=80)
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
