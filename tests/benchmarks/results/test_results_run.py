"""The benchmark's markdown report: the table of whatever methods a run scored."""

from __future__ import annotations

from typing import Any

from benchmarks.results.run import markdown


def _record(method: str, auroc: float | None, seconds: float, extra: float) -> dict[str, Any]:
    return {"dataset": "sciq", "method": method, "auroc": auroc, "auroc_low": 0.4,
            "auroc_high": 0.8, "seconds_per_example": seconds,
            "extra_seconds_per_example": extra, "n": 10, "accuracy": 0.2,
            "labels": "containment"}  # fmt: skip


def test_a_run_without_samples_reports_without_the_sampling_ratio() -> None:
    records = [_record("ESI(SOC) L=10", 0.6, 3.0, 2.0), _record("NLL (greedy)", 0.55, 1.0, 0.0),
               _record("plain greedy answer", None, 1.0, 0.0)]  # fmt: skip
    table = markdown(records)
    assert "| ESI(SOC) L=10 | 0.600 [0.40, 0.80] | 3.00 (2.00) |" in table
    assert "sciq: ESI(SOC, L=10) / plain greedy answer = 3.00x" in table
    assert "semantic entropy" not in table


def test_with_samples_the_report_gives_semantic_entropys_cost_against_esis() -> None:
    records = [_record("ESI(SOC) L=10", 0.6, 3.0, 2.0), _record("NLL (greedy)", 0.55, 1.0, 0.0),
               _record("semantic entropy", 0.5, 9.0, 8.0),
               _record("plain greedy answer", None, 1.0, 0.0)]  # fmt: skip
    table = markdown(records)
    assert "semantic entropy / ESI(SOC, L=10) time = 3.00x" in table
    assert "(beyond the answer: 8.00 s vs 2.00 s, 4.00x)" in table


def test_an_older_runs_records_with_retired_fields_still_render() -> None:
    # Runs before 0.2.0 wrote sequential-ESI rows (issue 65): their fields are ignored.
    old = {**_record("ESI(SOC) sequential", 0.61, 2.0, 1.0), "variants_used_mean": 5.3,
           "decision_agreement": 0.98, "full_guard_seconds_per_example": 3.0,
           "auroc_minus_full": 0.01, "auroc_minus_full_low": -0.03,
           "auroc_minus_full_high": 0.04}  # fmt: skip
    records = [_record("ESI(SOC) L=10", 0.6, 3.0, 2.0), _record("NLL (greedy)", 0.55, 1.0, 0.0),
               _record("plain greedy answer", None, 1.0, 0.0), old]  # fmt: skip
    table = markdown(records)
    assert "| ESI(SOC) sequential | 0.610 [0.40, 0.80] | 2.00 (1.00) |" in table
    assert "variants_used_mean" not in table and "decision_agreement" not in table
