"""SQuAD 2.0 data, the decline rule, RAG labels and the paired AUROC difference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from esi_guard import InputError
from esi_guard.calibration.data import dataset_hash, load_examples
from esi_guard.calibration.labels import Containment, Declines, declined
from esi_guard.calibration.metrics import auroc, paired_difference


def squad(path: Path, paragraphs: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "T", "paragraphs":
                                                               paragraphs}]}))  # fmt: skip
    return path


PARAGRAPH = {
    "context": "The Normans gave their name to Normandy, a region in France.",
    "qas": [
        {"question": "In what country is Normandy located?", "id": "a", "is_impossible": False,
         "answers": [{"text": "France", "answer_start": 54}, {"text": "France",
                                                               "answer_start": 54}]},
        {"question": "Who gave their name to France?", "id": "b", "is_impossible": True,
         "answers": [], "plausible_answers": [{"text": "Normans", "answer_start": 4}]},
    ],
}  # fmt: skip


def test_squad_json_is_recognised_by_its_shape(tmp_path: Path) -> None:
    examples = load_examples(squad(tmp_path / "dev.json", [PARAGRAPH]))
    assert [e.question for e in examples] == [q["question"] for q in PARAGRAPH["qas"]]  # type: ignore[index]
    answerable, impossible = examples
    assert answerable.answers == ("France",) and answerable.answerable  # duplicates merged
    assert impossible.answers == () and not impossible.answerable
    assert answerable.context == impossible.context == PARAGRAPH["context"]
    other = dict(PARAGRAPH, context="Another passage.")
    assert dataset_hash(examples) != dataset_hash(
        load_examples(squad(tmp_path / "o.json", [other]))
    )


def test_bad_squad_files_are_named_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"SQuAD 2\.0"):
        load_examples(squad(tmp_path / "a.json", "not a list"))  # type: ignore[arg-type]
    (tmp_path / "b.json").write_text(json.dumps({"data": [{"title": "no paragraphs"}]}))
    with pytest.raises(InputError, match=r"SQuAD 2\.0"):
        load_examples(tmp_path / "b.json")
    empty = dict(PARAGRAPH, context=" ")
    with pytest.raises(InputError, match=r"paragraphs\[0\]: no context"):
        load_examples(squad(tmp_path / "c.json", [empty]))
    lost = {"context": "x", "qas": [{"question": "Why?", "answers": []}]}
    with pytest.raises(InputError, match=r"qas\[0\].*is_impossible"):
        load_examples(squad(tmp_path / "d.json", [lost]))


# Replies of the embedded SmolLM2-135M-Instruct to SQuAD 2.0 questions under the CLI's RAG
# template (from the benchmark's cache), and the canned decline.
DECLINES = [
    "I don't know",
    "I don't know.",
    "The passage does not provide information about the types of engines that can use",
    "The passage does not mention the name of the network.",
    "It is not mentioned in the passage.",
    "There is no information in the passage about the date.",
    "The context doesn\u2019t say.",
    "Unknown.",
    "The answer cannot be determined from the passage.",
]
ANSWERS = [
    "The answer to this question is: 21 February 1804",
    "The UK banned Sundays due to the embargo.",
    "The Byzantine naval base of Dyrrachium did not fall to the Normans.",
    "James Watt was the inventor of the steam engine.",
    "The Normans besieged Dyrrachium in 1107.",
    "The Lavietes Pavillion has 5 stories.",
    "No, the steam engine was not invented in Britain.",
]


@pytest.mark.parametrize("reply", DECLINES)
def test_declines_are_recognised(reply: str) -> None:
    assert declined(reply)


@pytest.mark.parametrize("reply", ANSWERS)
def test_answers_are_not_declines(reply: str) -> None:
    assert not declined(reply)


def test_rag_labels() -> None:
    labeller = Declines(Containment())
    questions = ["q"] * 5
    replies = ["I don't know", "Paris is the capital", "I don't know", "Lyon", "It is Paris"]
    gold: list[tuple[str, ...]] = [(), (), ("Paris",), ("Paris",), ("Paris",)]
    # unanswerable: declined right, made up wrong; answerable: declined wrong, wrong answer
    # wrong, contained gold right.
    assert labeller.label(questions, replies, gold) == [True, False, False, False, True]
    assert labeller.name == "declines+containment"


def test_paired_difference_is_zero_for_the_same_scores_and_signed() -> None:
    rng = np.random.default_rng(0)
    wrong = rng.integers(0, 2, 200)
    good = wrong + rng.normal(0, 0.5, 200)
    noise = rng.normal(0, 1, 200)
    same = paired_difference(auroc, good, good, wrong, n_resamples=200)
    assert same.value == same.low == same.high == 0
    better = paired_difference(auroc, good, noise, wrong, n_resamples=200)
    assert better.value == pytest.approx(auroc(good, wrong) - auroc(noise, wrong))
    assert 0 < better.low < better.value < better.high
    with pytest.raises(ValueError, match="same length"):
        paired_difference(auroc, good, noise[:10], wrong)
