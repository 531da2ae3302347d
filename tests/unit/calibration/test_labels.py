"""Correctness labels: containment, exact match, token F1, and an LLM judge."""

from __future__ import annotations

import pytest

from esi_guard.calibration import labels


def test_labels() -> None:
    questions = ["q"] * 4
    predictions = ["The answer is Charles Darwin.", "darwin", "Lamarck", ""]
    gold = [["Darwin"]] * 4
    assert labels.Containment().label(questions, predictions, gold) == [True, True, False, False]
    assert labels.ExactMatch().label(questions, predictions, gold) == [False, True, False, False]
    assert labels.token_f1("the Charles Darwin", "Darwin") == pytest.approx(2 * 0.5 / 1.5)
    assert labels.TokenF1(0.6).label(questions, predictions, gold) == [False, True, False, False]
    assert labels.Containment().label(["q"], ["Parisian"], [["Paris"]]) == [False]  # word-aligned


def test_llm_judge_uses_any_runnable() -> None:
    from langchain_core.runnables import RunnableLambda

    judge = labels.LLMJudge(RunnableLambda(lambda p: "Correct." if "Darwin" in p.split(
        "Answer to grade:")[1] else "incorrect"))  # fmt: skip
    assert judge.label(["Who?", "Who?"], ["Darwin", "Lamarck"], [["Darwin"], ["Darwin"]]) == [
        True, False]  # fmt: skip
    assert judge.name == "llm_judge(RunnableLambda)"
    seen: list[str] = []
    recording = labels.LLMJudge(RunnableLambda(lambda p: seen.append(p) or "incorrect"))
    recording.label(["Who?", "Who?"], ["Lamarck", "Darwin"], [["Darwin"]] * 2, [["Lamarck"], []])
    assert "Known wrong answers: Lamarck" in seen[0]
    assert "Known wrong answers" not in seen[1]
