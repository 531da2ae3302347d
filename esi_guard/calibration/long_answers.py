"""Long answers with a label per sentence, from the QA sets' questions and gold answers.

A :class:`LongPrompt` asks ``k`` questions at once, one numbered sentence each. ESI intervenes
only on the numbered questions: render :attr:`LongPrompt.template` with
``ESIGuard.with_prompt(..., question_key="questions")``, so the instructions and any passage are
the same bytes in every variant.

Each sentence is aligned to a question (:func:`align`), in order of trust, by ``number`` (it starts
``N.``), ``continued`` (after a numbered one), ``order`` (no numbers and exactly ``k`` sentences)
or ``overlap`` (most shared content words, at least :data:`MIN_OVERLAP`, no tie). Unaligned,
wordless and asking (``?``) sentences are counted and left out of every metric. A sentence is
right when it contains a gold answer, or declines an unanswerable question (as
:class:`~esi_guard.calibration.labels.Declines` labels answers), so a second sentence that does
not repeat the answer is wrong. Intervals draw a prompt's sentences together (:func:`clustered`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from esi_guard.calibration.data import Example
from esi_guard.calibration.labels import Containment, declined, normalise
from esi_guard.calibration.metrics import Estimate, bootstrap
from esi_guard.calibration.prompts import DECLINE_PHRASE
from esi_guard.exceptions import InputError

__all__ = [
    "CLOSED_BOOK_TEMPLATE",
    "MIN_OVERLAP",
    "ONE_QUESTION_SYSTEM",
    "RAG_LONG_TEMPLATE",
    "Alignment",
    "LongPrompt",
    "SentenceLabel",
    "align",
    "clustered",
    "group_closed_book",
    "group_rag",
    "joined_answer",
    "label_sentences",
    "numbered",
    "removed_at_kept",
    "sentence_right",
]

CLOSED_BOOK_TEMPLATE = (
    "Answer each numbered question below in one sentence, numbered as its question.\n\n{questions}"
)
"""The closed-book prompt: one human message, the numbered questions its only variable."""
RAG_LONG_TEMPLATE = (
    "Answer each numbered question using only the passage below, in one sentence each, "
    "numbered as its question. If the passage does not contain the answer to a question, "
    f"answer it exactly: {DECLINE_PHRASE}\n\nPassage: {{context}}\n\nQuestions:\n{{questions}}"
)
"""The RAG prompt: the passage before the questions (the variants share its prefix), and
the fixed decline phrase of the single-question RAG template."""
ONE_QUESTION_SYSTEM = "Answer the question in one sentence."
"""The controlled form asks each question alone after this system prompt."""
MIN_OVERLAP = 2
"""Content words a sentence must share with a question to be aligned to it by overlap."""

How = Literal["number", "continued", "order", "overlap"]
_NUMBER = re.compile(r"^\s*(?:\*\*)?(?:Q(?:uestion)?\s*)?(\d{1,2})\s*[.):](?!\d)")
"""An item number (``2.``, ``2)``, ``**Q2:``), not a decimal or a time (``1.5``, ``10:30``)."""
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    re.findall(
        r"\w+",
        "what which who whom whose when where why how that this these those with from into "
        "does have been were they them their there than then also only about called known "
        "most more many much some such each other type kind",
    )
)


@dataclass(frozen=True)
class LongPrompt:
    """``k`` questions asked in one prompt (for RAG, about one passage)."""

    examples: tuple[Example, ...]
    """The questions with their gold answers, in the order asked (numbered from 1)."""
    template: str
    """The prompt template: ``{questions}`` and, for RAG, ``{context}``."""

    @property
    def questions(self) -> tuple[str, ...]:
        """The questions, in the order asked."""
        return tuple(e.question for e in self.examples)

    @property
    def question_text(self) -> str:
        """The numbered questions: the template's ``{questions}``, the intervened text."""
        return numbered(self.questions)

    @property
    def context(self) -> str | None:
        """The passage the questions are asked about (RAG); None closed-book."""
        return self.examples[0].context

    @property
    def unanswerable(self) -> tuple[int, ...]:
        """The indices of the questions the passage does not answer (no gold answer)."""
        return tuple(i for i, e in enumerate(self.examples) if not e.answerable)

    def variables(self) -> dict[str, str]:
        """The template's variables: ``questions``, and ``context`` for RAG."""
        values = {"questions": self.question_text}
        if self.context is not None:
            values["context"] = self.context
        return values

    def text(self) -> str:
        """The rendered human message."""
        return self.template.format(**self.variables())


