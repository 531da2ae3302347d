"""Semantic-preserving interventions: a question in, ``n`` intervened questions out.

:class:`SkipOneChar` (SOC, the paper's), :class:`Typo` (a keyboard neighbour instead),
:class:`Paraphrase` (few-shot, by any LangChain chat model or runnable) and :class:`FixedVariants`
(precomputed, topped up with SOC). Variants depend only on the question text, ``n`` and the seed,
so batched and one-by-one calls see the same ones. Only letters form words: digits (all numerals),
punctuation and whitespace never change, so numbers, units and dates keep their meaning; a
letter's combining marks (accents, Indic vowel signs) go with it, never onto another letter.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from esi_guard._keywords import strict_keywords
from esi_guard._text import NEIGHBOURS, Word, message_text, question_words
from esi_guard.exceptions import ConfigurationError, InputError, InterventionError

__all__ = [
    "PARAPHRASE_PROMPT",
    "FixedVariants",
    "Intervention",
    "Paraphrase",
    "SkipOneChar",
    "Typo",
    "rebuild_intervention",
]

T = TypeVar("T")

_REPHRASE = re.compile(r"^\s*\**\s*Rephrase\s*\d+\s*\**\s*:\s*\**\s*(.+?)\s*$", re.MULTILINE)
_SPACES = re.compile(r"\s+")


def _rng(seed: int, question: str) -> random.Random:
    """A generator that depends only on the seed and the question text."""
    return random.Random(f"{seed}\x1f{question}")


def _normalise(text: str) -> str:
    return _SPACES.sub(" ", text).strip().casefold().rstrip("?.!")


def _distinct(candidates: Sequence[str], question: str) -> list[str]:
    """Candidates in order, without repeats or copies of the question."""
    seen = {_normalise(question)}
    kept = []
    for candidate in candidates:
        key = _normalise(candidate)
        if key and key not in seen:
            seen.add(key)
            kept.append(candidate.strip())
    return kept


def strict(cls: type[T]) -> type[T]:
    """Refuse unknown keywords to a dataclass's generated ``__init__`` (a ConfigurationError)."""
    cls.__init__ = strict_keywords(cls.__init__)  # type: ignore[method-assign]
    return cls


