"""Labelled QA examples: the public QA sets' own formats (SciQ, SQuAD 2.0...), any JSONL/CSV.

Known formats (SciQ, TruthfulQA, NQ-open, TriviaQA, SQuAD 2.0, your own ``question``/``answers``/
``wrong``) are recognised by their fields, tabulated in docs/calibration.md; any other file needs
``question_field`` and ``answers_field`` (optionally ``incorrect_field``). A CSV cell is split on
``answers_sep`` (TruthfulQA's ``"; "``), so ``8|eight`` needs ``answers_sep="|"``. SQuAD 2.0 keeps
each passage (``Example.context``); an unanswerable question has no gold answer (the right reply
declines). Known wrong answers (``Example.incorrect``) serve the semantic and LLM-judge labels.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esi_guard.exceptions import InputError

__all__ = [
    "DEFAULT_ANSWERS_SEP",
    "Example",
    "dataset_hash",
    "load_examples",
    "load_files",
    "load_questions",
]

_KNOWN = [("question", "answers", "wrong"), ("query", "truthful answer", None),
          ("question", "answer", None), ("context", "aliases", None),
          ("Question", "Correct Answers", "Incorrect Answers")]  # fmt: skip
"""Each known format's question, gold answers and known wrong answers fields."""
DEFAULT_ANSWERS_SEP = "; "
"""What separates the answers of a CSV cell (TruthfulQA's separator)."""


@dataclass(frozen=True)
class Example:
    """One labelled question."""

    question: str
    answers: tuple[str, ...]
    """Gold answers; a prediction matching any of them is right."""
    incorrect: tuple[str, ...] = ()
    """Known wrong answers, where the data set has them (TruthfulQA)."""
    context: str | None = None
    """The passage the question is asked about (SQuAD 2.0); None for closed-book sets."""

    @property
    def answerable(self) -> bool:
        """False for a question its passage does not answer (no gold answer)."""
        return bool(self.answers)


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(encoding="utf-8-sig", newline="") as handle:  # -sig: TruthfulQA's BOM
            for number, row in enumerate(csv.DictReader(handle), start=2):
                yield number, dict(row)
        return
    if suffix not in (".jsonl", ".json"):
        msg = f"{path}: expected a .jsonl or .csv file"
        raise InputError(msg)
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                msg = f"{path}:{number}: not valid JSON ({exc.msg})"
                raise InputError(msg) from exc
            if not isinstance(record, dict):
                msg = f"{path}:{number}: expected a JSON object per line"
                raise InputError(msg)
            yield number, record


def _fields(
    record: dict[str, Any], question: str | None, answers: str | None, incorrect: str | None
) -> tuple[str, str, str | None]:
    if question and answers:
        return question, answers, incorrect
    for known_q, known_a, known_wrong in _KNOWN:
        if known_q in record and known_a in record:
            return question or known_q, answers or known_a, incorrect or known_wrong
    msg = (
        f"unknown format (fields {sorted(record)}): pass the question and answers fields "
        "(--question-field, --answers-field)"
    )
    raise InputError(msg)


def _question(value: Any) -> str:
    text = str(value).strip()
    if text.startswith("Question:") and text.endswith("Answer:"):  # TriviaQA's context
        text = text.removeprefix("Question:").removesuffix("Answer:").strip()
    return text


def _answers(value: Any, sep: str | None) -> tuple[str, ...]:
    if isinstance(value, str):
        parts = value.split(sep) if sep else [value]
    elif isinstance(value, list):
        parts = [str(v) for v in value]
    else:
        parts = []
    return tuple(p.strip() for p in parts if p and p.strip())


def load_examples(
    path: str | Path,
    *,
    question_field: str | None = None,
    answers_field: str | None = None,
    incorrect_field: str | None = None,
    limit: int | None = None,
    seed: int | None = None,
    answers_sep: str = DEFAULT_ANSWERS_SEP,
) -> list[Example]:
    """The examples of a file, shuffled with ``seed`` (if given) and cut to ``limit``.

    Raises:
        InputError: A missing or unreadable file, an unknown format without field names, or a
            row without a question or gold answer (named by line).
    """
    where = Path(path)
    if not where.is_file():
        msg = f"data file not found: {where}"
        raise InputError(msg)
    if not answers_sep:
        msg = "the answers separator must not be empty"
        raise InputError(msg)
    sep = answers_sep if where.suffix.lower() == ".csv" else None
    squad = _squad(where)
    if squad is not None:
        return _shuffled(squad, limit, seed)
    examples = []
    fields: tuple[str, str, str | None] | None = None
    for number, record in _rows(where):
        fields = fields or _fields(record, question_field, answers_field, incorrect_field)
        q_field, a_field, wrong_field = fields
        if q_field not in record or a_field not in record:
            msg = f"{where}:{number}: missing field {q_field!r} or {a_field!r}"
            raise InputError(msg)
        if incorrect_field and incorrect_field not in record:
            msg = f"{where}:{number}: missing field {incorrect_field!r}"
            raise InputError(msg)
        question = _question(record[q_field])
        answers = _answers(record[a_field], sep)
        if not question or not answers:
            msg = f"{where}:{number}: empty question or no gold answer"
            raise InputError(msg)
        wrong = record.get(wrong_field) if wrong_field else None
        examples.append(Example(question, answers, _answers(wrong, sep)))
    if not examples:
        msg = f"{where}: no examples"
        raise InputError(msg)
    return _shuffled(examples, limit, seed)


