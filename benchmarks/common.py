"""What the benchmarks share: how a question is asked, stage timing, log-probabilities.

Also where a data file is (:func:`data_file`) and :func:`side_by_side`, the one
guarded/plain timing loop.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchmarks.shared_data import shared_data
from esi_guard.backends import ChatMessage, Generation
from esi_guard.calibration.prompts import DEFAULT_SYSTEM

__all__ = [
    "FEW_SHOT",
    "FEW_SHOT_TEMPLATE",
    "Answering",
    "Clock",
    "SideBySide",
    "data_file",
    "llamacpp_backend",
    "side_by_side",
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


def data_file(name: str) -> Path:
    """``name`` if it is a file, else its path in the shared data (``sciq/test.jsonl``...)."""
    return Path(name) if Path(name).is_file() else shared_data() / name


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


class SideBySide(NamedTuple):
    """What :func:`side_by_side` measured: seconds per question, and each guard's metadata."""

    one_at_a_time: dict[str, float]
    """Mean seconds a question, each question through every arm in turn."""
    batched: dict[str, float]
    """Seconds a question in batches of ``batch``."""
    metas: dict[str, list[dict[str, Any]]]
    """Each guard's ``response_metadata["esi"]`` per question, one at a time."""

    def ratios(self) -> dict[str, dict[str, float]]:
        """Guarded/plain, one at a time and batched."""
        one, batched = self.one_at_a_time, self.batched
        return {
            "ratio_one": {k: one[k] / one["plain"] for k in self.metas},
            "ratio_batched": {k: batched[k] / batched["plain"] for k in self.metas},
        }


def side_by_side(
    plain: Any, guards: dict[str, Any], prompts: Sequence[Any], *, max_new_tokens: int,
    batch: int = 8,
) -> SideBySide:  # fmt: skip
    """Time a plain backend's answers (with their top-100) against guards, side by side.

    A warm-up call each; then each question through the plain backend and every guard in
    turn (``invoke``), then each arm's ``batch`` (``generate`` for the plain one) over all
    questions in chunks of ``batch``.
    """
    args = {"max_new_tokens": max_new_tokens, "top_k": 100}
    plain.generate(prompts[:1], **args)
    for guard in guards.values():
        guard.invoke(prompts[0])
    seconds: dict[str, list[float]] = {"plain": []} | {key: [] for key in guards}
    metas: dict[str, list[dict[str, Any]]] = {key: [] for key in guards}
    for prompt in prompts:
        start = time.perf_counter()
        plain.generate([prompt], **args)
        seconds["plain"].append(time.perf_counter() - start)
        for key, guard in guards.items():
            start = time.perf_counter()
            message = guard.invoke(prompt)
            seconds[key].append(time.perf_counter() - start)
            metas[key].append(message.response_metadata["esi"])
    batched = {}
    calls = {"plain": lambda chunk: plain.generate(chunk, **args)}
    calls |= {key: guard.batch for key, guard in guards.items()}
    for key, call in calls.items():
        start = time.perf_counter()
        for i in range(0, len(prompts), batch):
            call(prompts[i : i + batch])
        batched[key] = (time.perf_counter() - start) / len(prompts)
    one = {key: float(np.mean(values)) for key, values in seconds.items()}
    return SideBySide(one, batched, metas)


def llamacpp_backend(model: str, **kwargs: Any) -> Any:
    """A one-thread llama.cpp backend of ``model``.

    ``default`` (the embedded model), a known model's name (fetched on first use) or a
    ``.gguf`` path; ``kwargs`` go to ``from_path``.
    """
    from esi_guard.backends import known_model_path
    from esi_guard.backends.llamacpp import LlamaCppBackend

    if model == "default":
        return LlamaCppBackend.default(n_threads=1, **kwargs)
    path = model if model.endswith(".gguf") else str(known_model_path(model, fetch=True))
    return LlamaCppBackend.from_path(path, n_threads=1, **kwargs)