class Intervention(ABC):
    """Turns a question into ``n`` semantic-preserving variants."""

    name: ClassVar[str] = "intervention"
    """Short name recorded in results and threshold files."""

    @abstractmethod
    def variants(self, question: str, n: int, *, seed: int = 0) -> list[str]:
        """Return up to ``n`` variants of ``question``.

        Fewer (even none) where the question allows no more; some may copy it or each other:
        callers check.
        """

    def batch_variants(self, questions: Sequence[str], n: int, *, seed: int = 0) -> list[list[str]]:
        """Variants of several questions; override to batch remote calls."""
        return [self.variants(question, n, seed=seed) for question in questions]

    async def abatch_variants(
        self, questions: Sequence[str], n: int, *, seed: int = 0
    ) -> list[list[str]]:
        """Async :meth:`batch_variants`; runs the sync one in a worker thread by default."""
        return await asyncio.to_thread(self.batch_variants, questions, n, seed=seed)

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable description, for metadata and threshold files."""
        return {"name": self.name}


TRIES = 20
"""Draws a character edit makes for one variant before it gives up on a new one."""


@dataclass(frozen=True)
class _CharacterEdit(Intervention):
    """Edits one character at a position >= ``min_chars`` of eligible words."""

    p: float = 0.3
    """Chance an eligible word is edited (``words="random"``), or the share edited (``"exact"``)."""
    min_chars: int = 3
    """M*: a word's first ``min_chars`` characters, and words no longer, are never edited."""
    words: Literal["random", "exact"] = "random"
    """``"random"``: each eligible word edited with chance ``p`` (the paper's text); ``"exact"``:
    ``ceil(p * eligible)`` distinct words, at least one (the authors' code)."""
    distinct: bool = True
    """Redraw (up to :data:`TRIES` times) a copy of the question or an earlier variant, else give
    fewer than ``n``; ``False``: ``n`` independent draws, whose copies score 0 in ESI's mean."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            msg = f"p must lie in [0, 1], got {self.p!r}"
            raise ConfigurationError(msg)
        if self.min_chars < 1:
            msg = f"min_chars must be >= 1 (a word is never removed whole), got {self.min_chars!r}"
            raise ConfigurationError(msg)
        if self.words not in ("random", "exact"):
            msg = f"words must be 'random' or 'exact', got {self.words!r}"
            raise ConfigurationError(msg)

    def _edit(self, chars: list[str], position: int, rng: random.Random) -> str:
        """The word ``chars`` (a letter and its marks each) with ``chars[position]`` edited."""
        raise NotImplementedError

    def _apply(self, question: str, words: list[Word], rng: random.Random) -> str:
        eligible = [word for word in words if len(word[2]) > self.min_chars]
        chosen: set[int] | None = None
        if self.words == "exact":
            count = min(len(eligible), max(1, math.ceil(self.p * len(eligible))))
            chosen = set(rng.sample(range(len(eligible)), count))
        parts, end = [], 0
        for index, (start, stop, chars) in enumerate(eligible):
            # "random" draws each word's coin just before its edit, so a seed's variants hold.
            if index not in chosen if chosen is not None else rng.random() >= self.p:
                continue
            position = rng.randrange(self.min_chars, len(chars))
            parts += [question[end:start], self._edit(chars, position, rng)]
            end = stop
        return "".join([*parts, question[end:]])

    def variants(self, question: str, n: int, *, seed: int = 0) -> list[str]:
        """Up to ``n`` edited copies of ``question`` (``n`` unless ``distinct`` runs out)."""
        rng = _rng(seed, question)
        words = question_words(question)
        if not self.distinct:
            return [self._apply(question, words, rng) for _ in range(n)]
        seen, out = {question}, list[str]()
        while len(out) < n:
            for _ in range(TRIES):
                text = self._apply(question, words, rng)
                if text not in seen:
                    seen.add(text)
                    out.append(text)
                    break
            else:  # the question allows no other variant (or hardly any)
                break
        return out

    def describe(self) -> dict[str, Any]:
        """Name and parameters."""
        return {"name": self.name, "p": self.p, "min_chars": self.min_chars,
                "words": self.words, "distinct": self.distinct}  # fmt: skip


@strict
@dataclass(frozen=True)
class SkipOneChar(_CharacterEdit):
    """Skip-One-Char (SOC), the paper's: drop a word's character at uniform ``[M*, len(word))``."""

    name: ClassVar[str] = "skip_one_char"

    def _edit(self, chars: list[str], position: int, rng: random.Random) -> str:
        return "".join(chars[:position] + chars[position + 1 :])


@strict
@dataclass(frozen=True)
class Typo(_CharacterEdit):
    """Keyboard typo: SOC, but a QWERTY neighbour (case kept; off the grid: any a-z) replaces it."""

    name: ClassVar[str] = "typo"

    def _edit(self, chars: list[str], position: int, rng: random.Random) -> str:
        char = chars[position]
        near = NEIGHBOURS.get(char.lower(), "abcdefghijklmnopqrstuvwxyz")
        new = rng.choice(near)
        return "".join([*chars[:position], new.upper() if char.isupper() else new,
                        *chars[position + 1 :]])  # fmt: skip


PARAPHRASE_PROMPT = """\
In this task, you will receive a single question, and your goal is to generate multiple \
versions of it that convey the same meaning as the original. Please format your responses \
as follows:
Rephrase 1: [Your rephrased question]
Rephrase 2: [Another rephrased question]
Rephrase 3: [Yet another rephrased question]
....
Ensure that each rephrased question is distinct from the others.

Here are two examples:
Question: When did the manhattan project began and end?
Rephrase 1: What were the start and end dates of the Manhattan Project?
Rephrase 2: The manhattan project began and ended in ?
Rephrase 3: What were the starting and ending dates of the Manhattan Project?
Rephrase 4: Can you tell me when the Manhattan Project started and concluded?
Rephrase 5: When was the Manhattan Project initiated and concluded?
Rephrase 6: What time period does the Manhattan Project cover, from start to finish?
Rephrase 7: Can you provide the beginning and ending dates of the Manhattan Project?


