"""What the benchmark scripts share: how a question is asked, stage timing, log-probabilities."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from esi_guard.backends import ChatMessage, Generation
from esi_guard.calibration.prompts import DEFAULT_SYSTEM

__all__ = [
    "FEW_SHOT",
    "FEW_SHOT_TEMPLATE",
    "Answering",
    "Clock",
    "token_entropies",
    "token_logprobs",
]

FEW_SHOT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% else %}Question: {{ m['content'] }}\nAnswer:{% endif %}{% endfor %}"
)
"""A base model's prompt (``--few-shot``): the instruction and worked examples, then
``Question: ...`` and ``Answer:`` for the model to go on; the question is still the user
message alone, so ESI's variants edit it and nothing else."""

FEW_SHOT = (
    "\n\nQuestion: What is the capital of France?\nAnswer: Paris"
    "\n\nQuestion: Which gas do plants take in for photosynthesis?\nAnswer: carbon dioxide"
    "\n\nQuestion: Who wrote Hamlet?\nAnswer: William Shakespeare"
)
"""Three worked examples after the instruction (none from the shared sets)."""


@dataclass(frozen=True)
class Answering:
    """How the model is asked a question and how its answer ends."""

    max_new_tokens: int = 24
    system: str = DEFAULT_SYSTEM
    """The system message: the paper's QA instruction (as the CLI uses it)."""
    stop: tuple[str, ...] = ()
    """Where an answer ends besides end-of-sequence (``("\\n",)`` for a base model)."""

    @classmethod
    def few_shot(cls, max_new_tokens: int = 24) -> Answering:
        """A base model's settings: worked examples after the instruction, one line each."""
        return cls(max_new_tokens, DEFAULT_SYSTEM + FEW_SHOT, ("\n",))

    def messages(self, question: str) -> list[ChatMessage]:
        """The question's prompt: the instruction as system message, the question as user's."""
        return [ChatMessage(role="system", content=self.system),
                ChatMessage(role="user", content=question)]  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """What a cache header records of it (the default's as before ``stop`` existed)."""
        out: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "system": self.system}
        return out | ({"stop": list(self.stop)} if self.stop else {})


class Clock:
    """Wall seconds per named stage, summed over a data set."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the block's wall time to ``name``."""
        start = time.perf_counter()
        yield
        self.seconds[name] += time.perf_counter() - start


def token_logprobs(gen: Generation) -> list[float]:
    """The greedy tokens' log-probabilities, normalised over the top-100 logits."""
    values = gen.topk.values
    norm = np.logaddexp.reduce(values, axis=1)
    return [float(values[t, 0] - norm[t]) for t in range(len(gen.token_ids))]


def token_entropies(gen: Generation) -> list[float]:
    """The entropy of each answer position's top-100 distribution.

    Their mean is "mean token entropy"; the benchmark's cache keeps them per token so that
    other free signals can be computed later without a new run.
    """
    values = np.asarray(gen.topk.values, dtype=np.float64)[: len(gen.token_ids)]
    logp = values - np.logaddexp.reduce(values, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        terms = np.where(np.isfinite(logp), -np.exp(logp) * logp, 0.0)
    return [float(x) for x in terms.sum(axis=1)]
