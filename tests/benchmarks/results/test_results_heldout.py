"""benchmarks/results/heldout.py: a threshold file measured on a cache of new questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.results import heldout
from esi_guard.backends.embedded import embedded_threshold


def cache(tmp_path: Path) -> Path:
    """A calibrate cache of 40 answers: the right ones score low, the wrong ones high."""
    lines = [json.dumps({"kind": "esi-guard/calibration-cache", "version": 2})]
    for i in range(40):
        right = i % 4 == 0
        level = 0.01 + 0.002 * i if right else 0.4 + 0.01 * i
        lines.append(json.dumps({
            "index": i, "question": f"q{i}", "answers": ["paris"],
            "prediction": "It is Paris." if right else "It is Lyon.", "score": level,
            "scored": True, "signals": {"nll": 10 * level, "entropy": level, "max_nll": 5 * level},
        }))  # fmt: skip
    lines.append(json.dumps({"index": 40, "question": "q", "answers": ["x"], "prediction": None,
                             "score": None, "scored": False}))  # fmt: skip
    path = tmp_path / "held.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def file(tmp_path: Path, combined: bool, threshold: float) -> Path:
    raw = json.loads(embedded_threshold().read_text())
    if not combined:
        raw.update(combined=None, combined_report=None)
    path = tmp_path / ("combined.json" if combined else "esi.json")
    path.write_text(json.dumps({**raw, "threshold": threshold}), encoding="utf-8")
    return path


def test_an_esi_threshold_s_coverage_and_risk_on_held_out_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [row] = heldout.main([str(file(tmp_path, False, 0.445)), str(cache(tmp_path)),
                          "--resamples", "50"])  # fmt: skip
    assert row["n"] == 40 and row["right"] == pytest.approx(0.25) and row["on"] == "ESI"
    assert row["auroc"].value == pytest.approx(1.0)  # every wrong answer above every right one
    # accepted: the 10 right answers (0.01-0.08) and the wrong ones at 0.41, 0.42, 0.43
    assert row["coverage"] == pytest.approx(13 / 40)
    assert row["selective_risk"] == pytest.approx(3 / 13) and "ece" not in row
    assert "esi.json: threshold 0.4450 on ESI" in capsys.readouterr().out


def test_a_combined_file_is_measured_on_p_wrong_beside_esi_alone(tmp_path: Path) -> None:
    [row] = heldout.main([str(file(tmp_path, True, 0.9)), str(cache(tmp_path)),
                          "--resamples", "50", "--markdown", str(tmp_path / "t.md")])  # fmt: skip
    assert row["on"] == "p_wrong" and 0 <= row["ece"] <= 1
    assert row["esi_auroc"].value == pytest.approx(1.0)
    assert row["minus_esi"].value == pytest.approx(row["auroc"].value - 1.0)
    assert "| held.jsonl | 40 | 0.250 |" in (tmp_path / "t.md").read_text()


def test_a_cache_with_no_scored_answer_says_so(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text('{"kind": "esi-guard/calibration-cache"}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"empty\.jsonl: no scored answer"):
        heldout.heldout(file(tmp_path, False, 0.3), path)


def test_skip_leaves_out_the_questions_the_file_was_fitted_on(tmp_path: Path) -> None:
    # questions 0-19 fitted on, 20-39 held out: 5 right (20, 24, ... 36), 15 wrong
    [row] = heldout.main([str(file(tmp_path, False, 0.445)), str(cache(tmp_path)),
                          "--resamples", "50", "--skip", "20"])  # fmt: skip
    assert row["n"] == 20 and row["right"] == pytest.approx(0.25)
    assert row["cache"] == "held.jsonl from 20"
    # accepted: the 5 right answers (0.05-0.082); every wrong one from 20 on is above 0.6
    assert row["coverage"] == pytest.approx(5 / 20) and row["selective_risk"] == 0
    with pytest.raises(SystemExit, match="no scored answer from question 41 on"):
        heldout.heldout(file(tmp_path, False, 0.445), cache(tmp_path), skip=41)