def numbered(items: Sequence[str]) -> str:
    """``1. first`` ... one per line, each item on one line."""
    return "\n".join(f"{i}. {' '.join(item.split())}" for i, item in enumerate(items, start=1))


def _chunks(examples: Sequence[Example], k: int) -> list[tuple[Example, ...]]:
    return [tuple(examples[i : i + k]) for i in range(0, len(examples) - k + 1, k)]


def _check_k(k: int) -> None:
    if not 1 <= k <= 9:
        msg = f"questions per prompt must be 1 to 9, got {k}"
        raise InputError(msg)


def group_closed_book(
    examples: Sequence[Example], k: int, template: str = CLOSED_BOOK_TEMPLATE
) -> list[LongPrompt]:
    """Consecutive groups of ``k`` questions, one prompt each (a short last group dropped)."""
    _check_k(k)
    if any(e.context is not None for e in examples):
        msg = "closed-book prompts take questions without passages: use group_rag for SQuAD 2.0"
        raise InputError(msg)
    return [LongPrompt(chunk, template) for chunk in _chunks(examples, k)]


def group_rag(
    examples: Sequence[Example], k: int, template: str = RAG_LONG_TEMPLATE
) -> list[LongPrompt]:
    """Per passage, its questions in groups of ``k``, in data order (a short last group dropped)."""
    _check_k(k)
    passages: dict[str, list[Example]] = {}
    for example in examples:
        if example.context is None:
            msg = "RAG prompts need questions with passages (SQuAD 2.0)"
            raise InputError(msg)
        passages.setdefault(example.context, []).append(example)
    return [
        LongPrompt(chunk, template) for group in passages.values() for chunk in _chunks(group, k)
    ]


def joined_answer(answers: Sequence[str], sep: str = "\n") -> tuple[str, list[tuple[int, int]]]:
    """Answers asked one at a time, numbered into one answer (alignment known), and their spans."""
    text, spans = "", []
    for i, answer in enumerate(answers, start=1):
        text += sep if text else ""
        start = len(text)
        text += f"{i}. {' '.join(answer.split())}"
        spans.append((start, len(text)))
    return text, spans


@dataclass(frozen=True)
class Alignment:
    """The question a sentence answers (0-based), and how that was found."""

    question: int | None
    how: How | None


def _body(sentence: str) -> str:
    """The sentence less its item number and markdown bold: what it says."""
    found = _NUMBER.match(sentence)
    return (sentence[found.end() :] if found else sentence).lstrip(" \t\n*")


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(normalise(text)) if len(w) > 3 and w not in _STOP}


def _number(sentence: str, k: int) -> int | None:
    found = _NUMBER.match(sentence)
    if found is None:
        return None
    n = int(found.group(1))
    return n - 1 if 1 <= n <= k else None


def _overlap(sentence: str, question_words: list[set[str]]) -> int | None:
    shared = [len(_words(sentence) & words) for words in question_words]
    best = max(shared, default=0)
    if best < MIN_OVERLAP or shared.count(best) > 1:
        return None
    return shared.index(best)


