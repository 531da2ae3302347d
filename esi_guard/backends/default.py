"""The embedded default model as a backend that loads on first use, once per process.

``ESIGuard(threshold=...)`` with no model uses it, so ``prompt | ESIGuard(threshold=0.3)``
runs as written. It is for trying the guard: a 135M model that is wrong on most
questions. Guards built without a model share one loaded copy; it loads (20-40 s on a
CPU) the first time one of them answers, under a lock, so threads that ask at once wait
for the same load.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

from esi_guard._embedded import EMBEDDED_MODEL_ID
from esi_guard.backends.base import Backend, Forced, ForcingRequest, Generation, Messages
from esi_guard.exceptions import BackendError

if TYPE_CHECKING:
    from esi_guard.backends.hf import HFBackend

__all__ = ["EmbeddedBackend", "embedded_backend"]

_LOCK = threading.Lock()
_LOADED: list[HFBackend] = []


def embedded_backend() -> HFBackend:
    """The process's one loaded copy of the embedded model (loaded now if need be)."""
    with _LOCK:
        if not _LOADED:
            from esi_guard.backends.hf import HFBackend

            _LOADED.append(HFBackend.default())
        return _LOADED[0]


class EmbeddedBackend(Backend):
    """The embedded SmolLM2-135M-Instruct, loaded on first use and shared (see the module)."""

    provider = "huggingface"
    values_kind = "logits"

    @property
    def model_id(self) -> str:
        """The embedded model's identity (known without loading it)."""
        return EMBEDDED_MODEL_ID

    @property
    def loaded(self) -> HFBackend:
        """The shared loaded backend (loads it on first access)."""
        return embedded_backend()

    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
    ) -> list[Generation | BackendError]:
        """See :meth:`HFBackend.generate`."""
        return self.loaded.generate(prompts, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop)

    def stream_generate(
        self, prompt: Messages, *, max_new_tokens: int, top_k: int, stop: Sequence[str] = ()
    ) -> Generator[str | Generation | BackendError, None, None]:
        """See :meth:`HFBackend.stream_generate`."""
        return self.loaded.stream_generate(
            prompt, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop
        )

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """See :meth:`HFBackend.teacher_force`."""
        return self.loaded.teacher_force(requests, top_k=top_k)

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """See :meth:`HFBackend.encode_answer`."""
        return self.loaded.encode_answer(prompt, answer)

    def __repr__(self) -> str:
        state = "loaded" if _LOADED else "not loaded yet"
        return f"EmbeddedBackend({EMBEDDED_MODEL_ID!r}, {state})"
