"""An in-package fake backend for tests and examples, like ``httpx.MockTransport``.

No model: answers come from a mapping, tokens are words, logits are seeded (same call, same
numbers); a variant moves them by ``sensitivity`` (one identical to the question does not).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from esi_guard._keywords import strict_keywords
from esi_guard.backends._engine_helpers import stopped_length
from esi_guard.backends._types import Forced, ForcingRequest, Generation, Messages
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import FINAL, HiddenSpec, HiddenStates, reduce_hidden
from esi_guard.exceptions import BackendError
from esi_guard.scoring import TopK

__all__ = ["FakeBackend"]

_EOS = 0


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _question(prompt: Messages) -> str:
    """The last user message that is not an agent's folded tool results."""
    for message in reversed(prompt):
        if message["role"] == "user" and not message["content"].startswith("Tool result ("):
            return message["content"]
    return ""


class FakeBackend(Backend):
    """A deterministic backend with scripted answers and scripted sensitivity.

    ``calls`` records ``(method, batch size)`` for each call, so tests can check batching.

    Args:
        answers: Question text -> answer text.
        default_answer: Answer to any question not in ``answers``.
        sensitivity: Question text -> how far its distributions move under intervention.
        default_sensitivity: Sensitivity of questions not in ``sensitivity``.
        vocab_size: Size of the fake vocabulary (grows to fit the answers' words).
        error: If set, every call raises it (to test failure handling).
        failures: Question text -> ``"generate"``/``"teacher_force"`` (that step returns a
            :class:`BackendError` for that question alone) or ``"nan"`` (NaN forced values).
    """

    @strict_keywords
    def __init__(
        self,
        answers: Mapping[str, str] | None = None,
        *,
        default_answer: str = "I do not know.",
        sensitivity: Mapping[str, float] | None = None,
        default_sensitivity: float = 0.0,
        vocab_size: int = 128,
        error: Exception | None = None,
        failures: Mapping[str, Literal["generate", "teacher_force", "nan"]] | None = None,
    ) -> None:
        self.answers = dict(answers or {})
        self.default_answer = default_answer
        self.sensitivity = dict(sensitivity or {})
        self.default_sensitivity = default_sensitivity
        self.vocab_size = vocab_size
        self.error = error
        self.failures = dict(failures or {})
        self.calls: list[tuple[str, int]] = []
        self._words: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        """The fake's identity."""
        return "fake"

    def _ids(self, text: str) -> list[int]:
        with self._lock:
            return [self._words.setdefault(word, len(self._words) + 1) for word in text.split()]

    def _decode(self, ids: Sequence[int]) -> str:
        names = {index: word for word, index in self._words.items()}
        return " ".join(names[i] for i in ids)

    def _topk(self, answer: Sequence[int], top_k: int, noise: float, variant: str) -> TopK:
        size = max(self.vocab_size, len(self._words) + 2)
        rows = []
        for t, target in enumerate([*answer]):
            logits = np.random.default_rng(_seed("base", *answer[:t])).normal(size=size)
            logits[target] = logits.max() + 1.0
            if noise:
                logits += noise * np.random.default_rng(_seed("noise", variant, t)).normal(
                    size=size
                )
            rows.append(logits)
        full = np.asarray(rows, dtype=np.float64).reshape(len(rows), size)
        order = np.argsort(-full, axis=-1, kind="stable")[:, :top_k]
        return TopK(order, np.take_along_axis(full, order, axis=-1))

    def _record(self, method: str, size: int) -> None:
        self.calls.append((method, size))
        if self.error is not None:
            raise self.error

    provider = "fake"

    hidden_size = 8
    """Width of the fake's hidden states."""

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """Four fake blocks and the final norm."""
        return (0, 1, 2, 3, FINAL)

    def _hidden(self, question: str, spec: HiddenSpec, n: int) -> HiddenStates:
        """States that carry the question's sensitivity: a probe can learn it back."""
        level = self.sensitivity.get(question, self.default_sensitivity)
        rows = {
            layer: np.stack([
                np.random.default_rng(_seed("hidden", question, str(layer), str(t))).normal(
                    size=self.hidden_size
                ) + level * (layer + 2)
                for t in range(max(n, 1))
            ])
            for layer in spec.layers
        }  # fmt: skip
        return reduce_hidden(spec, rows, n)

    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> list[Generation | BackendError]:
        """Scripted answers, cut at ``max_new_tokens`` words or before a stop sequence."""
        self.check_hidden(hidden)
        self._record("generate", len(prompts))
        results: list[Generation | BackendError] = []
        for prompt in prompts:
            question = _question(prompt)
            if self.failures.get(question) == "generate":
                results.append(BackendError(f"scripted generate failure for {question!r}"))
                continue
            ids = self._ids(self.answers.get(question, self.default_answer))
            finish: Literal["stop", "length"] = "length" if len(ids) > max_new_tokens else "stop"
            ids = ids[:max_new_tokens]
            kept = stopped_length(ids, self._decode, stop)
            if kept is not None:
                ids, finish = ids[:kept], "stop"
            results.append(
                Generation(
                    text=self._decode(ids),
                    token_ids=tuple(ids),
                    topk=self._topk(ids, top_k, 0.0, question),
                    finish_reason=finish,
                    prompt_tokens=sum(len(m["content"].split()) for m in prompt),
                    hidden=None if hidden is None else self._hidden(question, hidden, len(ids)),
                )
            )
        return results

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Distributions that move with the question's sensitivity."""
        self._record("teacher_force", len(requests))
        results: list[Forced | BackendError] = []
        for request in requests:
            question = _question(request.prompt)
            if self.failures.get(question) == "teacher_force":
                results.append(BackendError(f"scripted teacher_force failure for {question!r}"))
                continue
            level = self.sensitivity.get(question, self.default_sensitivity)
            answer = list(request.answer_ids)
            variants = []
            for variant in request.variants:
                text = _question(variant)
                variants.append(self._topk(answer, top_k, 0.0 if text == question else level, text))
            original = (
                self._topk(answer, top_k, 0.0, question) if request.include_original else None
            )
            if self.failures.get(question) == "nan":
                variants = [TopK(v.ids, np.full_like(v.values, np.nan)) for v in variants]
            states = None
            if request.hidden is not None and request.include_original:
                self.check_hidden(request.hidden)
                states = self._hidden(question, request.hidden, len(answer))
            results.append(Forced(variants=variants, original=original, hidden=states))
        return results

    def decode(self, ids: Sequence[int]) -> str:
        """The words of ``ids``, space-separated (as the fake's answers are)."""
        return self._decode(ids)

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """Word ids of the answer."""
        return self._ids(answer)
