"""``calibrate --granularity sentence`` on the fake backend: scored, labelled, written, read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard, FakeBackend
from esi_guard.calibration.data import Example
from esi_guard.calibration.file import ThresholdFile
from esi_guard.calibration.long_answers import group_closed_book
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module


@pytest.fixture
def setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeBackend, Path]:
    """60 questions, 20 prompts of 3; every third prompt answers its second wrongly."""
    rows = [{"question": f"Which city is number {i} on the list?", "answer": f"city{i}"}
            for i in range(60)]  # fmt: skip
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = [Example(r["question"], (r["answer"],)) for r in rows]
    answers, levels = {}, {}
    for n, prompt in enumerate(group_closed_book(examples, 3)):
        first, second, third = (e.answers[0] for e in prompt.examples)
        second = "Atlantis" if n % 3 == 0 else second
        answers[prompt.text()] = f"1. It is {first}. 2. It is {second}. 3. It is {third}."
        levels[prompt.text()] = 0.9 if n % 3 == 0 else 0.1
    backend = FakeBackend(answers, sensitivity=levels)
    monkeypatch.setattr(build, "backend", lambda *args: backend)
    return backend, data


def calibrate(data: Path, out: Path, *options: str) -> str:
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--n-variants", "4", "--resamples", "50",
        "--granularity", "sentence", "--out", str(out),
        "--cache", str(out.with_suffix(".jsonl")), *options,
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_sentence_threshold_file_round_trips_into_a_guard_on_sentences(
    setting: tuple[FakeBackend, Path], tmp_path: Path
) -> None:
    backend, data = setting
    out = tmp_path / "sentences.json"
    printed = calibrate(data, out, "--select", "youden")
    assert "20 prompts of 3 questions (20 scored): 60 sentences, 60 aligned" in printed
    assert "(53 right)" in printed  # 7 of the 20 prompts answer one wrongly
    written = ThresholdFile.read(out)
    assert written.granularity == "sentence"
    assert "decide_on" not in written.scoring.model_dump()  # the file's granularity says it
    assert written.sentence_report is not None and written.sentence_report["labelled"] == 60
    guard = ESIGuard.from_calibration(out, backend=backend)
    assert guard.decide_on == "sentences" and guard.threshold == written.threshold
    redacting = ESIGuard.from_calibration(out, backend=backend, action="redact")
    prompt = group_closed_book([Example(f"Which city is number {i} on the list?", ("x",))
                                for i in range(3)], 3)[0]  # fmt: skip
    result = redacting.with_prompt(_template(prompt.template), "questions").invoke(
        {"questions": prompt.question_text}
    )
    esi = result.response_metadata["esi"]
    assert [s["decision"] for s in esi["sentences"]] == [
        "redact" if s["score"] > written.threshold else "accept" for s in esi["sentences"]
    ]
    # Every prompt is in the cache: a rerun loads no model.
    calls = len(backend.calls)
    assert "all 20 prompts found" in calibrate(data, out, "--select", "youden")
    assert len(backend.calls) == calls


def _template(text: str) -> object:
    from langchain_core.prompts import ChatPromptTemplate

    return ChatPromptTemplate.from_messages([("human", text)])


def test_risk_selection_writes_the_back_off_guarantee(
    setting: tuple[FakeBackend, Path], tmp_path: Path
) -> None:
    _, data = setting
    out = tmp_path / "risk.json"
    printed = calibrate(data, out, "--select", "risk", "--alpha", "0.5", "--delta", "0.2")
    written = ThresholdFile.read(out)
    assert written.guarantee is not None
    assert written.guarantee["granularity"] == "sentence"
    assert "share of answers whose kept sentences include a wrong one is <= 0.5" in printed
    assert written.method == "backoff<=0.5@delta=0.2"


@pytest.mark.parametrize("select", ["risk", "youden"])
def test_sentences_all_right_are_refused_before_any_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, select: str
) -> None:
    rows = [{"question": f"Which city is number {i} on the list?", "answer": f"city{i}"}
            for i in range(30)]  # fmt: skip
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = [Example(r["question"], (r["answer"],)) for r in rows]
    answers = {prompt.text(): " ".join(f"{n}. It is {e.answers[0]}."
                                       for n, e in enumerate(prompt.examples, 1))
               for prompt in group_closed_book(examples, 3)}  # fmt: skip
    monkeypatch.setattr(build, "backend", lambda *args: FakeBackend(answers))
    out = tmp_path / "x.json"
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--n-variants", "2", "--resamples", "20",
        "--granularity", "sentence", "--select", select, "--out", str(out),
        "--cache", str(tmp_path / "c.jsonl"),
    ])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert (
        "error: 0 wrong and 30 right of 30 labelled sentences: a threshold tells wrong "
        "sentences from right ones and cannot be calibrated on one kind alone; no threshold "
        "file written."
    ) in " ".join(result.stderr.split())
    assert not out.exists() and "nan" not in result.output.lower()


@pytest.mark.parametrize("option", [["--score", "combined"], ["--esi-probe", "probe.json"]])
def test_options_a_sentence_threshold_cannot_take_are_refused(
    setting: tuple[FakeBackend, Path], tmp_path: Path, option: list[str]
) -> None:
    _, data = setting
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--granularity", "sentence",
        "--out", str(tmp_path / "x.json"), *option,
    ])  # fmt: skip
    assert result.exit_code == 2
    assert "--granularity sentence decides on each sentence's ESI" in result.output


def test_workers_are_refused_for_sentences(
    setting: tuple[FakeBackend, Path], tmp_path: Path
) -> None:
    _, data = setting
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--granularity", "sentence",
        "--out", str(tmp_path / "x.json"), "--workers", "2",
    ])  # fmt: skip
    assert result.exit_code == 2
    assert "--workers scores whole answers" in result.output


def test_a_run_a_kill_cut_short_resumes_with_every_prompt(
    setting: tuple[FakeBackend, Path], tmp_path: Path
) -> None:
    _, data = setting
    out = tmp_path / "sentences.json"
    calibrate(data, out, "--select", "youden")
    cache = out.with_suffix(".jsonl")
    lines = cache.read_text().splitlines(keepends=True)
    cache.write_text("".join(lines[:-2]) + lines[-2][:40])  # the last record lost, one cut
    assert "20 scored" in calibrate(data, out, "--select", "youden")
    again = calibrate(data, out, "--select", "youden")
    assert "all 20 prompts found" in again  # the resumed records were each written whole


def test_evaluate_refuses_a_sentence_threshold_file_saying_so(
    setting: tuple[FakeBackend, Path], tmp_path: Path
) -> None:
    _, data = setting
    out = tmp_path / "sentences.json"
    calibrate(data, out, "--select", "youden")
    result = CliRunner().invoke(cli_module.app, [
        "evaluate", "--threshold", str(out), "--data", str(data), "--resamples", "50",
    ])  # fmt: skip
    assert result.exit_code == 2
    # was: "the built-in RAG template has no {question} variable"
    assert "RAG" not in result.stderr and "sentence" in " ".join(result.stderr.split())


def test_the_sentence_metrics_bootstrap_whole_answers(
    setting: tuple[FakeBackend, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from esi_guard.cli.run import labelled

    _, data = setting
    seen: dict[str, Any] = {}
    real = labelled.summarise

    def spy(scores: Any, wrong: Any, **options: Any) -> Any:
        seen.update(options, n=len(scores))
        return real(scores, wrong, **options)

    monkeypatch.setattr(labelled, "summarise", spy)
    calibrate(data, tmp_path / "s.json", "--select", "youden")
    assert seen["n"] == 60
    clusters = seen.get("clusters")
    assert clusters is not None, "sentences were resampled one by one, not by prompt"
    assert len(set(clusters)) == 20
    assert all(clusters[i] == clusters[i - i % 3] for i in range(60))
