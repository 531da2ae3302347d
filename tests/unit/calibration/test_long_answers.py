"""Long answers: k questions per prompt, each sentence aligned to its question and labelled."""

from __future__ import annotations

import re

import numpy as np
import pytest

from esi_guard.calibration import long_answers as la
from esi_guard.calibration.data import Example
from esi_guard.calibration.metrics import auroc
from esi_guard.exceptions import InputError

QUESTIONS = (
    Example("What is the energy released during an earthquake called?", ("seismic energy",)),
    Example("Which type of igneous rock cools rapidly from lava?", ("extrusive", "basalt")),
    Example("What process forms new species besides natural selection?", ("genetic drift",)),
)


def spans(text: str) -> list[tuple[int, int]]:
    """Sentences ending at '. ' or a line break, trailing whitespace kept (as pysbd does)."""
    return [
        (m.start(), m.end())
        for m in re.finditer(r"(?:\d+\.\s)?[^\n.?]*[.?]?\s*", text)
        if m.group()
    ]


def test_a_prompt_numbers_its_questions_and_renders_them_as_the_intervened_variable() -> None:
    prompt = la.group_closed_book(QUESTIONS, 3)[0]
    assert prompt.question_text.splitlines() == [f"{i}. {q}" for i, q in
                                                 enumerate(prompt.questions, 1)]  # fmt: skip
    assert prompt.variables() == {"questions": prompt.question_text}
    assert prompt.text().endswith(prompt.question_text)
    assert prompt.text().startswith("Answer each numbered question")
    assert prompt.context is None and prompt.unanswerable == ()


def test_groups_drop_a_short_last_group_and_refuse_the_wrong_data() -> None:
    assert [len(p.examples) for p in la.group_closed_book(QUESTIONS, 2)] == [2]
    with pytest.raises(InputError, match="1 to 9"):
        la.group_closed_book(QUESTIONS, 0)
    with pytest.raises(InputError, match="group_rag"):
        la.group_closed_book([Example("q", ("a",), context="p")], 1)
    with pytest.raises(InputError, match="passages"):
        la.group_rag(QUESTIONS, 1)


def test_rag_groups_stay_within_a_passage_and_know_the_unanswerable() -> None:
    first = [Example(f"a{i}", ("x",) if i % 2 else (), context="P1") for i in range(5)]
    second = [Example(f"b{i}", ("y",), context="P2") for i in range(3)]
    prompts = la.group_rag([*first, *second], 2)
    assert [p.questions for p in prompts] == [("a0", "a1"), ("a2", "a3"), ("b0", "b1")]
    assert [p.unanswerable for p in prompts] == [(0,), (0,), ()]
    assert prompts[0].variables() == {"questions": "1. a0\n2. a1", "context": "P1"}
    assert "Passage: P1" in prompts[0].text() and "I don't know" in prompts[0].text()


def test_numbered_sentences_align_by_number_and_an_item_continues_on_its_line() -> None:
    answer = ("2. Extrusive rock cools rapidly. It forms basalt.\n"
              "1. It is called seismic energy.\n3. Genetic drift.")  # fmt: skip
    got = la.align(answer, spans(answer), [e.question for e in QUESTIONS])
    assert [(a.question, a.how) for a in got] == [
        (1, "number"), (1, "continued"), (0, "number"), (2, "number")]  # fmt: skip


def test_unnumbered_answers_align_by_order_when_counts_match_else_by_overlap() -> None:
    questions = [e.question for e in QUESTIONS]
    three = "Seismic energy. Extrusive rock. Genetic drift."
    assert [a.how for a in la.align(three, spans(three), questions)] == ["order"] * 3
    two = "The energy released during an earthquake is seismic.\nI like rocks."
    got = la.align(two, spans(two), questions)
    assert [(a.question, a.how) for a in got] == [(0, "overlap"), (None, None)]


def test_a_number_out_of_range_or_a_bare_number_does_not_align_by_number() -> None:
    questions = [e.question for e in QUESTIONS]
    answer = "4. Igneous rock that cools rapidly from lava is extrusive.\n2.\n"
    got = la.align(answer, spans(answer), questions)
    assert [(a.question, a.how) for a in got] == [(1, "overlap"), (None, None)]


def test_labels_are_containment_of_the_question_gold_and_declines_for_the_unanswerable() -> None:
    prompt = la.LongPrompt((*QUESTIONS[:2], Example("Who?", (), context="P")), "{questions}")
    answer = ("1. It is seismic energy.\n2. Intrusive rock. It is basalt.\n"
              "3. The passage does not mention it.")  # fmt: skip
    labels = la.label_sentences(prompt, answer, spans(answer))
    assert [(x.question, x.right) for x in labels] == [(0, True), (1, False), (1, True), (2, True)]
    assert la.sentence_right("I don't know", QUESTIONS[0]) is False
    assert la.sentence_right("It was Darwin.", Example("Who?", ())) is False


def test_the_controlled_form_joins_answers_and_aligns_by_construction() -> None:
    text, items = la.joined_answer(["Seismic  energy. Really.", "Basalt\nrock.", "Drift."])
    assert text == "1. Seismic energy. Really.\n2. Basalt rock.\n3. Drift."
    assert [text[a:b] for a, b in items] == text.split("\n")
    prompt = la.group_closed_book(QUESTIONS, 3)[0]
    labels = la.label_sentences(prompt, text, spans(text), items)
    assert [(x.question, x.how, x.right) for x in labels] == [
        (0, "number", True),
        (0, "number", False),
        (1, "number", True),
        (2, "number", False),
    ]


def test_clustered_resamples_whole_prompts() -> None:
    scores = np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.7])
    wrong = np.array([0, 1, 0, 1, 0, 1])
    prompts = np.array([0, 0, 1, 1, 2, 2])
    seen: list[int] = []

    def statistic(picks: np.ndarray) -> float:
        seen.append(picks.size)
        return auroc(scores[picks], wrong[picks])

    estimate = la.clustered(statistic, prompts, n_resamples=50)
    assert estimate.value == 1.0 and estimate.low == 1.0
    assert set(seen) == {6}  # three prompts of two sentences, drawn whole
    paired = la.clustered(lambda p: auroc(scores[p], wrong[p]) - auroc(-scores[p], wrong[p]),
                          prompts, n_resamples=50)  # fmt: skip
    assert paired.value == 1.0 and paired.low > 0


def test_removed_at_kept_fits_each_fold_on_the_others() -> None:
    rng = np.random.default_rng(0)
    wrong = rng.integers(0, 2, 400)
    scores = wrong + rng.normal(0, 0.5, 400)
    folds = np.arange(400) % 5
    removed = la.removed_at_kept(scores, wrong, folds, kept=0.8)
    kept_right = 1 - removed[wrong == 0].mean()
    assert 0.7 < kept_right < 0.9
    assert removed[wrong == 1].mean() > 0.6  # the score separates them
    flat = la.removed_at_kept(np.zeros(400), wrong, folds)
    assert not flat.any()  # a constant score removes nothing at 80% kept
    with pytest.raises(ValueError, match="no right item"):
        la.removed_at_kept([1.0, 2.0], [1, 0], [0, 1])