Question: Who played george washington in the john adams series?
Rephrase 1: In the John Adams series, who portrayed George Washington?
Rephrase 2: In the John Adams series, which actor portrayed George Washington?
Rephrase 3: Who portrayed George Washington in the John Adams series?
Rephrase 4: Which actor took on the role of George Washington in the John Adams series?
Rephrase 5: In the series about John Adams, who acted as George Washington?
Rephrase 6: Who was cast as George Washington in the John Adams series?
Rephrase 7: Who took on the role of George Washington in the John Adams series?

Question: {query}"""
"""The paper's paraphrase prompt (appendix "Prompt Templates")."""


def parse_rephrasings(text: str) -> list[str]:
    """The questions on ``Rephrase i:`` lines, in order."""
    return [match.group(1) for match in _REPHRASE.finditer(text)]


def _failed(exc: Exception) -> InterventionError:
    """The paraphrasing model's failure, as the guard's ``intervention_error``."""
    if isinstance(exc, InterventionError):
        return exc
    return InterventionError(f"the paraphrasing model failed: {type(exc).__name__}: {exc}")


@strict
@dataclass(frozen=True)
class Paraphrase(Intervention):
    """LLM paraphrases by the paper's few-shot prompt, a shortfall topped up with ``fill`` (SOC)."""

    llm: Any
    """Any LangChain chat model or runnable taking a string."""
    max_calls: int = 3
    """Most calls to the model per question (fewer once a call adds nothing new)."""
    prompt: str = PARAPHRASE_PROMPT
    """Prompt with a ``{query}`` placeholder."""
    fill: Intervention = field(default_factory=SkipOneChar)
    """Intervention that tops up a shortfall of paraphrases."""
    name: ClassVar[str] = "paraphrase"

    def __post_init__(self) -> None:
        if not hasattr(self.llm, "batch"):
            msg = f"llm must be a LangChain runnable or chat model, got {type(self.llm).__name__}"
            raise ConfigurationError(msg)
        if "{query}" not in self.prompt:
            msg = "prompt must contain a {query} placeholder"
            raise ConfigurationError(msg)

    def _finish(
        self, questions: Sequence[str], found: list[list[str]], n: int, seed: int
    ) -> list[list[str]]:
        result = []
        for question, kept in zip(questions, found, strict=True):
            rng = _rng(seed, question)
            chosen = rng.sample(kept, n) if len(kept) > n else kept
            shortfall = n - len(chosen)
            result.append(
                chosen + (self.fill.variants(question, shortfall, seed=seed) if shortfall else [])
            )
        return result

    def _absorb(
        self,
        questions: Sequence[str],
        found: list[list[str]],
        pending: list[int],
        outputs: Sequence[Any],
        n: int,
    ) -> list[int]:
        """Add new paraphrases; return the questions that still need more."""
        still = []
        for index, output in zip(pending, outputs, strict=True):
            before = len(found[index])
            try:
                text = message_text(output, skip_other_blocks=True)
            except InputError as exc:
                raise _failed(exc) from exc
            found[index] = _distinct(found[index] + parse_rephrasings(text), questions[index])
            if before < len(found[index]) < n:
                still.append(index)
        return still

    def batch_variants(self, questions: Sequence[str], n: int, *, seed: int = 0) -> list[list[str]]:
        """Paraphrase all questions, calling the model in batches."""
        found: list[list[str]] = [[] for _ in questions]
        pending = list(range(len(questions))) if n > 0 else []
        for _ in range(self.max_calls):
            if not pending:
                break
            try:
                outputs = self.llm.batch([self.prompt.format(query=questions[i]) for i in pending])
            except Exception as exc:
                raise _failed(exc) from exc
            pending = self._absorb(questions, found, pending, outputs, n)
        return self._finish(questions, found, n, seed)

    async def abatch_variants(
        self, questions: Sequence[str], n: int, *, seed: int = 0
    ) -> list[list[str]]:
        """Async :meth:`batch_variants`, through the model's ``abatch``."""
        found: list[list[str]] = [[] for _ in questions]
        pending = list(range(len(questions))) if n > 0 else []
        for _ in range(self.max_calls):
            if not pending:
                break
            try:
                outputs = await self.llm.abatch(
                    [self.prompt.format(query=questions[i]) for i in pending]
                )
            except Exception as exc:
                raise _failed(exc) from exc
            pending = self._absorb(questions, found, pending, outputs, n)
        return self._finish(questions, found, n, seed)

    def variants(self, question: str, n: int, *, seed: int = 0) -> list[str]:
        """Paraphrase one question."""
        return self.batch_variants([question], n, seed=seed)[0]

    def describe(self) -> dict[str, Any]:
        """Name, model and fill."""
        return {
            "name": self.name,
            "llm": type(self.llm).__name__,
            "max_calls": self.max_calls,
            "fill": self.fill.describe(),
        }


