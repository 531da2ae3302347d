"""Scores per sentence on the embedded model: redaction, decisions on sentences, calibration.

On each white-box engine: every sentence of a three-question answer is scored on its own
tokens (the sentences tile the answer and the tokens), ``action="redact"`` returns the
answer less exactly the sentences it lists, and ``decide_on="sentences"`` acts on one
sentence past the threshold; ``calibrate --granularity sentence`` writes a file that a
guard reads back, deciding on sentences.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard
from esi_guard.backends import Backend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module

# Side by side (pytest -n), the module's flagged answers (one per engine) on one worker.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("sentences")]

QUESTIONS = (
    "Answer each numbered question below in one sentence, numbered as its question.\n\n"
    "1. What is the capital of France?\n2. What gas do plants take in to make sugar?\n"
    "3. Who wrote the play Hamlet?"
)
SETTINGS = {"n_variants": 4, "top_k": 20, "max_new_tokens": 96}


@pytest.fixture(scope="module")
def flagged(white_box: Backend) -> dict[str, object]:
    message = ESIGuard(backend=white_box, threshold=1.0, **SETTINGS).invoke(QUESTIONS)
    return message.response_metadata["esi"]


def test_the_sentences_tile_the_answer_and_its_tokens(flagged: dict[str, object]) -> None:
    sentences = flagged["sentences"]
    assert isinstance(sentences, list) and len(sentences) >= 2
    assert "".join(s["text"] for s in sentences) == flagged["answer"]
    assert sentences[0]["first_token"] == 0
    assert sentences[-1]["end_token"] == len(flagged["answer_token_ids"])  # type: ignore[arg-type]
    assert all(a["end_token"] == b["first_token"] for a, b in pairwise(sentences))
    tokens = [s["end_token"] - s["first_token"] for s in sentences]
    mean = sum(n * s["score"] for n, s in zip(tokens, sentences, strict=True)) / sum(tokens)
    assert mean == pytest.approx(flagged["score"], rel=1e-9)


def test_redact_returns_the_answer_less_the_sentences_it_lists(
    white_box: Backend, flagged: dict[str, object]
) -> None:
    scores = sorted(s["score"] for s in flagged["sentences"])  # type: ignore[union-attr]
    threshold = (scores[-1] + scores[-2]) / 2  # the highest-scoring sentence is past it
    message = ESIGuard(backend=white_box, threshold=threshold, action="redact",
                       **SETTINGS).invoke(QUESTIONS)  # fmt: skip
    esi = message.response_metadata["esi"]
    assert esi["answer"] == flagged["answer"]  # the same greedy answer
    assert esi["decision"] == "redact"
    removed = esi["redacted"]
    assert [r["score"] for r in removed] == [pytest.approx(scores[-1])]
    answer = esi["answer"]
    kept = "".join(answer[a["start"] : a["end"]] for a in esi["sentences"]
                   if a["decision"] == "accept")  # fmt: skip
    assert message.content == kept.rstrip()
    assert message.content == (answer[: removed[0]["start"]] + answer[removed[0]["end"] :]).rstrip()


def test_decide_on_sentences_abstains_on_one_sentence_past_the_threshold(
    white_box: Backend, flagged: dict[str, object]
) -> None:
    top = max(s["score"] for s in flagged["sentences"])  # type: ignore[union-attr]
    whole = flagged["score"]
    assert isinstance(whole, float) and whole < top
    guard = ESIGuard(backend=white_box, threshold=(whole + top) / 2, action="abstain",
                     decide_on="sentences", **SETTINGS)  # fmt: skip
    esi = guard.invoke(QUESTIONS).response_metadata["esi"]
    assert esi["decision"] == "abstain"
    assert [s["decision"] for s in esi["sentences"]].count("abstain") >= 1


def test_calibrate_per_sentence_writes_a_file_a_guard_decides_sentences_with(
    white_box: Backend, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "backend", lambda *args: white_box)
    out = tmp_path / "sentences.json"
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(shared_data / "sciq" / "test.jsonl"), "--limit", "12",
        "--granularity", "sentence", "--select", "coverage", "--coverage", "0.8",
        "--n-variants", "4", "--top-k", "20", "--max-new-tokens", "96", "--resamples", "50",
        "--out", str(out), "--cache", str(tmp_path / "run.jsonl"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 prompts of 3 questions" in " ".join(result.output.split())
    written = ThresholdFile.read(out)
    assert written.granularity == "sentence" and "decide_on" not in written.scoring.model_dump()
    guard = ESIGuard.from_calibration(out, backend=white_box, action="redact")
    assert guard.decide_on == "sentences" and guard.threshold == written.threshold
    esi = guard.invoke(QUESTIONS).response_metadata["esi"]
    limit = written.threshold
    assert [s["decision"] for s in esi["sentences"]] == [
        "redact" if s["score"] > limit else "accept" for s in esi["sentences"]
    ]
