"""``python -m benchmarks.timing engines``: its options, and its comparison on fake arms."""

from __future__ import annotations

import pytest

from benchmarks.common import Answering
from benchmarks.timing import main, parser
from benchmarks.timing.engines import SYSTEM, compare
from esi_guard.backends import Backend, FakeBackend

QUESTIONS = ["Who wrote Hamlet?", "What is H2O?", "Which planet is red?", "What is 2+2?"]


def test_its_options_and_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["engines", "--help"])
    assert stop.value.code == 0
    assert "--forcing-precision" in capsys.readouterr().out
    args = parser().parse_args(["engines", "--dtype", "float32", "bfloat16"])
    assert (args.limit, args.max_new_tokens, args.threads) == (30, 24, 1)
    assert args.engines == ["llamacpp", "transformers"]
    assert args.dtype == ["float32", "bfloat16"] and args.json is None


def test_arms_are_compared_with_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    answers = {q: f"answer {i}" for i, q in enumerate(QUESTIONS)}
    sensitivity = {q: 0.2 * (i + 1) for i, q in enumerate(QUESTIONS)}
    other = answers | {QUESTIONS[0]: "something else"}
    reference = FakeBackend(answers, sensitivity=sensitivity)
    arms: dict[str, Backend] = {
        "first": reference,
        "same": FakeBackend(answers, sensitivity=sensitivity),
        "other": FakeBackend(other, sensitivity=sensitivity),
    }
    prompts = [Answering(24, SYSTEM).messages(q) for q in QUESTIONS]
    out = compare(arms, prompts, 24)
    assert out["n"] == 4 and out["first"] == "first" and list(out["arms"]) == list(arms)
    for row in out["arms"].values():
        assert row["plain"] > 0 and row["guarded"] > 0
        assert row["beyond"] == pytest.approx(row["guarded"] - row["plain"])
        assert row["guarded_over_plain"] == pytest.approx(row["guarded"] / row["plain"])
    assert "same_answers" not in out["arms"]["first"]
    same, other_row = out["arms"]["same"], out["arms"]["other"]
    assert (same["same_answers"], same["scored_pairs"]) == (4, 4)
    assert same["spearman"] == pytest.approx(1.0) and same["score_diff_mean"] == 0.0
    assert (other_row["same_answers"], other_row["scored_pairs"]) == (3, 3)
    assert other_row["guarded_over_first"] == pytest.approx(
        other_row["guarded"] / out["arms"]["first"]["guarded"]
    )
    printed = capsys.readouterr().out
    assert "other against first: same greedy answer 3/4" in printed
    assert {call for call, _ in reference.calls} >= {"generate", "teacher_force"}