@strict
@dataclass(frozen=True)
class FixedVariants(Intervention):
    """Precomputed paraphrases, looked up by exact, then whitespace- and case-normalised text.

    More than ``n`` are sampled (seeded); fewer are topped up by ``fill`` (SOC by default), as the
    paper does. With ``strict=True`` a question missing from the mapping is an :class:`InputError`.
    """

    paraphrases: Mapping[str, Sequence[str]]
    """Question text -> its paraphrases."""
    fill: Intervention = field(default_factory=SkipOneChar)
    """Intervention that tops up a shortfall of paraphrases."""
    strict: bool = False
    """Raise on a question that has no entry instead of filling all variants."""
    name: ClassVar[str] = "fixed_variants"
    _index: dict[str, Sequence[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {_normalise(question): texts for question, texts in self.paraphrases.items()}
        object.__setattr__(self, "_index", index)

    @classmethod
    def from_jsonl(
        cls,
        path: str | Path,
        *,
        question_field: str = "query",
        variants_field: str = "paraphrases",
        **kwargs: Any,
    ) -> FixedVariants:
        """Load paraphrases from a JSONL file such as ``sciq/paraphrase.jsonl``."""
        mapping: dict[str, list[str]] = {}
        with Path(path).open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                try:
                    mapping[str(record[question_field])] = [str(v) for v in record[variants_field]]
                except (KeyError, TypeError) as exc:
                    msg = (
                        f"{path}:{line_number}: expected fields {question_field!r} (text) and "
                        f"{variants_field!r} (list of texts)"
                    )
                    raise ConfigurationError(msg) from exc
        return cls(mapping, **kwargs)

    def variants(self, question: str, n: int, *, seed: int = 0) -> list[str]:
        """Up to ``n`` stored paraphrases, topped up by ``fill``."""
        stored = self.paraphrases.get(question)
        if stored is None:
            stored = self._index.get(_normalise(question))
        if stored is None and self.strict:
            msg = f"no precomputed paraphrases for question {question[:80]!r}"
            raise InputError(msg)
        kept = _distinct(list(stored or ()), question)
        if len(kept) > n:
            kept = _rng(seed, question).sample(kept, n)
        shortfall = n - len(kept)
        return kept + (self.fill.variants(question, shortfall, seed=seed) if shortfall else [])

    def describe(self) -> dict[str, Any]:
        """Name, size and fill."""
        return {"name": self.name, "questions": len(self.paraphrases), "fill": self.fill.describe()}


def rebuild_intervention(description: Mapping[str, Any]) -> Intervention:
    """An intervention from its ``describe()`` (a threshold file's); only SOC and Typo can be."""
    kinds: dict[str, type[SkipOneChar] | type[Typo]] = {
        SkipOneChar.name: SkipOneChar,
        Typo.name: Typo,
    }
    kind = kinds.get(str(description.get("name")))
    if kind is None:
        msg = (
            f"the threshold file was calibrated with the intervention {description!r}, "
            "which cannot be rebuilt from the file: pass intervention=... "
        )
        raise ConfigurationError(msg)
    # A file without ``words``/``distinct`` was calibrated with independent draws: rebuild so.
    return kind(p=float(description["p"]), min_chars=int(description["min_chars"]),
                words=description.get("words", "random"),
                distinct=bool(description.get("distinct", False)))  # fmt: skip