def align(
    answer: str,
    spans: Sequence[tuple[int, int]],
    questions: Sequence[str],
    items: Sequence[tuple[int, int]] | None = None,
) -> list[Alignment]:
    """One alignment per sentence span of ``answer`` (see the module docstring).

    ``items``: each question's answer span, if known (:func:`joined_answer`): then a sentence
    belongs to the item its first word lies in.
    """
    texts = [answer[start:end] for start, end in spans]
    content = [bool(_WORD.search(_body(t).lower())) for t in texts]
    if items is not None:
        return [_in_item(start, text, items) if ok else Alignment(None, None)
                for (start, _), text, ok in zip(spans, texts, content, strict=True)]  # fmt: skip
    k = len(questions)
    numbers = [_number(t, k) for t in texts]
    unnumbered = all(_NUMBER.match(t) is None for t in texts)
    by_order = unnumbered and sum(content) == k
    question_words = [_words(q) for q in questions]
    out: list[Alignment] = []
    current: int | None = None  # the question of the numbered item being continued
    for i, (text, ok, number) in enumerate(zip(texts, content, numbers, strict=True)):
        if number is not None:
            current = number
        elif _NUMBER.match(text):  # a number out of range ends the item
            current = None
        if not ok:
            out.append(Alignment(None, None))
        elif number is not None:
            out.append(Alignment(number, "number"))
        elif current is not None:
            out.append(Alignment(current, "continued"))
        elif by_order:
            out.append(Alignment(sum(content[:i]), "order"))
        else:
            best = _overlap(text, question_words)
            out.append(Alignment(best, "overlap" if best is not None else None))
    return out


def _in_item(start: int, text: str, items: Sequence[tuple[int, int]]) -> Alignment:
    first = start + len(text) - len(text.lstrip())
    for index, (low, high) in enumerate(items):
        if low <= first < high:
            return Alignment(index, "number")
    return Alignment(None, None)


def sentence_right(sentence: str, example: Example) -> bool:
    """Whether a sentence answers its question right; its item number (``2.``) is not part of it."""
    text = _body(sentence)
    if not example.answerable:
        return declined(text)
    if declined(text, example.answers):
        return False
    return Containment().right(text, example.answers)


@dataclass(frozen=True)
class SentenceLabel:
    """A sentence's alignment and, where aligned, whether it is right."""

    question: int | None
    how: How | None
    right: bool | None
    """None where not aligned, or where the sentence asks."""
    asks: bool = False
    """The sentence ends in ``?``: a question echoed back, not a claim to label."""


def label_sentences(
    prompt: LongPrompt,
    answer: str,
    spans: Sequence[tuple[int, int]],
    items: Sequence[tuple[int, int]] | None = None,
) -> list[SentenceLabel]:
    """Each sentence of ``answer`` aligned to a question of ``prompt`` and labelled."""
    out = []
    alignments = align(answer, spans, prompt.questions, items)
    for (start, end), where in zip(spans, alignments, strict=True):
        text = answer[start:end]
        asks = text.rstrip().endswith("?")
        right = None
        if where.question is not None and not asks:
            right = sentence_right(text, prompt.examples[where.question])
        out.append(SentenceLabel(where.question, where.how, right, asks))
    return out


def clustered(
    statistic: Callable[[NDArray[np.int_]], float],
    clusters: ArrayLike,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Estimate:
    """``statistic`` of the sentence indices, with an interval resampling whole clusters.

    ``clusters``: a label per sentence (its prompt); each resample draws whole prompts.
    """
    labels = np.asarray(clusters)
    members = [np.flatnonzero(labels == label) for label in np.unique(labels)]
    ids = np.arange(len(members), dtype=np.float64)

    def over_prompts(picked: NDArray[np.float64], _: NDArray[np.int_]) -> float:
        return statistic(np.concatenate([members[int(i)] for i in picked]))

    return bootstrap(over_prompts, ids, np.zeros(len(members), dtype=np.int_),
                     n_resamples=n_resamples, seed=seed)  # fmt: skip


def removed_at_kept(
    scores: ArrayLike, wrong: ArrayLike, folds: ArrayLike, kept: float = 0.8
) -> NDArray[np.bool_]:
    """Which items a threshold fitted out of fold removes, keeping ``kept`` of the right.

    Per fold, the threshold is the ``kept`` quantile of the other folds' right items' scores.
    Withholding whole answers is this with each sentence given its answer's score.
    """
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(wrong).astype(bool)
    f = np.asarray(folds)
    removed = np.zeros(s.size, dtype=bool)
    for fold in np.unique(f):
        inside = f == fold
        fit = s[~inside & ~w]
        if fit.size == 0:
            msg = f"no right item outside fold {fold} to fit a threshold on"
            raise ValueError(msg)
        threshold = float(np.quantile(fit, kept, method="higher"))
        removed[inside] = s[inside] > threshold
    return removed