def load_questions(
    path: str | Path,
    *,
    question_field: str | None = None,
    limit: int | None = None,
    seed: int | None = None,
) -> list[Example]:
    """A file's questions, no labels read (``esi-guard distill``); SQuAD 2.0 keeps its passages.

    Shuffled with ``seed`` and cut to ``limit`` as :func:`load_examples` does.

    Raises:
        InputError: A missing or unreadable file, a row without the question field, or none.
    """
    where = Path(path)
    if not where.is_file():
        msg = f"data file not found: {where}"
        raise InputError(msg)
    squad = _squad(where)
    if squad is not None:
        return _shuffled(squad, limit, seed)
    known = [question_field] if question_field else list(dict.fromkeys(q for q, _, _ in _KNOWN))
    examples = []
    for number, record in _rows(where):
        field_name = next((name for name in known if name in record), None)
        if field_name is None:
            msg = f"{where}:{number}: no question field (looked for {known}; pass --question-field)"
            raise InputError(msg)
        question = _question(record[field_name])
        if not question:
            msg = f"{where}:{number}: empty question"
            raise InputError(msg)
        examples.append(Example(question, ()))
    if not examples:
        msg = f"{where}: no questions"
        raise InputError(msg)
    return _shuffled(examples, limit, seed)


def load_files(paths: Sequence[str | Path], **options: Any) -> list[Example]:
    """Several files' examples in order, each read by :func:`load_examples` with ``options``."""
    if not paths:
        msg = "no data file given"
        raise InputError(msg)
    return [example for path in paths for example in load_examples(path, **options)]


def _shuffled(examples: list[Example], limit: int | None, seed: int | None) -> list[Example]:
    if seed is not None:
        random.Random(seed).shuffle(examples)
    return examples[:limit] if limit else examples


def _squad(path: Path) -> list[Example] | None:
    """The examples of a SQuAD 2.0 JSON file, or None when ``path`` is not one."""
    if path.suffix.lower() != ".json":
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None  # maybe JSON lines in a .json file: read as such
    articles = document.get("data") if isinstance(document, dict) else None
    if not isinstance(articles, list) or not all(
        isinstance(a, dict) and isinstance(a.get("paragraphs"), list) for a in articles
    ):
        msg = f"{path}: a JSON file must be SQuAD 2.0 (data[].paragraphs[]) or JSON lines"
        raise InputError(msg)
    examples = []
    for a, article in enumerate(articles):
        for p, paragraph in enumerate(article["paragraphs"]):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            context = paragraph.get("context")
            if not isinstance(context, str) or not context.strip():
                msg = f"{where}: no context"
                raise InputError(msg)
            for q, qa in enumerate(paragraph.get("qas", [])):
                question = str(qa.get("question", "")).strip()
                texts = [str(x.get("text", "")).strip() for x in qa.get("answers", [])]
                answers = tuple(dict.fromkeys(t for t in texts if t))
                if not question or (not answers and not qa.get("is_impossible")):
                    msg = f"{where}.qas[{q}]: empty question, or no answer and not is_impossible"
                    raise InputError(msg)
                examples.append(Example(question, answers, context=context))
    if not examples:
        msg = f"{path}: no examples"
        raise InputError(msg)
    return examples


def dataset_hash(examples: list[Example]) -> str:
    """SHA-256 of the examples (questions, answers, known wrong answers and passages)."""
    digest = hashlib.sha256()
    for example in examples:
        fields: list[object] = [example.question, list(example.answers)]
        if example.incorrect:
            fields.append(list(example.incorrect))
        if example.context is not None:
            fields.append({"context": example.context})
        digest.update(json.dumps(fields).encode())
    return digest.hexdigest()
