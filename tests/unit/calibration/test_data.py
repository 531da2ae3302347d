"""Loading labelled QA data: every shared format, field names, CSV separators, several
files, seeded shuffles, the dataset hash, and the docs' example of a user's own data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from esi_guard import InputError
from esi_guard.calibration import thresholds
from esi_guard.calibration.data import dataset_hash, load_examples, load_files


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_loaders_read_every_shared_format(tmp_path: Path) -> None:
    sciq = write_jsonl(tmp_path / "sciq.jsonl", [{"query": "Q1?", "truthful answer": ["a"]}])
    nq = write_jsonl(tmp_path / "nq.jsonl", [{"question": "q2", "answer": ["b", "c"]}])
    trivia = write_jsonl(
        tmp_path / "t.jsonl",
        [{"context": "Question: Who?\nAnswer:", "answer": "D", "aliases": ["D", "dee"]}],
    )
    csv = tmp_path / "TruthfulQA.csv"
    csv.write_text(
        "\ufeffType,Question,Best Answer,Correct Answers,Incorrect Answers\n"
        'Adversarial,Why?,Because,"Because; No reason",Magic; Fate\n',
        encoding="utf-8",
    )
    custom = write_jsonl(
        tmp_path / "custom.jsonl", [{"prompt": "Q?", "gold": "x", "false": ["y", "z"]}]
    )
    assert load_examples(sciq)[0].answers == ("a",)
    assert load_examples(nq)[0].answers == ("b", "c")
    assert load_examples(trivia)[0].question == "Who?"
    assert load_examples(csv)[0].answers == ("Because", "No reason")
    assert load_examples(csv)[0].incorrect == ("Magic", "Fate")
    assert load_examples(sciq)[0].incorrect == ()
    named = {"question_field": "prompt", "answers_field": "gold"}
    assert load_examples(custom, **named)[0].answers == ("x",)
    assert load_examples(custom, **named, incorrect_field="false")[0].incorrect == ("y", "z")
    with pytest.raises(InputError, match="missing field 'wrong'"):
        load_examples(custom, **named, incorrect_field="wrong")
    with pytest.raises(InputError, match="--question-field"):
        load_examples(custom)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"query": "q", "truthful answer": ["a"]}\n{oops\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"broken\.jsonl:2"):
        load_examples(broken)
    with pytest.raises(InputError, match="not found"):
        load_examples(tmp_path / "missing.jsonl")


def test_the_question_answers_wrong_shape_is_known_without_field_names(tmp_path: Path) -> None:
    rows = [
        {"question": "Who wrote Hamlet?", "answers": ["Shakespeare"], "wrong": ["Marlowe"]},
        {"question": "Capital of Peru?", "answers": ["Lima"], "wrong": []},
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    first, second = load_examples(path)
    assert first.answers == ("Shakespeare",) and first.incorrect == ("Marlowe",)
    assert second.incorrect == ()
    csv = tmp_path / "mine.csv"
    csv.write_text("question,answers,wrong\nHow many legs has a spider?,8; eight,6\n")
    assert load_examples(csv)[0].answers == ("8", "eight")
    assert load_examples(csv)[0].incorrect == ("6",)


def test_csv_answers_split_on_the_separator_given(tmp_path: Path) -> None:
    csv = tmp_path / "qa.csv"
    csv.write_text("q,a,bad\nHow many legs has a spider?,8|eight,6|six\n")
    named = {"question_field": "q", "answers_field": "a", "incorrect_field": "bad"}
    assert load_examples(csv, **named)[0].answers == ("8|eight",)
    split = load_examples(csv, **named, answers_sep="|")[0]
    assert split.answers == ("8", "eight") and split.incorrect == ("6", "six")
    jsonl = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answers": "8|eight"}])
    assert load_examples(jsonl, answers_sep="|")[0].answers == ("8|eight",)  # CSV only
    with pytest.raises(InputError, match="separator"):
        load_examples(csv, **named, answers_sep="")


def test_several_files_concatenate_in_order_each_cut_and_shuffled_apart(tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", [{"question": f"a{i}", "answer": ["x"]}
                                              for i in range(10)])  # fmt: skip
    second = write_jsonl(tmp_path / "b.jsonl", [{"query": f"b{i}", "truthful answer": ["y"]}
                                                for i in range(10)])  # fmt: skip
    both = load_files([first, second], limit=3, seed=4)
    assert both == load_examples(first, limit=3, seed=4) + load_examples(second, limit=3, seed=4)
    assert [e.question[0] for e in both] == ["a"] * 3 + ["b"] * 3
    assert dataset_hash(both) != dataset_hash(load_files([second, first], limit=3, seed=4))
    with pytest.raises(InputError, match="no data file"):
        load_files([])


def test_loader_shuffles_with_a_seed_and_the_hash_follows_the_examples(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": [str(i)]} for i in range(20)]
    path = write_jsonl(tmp_path / "nq.jsonl", rows)
    first = load_examples(path, seed=1, limit=5)
    assert first == load_examples(path, seed=1, limit=5)
    assert first != load_examples(path, limit=5)
    assert dataset_hash(first) == dataset_hash(load_examples(path, seed=1, limit=5))
    assert dataset_hash(first) != dataset_hash(load_examples(path, seed=2, limit=5))


def test_the_docs_example_of_a_users_own_data_loads() -> None:
    path = Path(__file__).resolve().parents[3] / "docs" / "examples" / "my_qa.jsonl"
    examples = load_examples(path)  # the documented shape: no field names needed
    assert examples == load_examples(
        path, question_field="question", answers_field="answers", incorrect_field="wrong"
    )
    # Enough for the risk rule the README shows (all right would need this many).
    needed = thresholds.min_accepted(0.3, 0.1, thresholds.risk_tests(len(examples)))
    assert 60 <= len(examples) <= 80 and len(examples) > 3 * needed
    assert len({e.question for e in examples}) == len(examples)
    assert all(e.answers and e.incorrect for e in examples)
