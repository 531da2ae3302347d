"""benchmarks/long_answers.py on the fake backend: records per sentence, labels, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import long_answers
from esi_guard import ESIGuard, FakeBackend

ROWS = [
    ("What is the energy of an earthquake called?", ["seismic energy"]),
    ("Which rock cools rapidly from lava?", ["basalt"]),
    ("What forms new species besides natural selection?", ["genetic drift"]),
]
ALONE = {
    ROWS[0][0]: "It is seismic energy. It is strong.",
    ROWS[1][0]: "Basalt cools fast.",
    ROWS[2][0]: "Mutation.",
}


def guard(default_answer: str) -> ESIGuard:
    backend = FakeBackend(ALONE, default_answer=default_answer, default_sensitivity=0.5)
    return ESIGuard(backend=backend, threshold=0.5, max_new_tokens=64)


@pytest.fixture
def sciq(tmp_path: Path) -> Path:
    path = tmp_path / "sciq" / "test.jsonl"
    path.parent.mkdir()
    rows = [{"query": q, "truthful answer": a} for q, a in ROWS * 2]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def records(cache: Path, form: str) -> list[dict]:  # type: ignore[type-arg]
    lines = next(cache.glob(f"long_answers-{form}-*.jsonl")).read_text().splitlines()
    return [json.loads(line) for line in lines[1:]]


def test_closed_book_records_each_sentence_aligned_labelled_and_scored(
    sciq: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = long_answers.prompts_of(sciq, "closed-book", 3, 1)[0]  # the questions, shuffled
    answer = (  # the fake backend's tokens are words: its answers are on one line
        f"1. It is called {asked.examples[0].answers[0]}. It shakes the ground. "
        f"2. {asked.questions[1]} 3. It is granite."
    )
    argv = ["--data", str(sciq), "--form", "closed-book", "--limit", "2",
            "--cache", str(tmp_path / "cache"), "--n-resamples", "20"]  # fmt: skip
    figures = long_answers.main(argv, guard=guard(answer))["closed-book"]
    [first, second] = records(tmp_path / "cache", "closed-book")
    assert first["answer"] == answer and first["scored"]
    got = [(s["text"].strip(), s["question"], s["how"], s["label"]) for s in first["sentences"]]
    assert got == [
        (f"1. It is called {asked.examples[0].answers[0]}.", 0, "number", "right"),
        ("It shakes the ground.", 0, "continued", "wrong"),
        (f"2. {asked.questions[1]}", 1, "number", "question"),
        ("3. It is granite.", 2, "number", "wrong"),
    ]
    sentence = first["sentences"][0]
    assert set(sentence) >= {"text", "start", "end", "question", "label", "score",
                             "whole_score", "entropy", "max_nll", "nll"}  # fmt: skip
    assert answer[sentence["start"] : sentence["end"]] == sentence["text"]
    assert sentence["whole_score"] == first["score"] and sentence["score"] >= 0
    labels = [s["label"] for r in (first, second) for s in r["sentences"]]
    assert labels[:4] == ["right", "wrong", "question", "wrong"]
    counts = (figures["right"], figures["wrong"], figures["questions"])
    assert counts == (labels.count("right"), labels.count("wrong"), 2)
    printed = capsys.readouterr().out
    assert "| sentence ESI |" in printed and "| whole-answer ESI |" in printed
    assert "sentence - whole (paired)" in printed
    with pytest.raises(SystemExit, match="--resume"):  # an existing cache is not overwritten
        long_answers.main(argv, guard=guard(answer))


def test_another_model_s_run_keeps_its_own_cache(sciq: Path, tmp_path: Path) -> None:
    argv = ["--data", str(sciq), "--form", "controlled", "--limit", "1",
            "--cache", str(tmp_path / "cache"), "--n-resamples", "20"]  # fmt: skip
    long_answers.main(argv, guard=guard("unused"))
    big = "/models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"
    long_answers.main([*argv, "--model", big], guard=guard("unused"))  # no --resume needed
    names = sorted(path.name for path in (tmp_path / "cache").glob("long_answers-*.jsonl"))
    assert names[0] == "long_answers-controlled-sciq-0of1.jsonl"  # the embedded model's
    assert names[1].startswith("long_answers-controlled-sciq-qwen2-5-coder-1-5b-instruct-q4-k-m")


def test_controlled_joins_one_sentence_per_question_and_aligns_by_construction(
    sciq: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(long_answers, "ITEM_SEP", " ")  # the fake backend's text has no lines
    argv = ["--data", str(sciq), "--form", "controlled", "--limit", "1",
            "--cache", str(tmp_path / "cache"), "--n-resamples", "20"]  # fmt: skip
    long_answers.main(argv, guard=guard("unused"))
    [only] = records(tmp_path / "cache", "controlled")
    firsts = {q: a.split(".")[0] + "." for q, a in ALONE.items()}  # each answer's first sentence
    assert only["parts"] == [firsts[q] for q in only["questions"]]
    assert only["answer"] == " ".join(f"{i}. {p}" for i, p in enumerate(only["parts"], 1))
    right = {ROWS[0][0]: "right", ROWS[1][0]: "right", ROWS[2][0]: "wrong"}
    got = [(s["question"], s["label"]) for s in only["sentences"]]
    assert got == [(i, right[q]) for i, q in enumerate(only["questions"])]


def test_rag_labels_a_decline_right_for_an_unanswerable_question(tmp_path: Path) -> None:
    qas = [
        {"question": "Who built it?", "id": "a", "answers": [{"text": "Eiffel"}]},
        {"question": "When did it fall?", "id": "b", "answers": [], "is_impossible": True},
    ]
    squad = {"data": [{"paragraphs": [{"context": "Eiffel built the tower.", "qas": qas}]}]}
    path = tmp_path / "squad2" / "dev.json"
    path.parent.mkdir()
    path.write_text(json.dumps(squad), encoding="utf-8")
    argv = ["--data", str(path), "-k", "2", "--cache", str(tmp_path / "cache"),
            "--n-resamples", "20"]  # fmt: skip
    figures = long_answers.main(argv, guard=guard("1. Eiffel built it. 2. I don't know."))
    assert list(figures) == ["rag"]  # SQuAD 2.0 data: the RAG form
    [only] = records(tmp_path / "cache", "rag")
    assert only["unanswerable"] == [1]
    assert [s["label"] for s in only["sentences"]] == ["right", "right"]
    assert (
        "Passage: Eiffel built the tower."
        in long_answers.rendered(long_answers.prompts_of(path, "rag", 2, None)[0]).to_string()
    )


@pytest.mark.integration
def test_the_embedded_model_answers_one_prompt_with_scored_aligned_sentences(
    sciq: Path, tmp_path: Path
) -> None:
    from esi_guard import LlamaCppBackend

    model = ESIGuard(backend=LlamaCppBackend.default(n_threads=1), threshold=0.25,
                     max_new_tokens=96)  # fmt: skip
    argv = ["--data", str(sciq), "--form", "closed-book", "--limit", "1",
            "--cache", str(tmp_path / "cache"), "--n-resamples", "20"]  # fmt: skip
    long_answers.main(argv, guard=model)
    [only] = records(tmp_path / "cache", "closed-book")
    assert only["scored"] and only["sentences"]
    assert "".join(s["text"] for s in only["sentences"]) == only["answer"]
    for s in only["sentences"]:
        assert s["score"] >= 0 and s["nll"] >= 0 and s["max_nll"] >= 0
        assert s["whole_score"] == only["score"]
        assert s["label"] in ("right", "wrong", "unaligned", "question")
