"""Labels on the shared QA sets: an item number is not the answer, a gold 'None' is an
answer, a judge's quoted verdict is its verdict (each test failed before its fix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.shared_data import SharedDataMissing
from benchmarks.shared_data import shared_data as find_shared_data
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.labels import Declines, LLMJudge, declined
from esi_guard.calibration.long_answers import (
    CLOSED_BOOK_TEMPLATE,
    RAG_LONG_TEMPLATE,
    LongPrompt,
    align,
    label_sentences,
    sentence_right,
)
from esi_guard.sentences import split_sentences


def _shared() -> Path:
    try:
        return find_shared_data()
    except SharedDataMissing:
        pytest.skip("shared data missing")


# --- long answers: the item number is not the answer ----------------------------------


def test_a_numeric_answer_is_aligned() -> None:
    """ "2. 1990." answers question 2: a number is a word, only the item number goes."""
    answer = "1. Darwin proposed it.\n2. 1990.\n3. 42."
    spans = split_sentences(answer)
    got = align(answer, spans, ["Who?", "When?", "How many?"])
    assert [a.question for a in got] == [0, 1, 2]


def test_a_stray_item_number_is_still_unaligned() -> None:
    answer = "1. Paris.\n2."
    got = align(answer, split_sentences(answer), ["Where?", "What?"])
    assert [a.question for a in got] == [0, None]


def test_a_decimal_is_not_an_item_number() -> None:
    """An unnumbered answer starting "1.5 million" is aligned by order, not to question 1."""
    answer = "It was founded in 1990.\n1.5 million people live there.\nParis is the capital."
    got = align(answer, split_sentences(answer), ["When?", "How many?", "Capital?"])
    assert [(a.question, a.how) for a in got] == [(0, "order"), (1, "order"), (2, "order")]


def test_the_item_number_does_not_match_a_gold_number() -> None:
    """Question 1's gold "1": "1. Earth has two moons." must not be right by its "1."."""
    moons = Example("How many moons does Earth have?", ("1",))
    assert sentence_right("1. Earth has two moons.", moons) is False
    assert sentence_right("1. Earth has 1 moon.", moons) is True
    prompt = LongPrompt((moons, Example("Capital of France?", ("Paris",))), CLOSED_BOOK_TEMPLATE)
    answer = "1. Earth has two moons.\n2. Paris."
    labels = label_sentences(prompt, answer, split_sentences(answer))
    assert [label.right for label in labels] == [False, True]


@pytest.mark.parametrize("reply", ["Unknown.", "None.", "N/A"])
def test_a_numbered_whole_reply_decline(reply: str) -> None:
    """ "2. Unknown." declines the unanswerable question 2, as "Unknown." alone does."""
    unanswerable = Example("B?", (), context="passage")
    assert sentence_right(f"2. {reply}", unanswerable) is True
    prompt = LongPrompt((Example("A?", ("France",), context="passage"), unanswerable),
                        RAG_LONG_TEMPLATE)  # fmt: skip
    answer = f"1. France.\n2. {reply}"
    labels = label_sentences(prompt, answer, split_sentences(answer))
    assert [label.right for label in labels] == [True, True]


# --- Declines: a gold answer that reads as a decline ----------------------------------


def test_a_gold_none_answered_none_is_right() -> None:
    assert Declines().label(["How many?"], ["None"], [("None",)]) == [True]
    assert Declines().label(["How many?"], ["None"], [()]) == [True]  # unanswerable
    assert Declines().label(["How many?"], ["I don't know"], [("None",)]) == [False]
    assert sentence_right("3. None.", Example("How many?", ("None",), context="p")) is True
    assert declined("None.") and not declined("None.", ["None"])  # the one rule both use
    assert declined("I don't know.", ["None"])


def test_squad_gold_none_is_labelled_right() -> None:
    """SQuAD 2.0 dev: "How many original treaties ... protected fundamental rights?" None."""
    examples = load_examples(_shared() / "squad2" / "dev.json")
    hit = [e for e in examples if e.answers == ("None",)]
    assert len(hit) == 1
    assert Declines().label([hit[0].question], ["None."], [hit[0].answers]) == [True]


# --- LLMJudge: the verdict past quotes and markdown ---------------------------------


class _Replies:
    def __init__(self, replies: list[str]) -> None:
        self.replies = replies

    def batch(self, prompts: list[str]) -> list[str]:
        return self.replies[: len(prompts)]


@pytest.mark.parametrize(
    ("reply", "right"),
    [("Correct", True), ("correct.", True), (" CORRECT", True), ("**Correct**", True),
     ('"correct"', True), ("'Correct'", True), ("`correct`", True), ("Incorrect", False),
     ("**Incorrect**", False), ('"incorrect"', False), ("Correctness: no", False), ("", False)],
)  # fmt: skip
def test_judge_verdict(reply: str, right: bool) -> None:
    assert LLMJudge(_Replies([reply])).label(["q"], ["p"], [("a",)]) == [right]
