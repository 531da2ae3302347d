"""A backend that times the one it wraps: the ``generate`` and ``force`` steps' seconds.

The guard's batched call runs its steps inside ``abatch``, where no callback sees their
timing (they are replayed into each prompt's run afterwards); the backend's own calls are
where the time goes, so the server times them here. Everything else is the wrapped
backend's: its identity, value kind and hidden states, so a threshold file matches it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from typing import Any

from esi_guard.backends import (
    Backend,
    Forced,
    ForcingRequest,
    Generation,
    HiddenSpec,
    Messages,
)
from esi_guard.exceptions import BackendError

__all__ = ["TimedBackend"]


class TimedBackend(Backend):
    """``inner``, with each call's seconds handed to ``observe(step, seconds)``."""

    def __init__(self, inner: Backend, observe: Callable[[str, float], None]) -> None:
        self.inner = inner
        self._observe = observe
        self.provider = inner.provider  # type: ignore[misc]
        self.values_kind = inner.values_kind  # type: ignore[misc]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def model_id(self) -> str:
        """The wrapped backend's."""
        return self.inner.model_id

    @property
    def approximate(self) -> bool:
        """The wrapped backend's."""
        return self.inner.approximate

    @property
    def engine(self) -> str:
        """The wrapped backend's."""
        return self.inner.engine

    @property
    def model_sha256(self) -> str | None:
        """The wrapped backend's."""
        return self.inner.model_sha256

    @property
    def hidden_layers(self) -> tuple[int, ...] | None:
        """The wrapped backend's."""
        return self.inner.hidden_layers

    @property
    def hidden_size(self) -> int | None:
        """The wrapped backend's."""
        return self.inner.hidden_size

    def check_hidden(self, spec: HiddenSpec | None) -> None:
        """The wrapped backend's."""
        self.inner.check_hidden(spec)

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """The wrapped backend's."""
        return self.inner.encode_answer(prompt, answer)

    def token_offsets(self, ids: Sequence[int], text: str) -> list[int] | None:
        """The wrapped backend's."""
        return self.inner.token_offsets(ids, text)

    def _timed(self, step: str, started: float) -> None:
        self._observe(step, time.perf_counter() - started)

    def generate(
        self, prompts: Sequence[Messages], *, max_new_tokens: int, top_k: int,
        stop: Sequence[str] = (), hidden: HiddenSpec | None = None,
    ) -> Sequence[Generation | BackendError]:  # fmt: skip
        """The wrapped backend's, timed as ``generate``."""
        started = time.perf_counter()
        extra = {} if hidden is None else {"hidden": hidden}
        try:
            return self.inner.generate(
                prompts, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
            )
        finally:
            self._timed("generate", started)

    async def agenerate(
        self, prompts: Sequence[Messages], *, max_new_tokens: int, top_k: int,
        stop: Sequence[str] = (), hidden: HiddenSpec | None = None,
    ) -> Sequence[Generation | BackendError]:  # fmt: skip
        """The wrapped backend's, timed as ``generate``."""
        started = time.perf_counter()
        extra = {} if hidden is None else {"hidden": hidden}
        try:
            return await self.inner.agenerate(
                prompts, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
            )
        finally:
            self._timed("generate", started)

    def stream_generate(
        self, prompt: Messages, *, max_new_tokens: int, top_k: int,
        stop: Sequence[str] = (), hidden: HiddenSpec | None = None,
    ) -> Generator[str | Generation | BackendError, None, None]:  # fmt: skip
        """The wrapped backend's (a live stream's generation is not timed as a step)."""
        extra = {} if hidden is None else {"hidden": hidden}
        return self.inner.stream_generate(
            prompt, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )

    def astream_generate(
        self, prompt: Messages, *, max_new_tokens: int, top_k: int,
        stop: Sequence[str] = (), hidden: HiddenSpec | None = None,
    ) -> AsyncIterator[str | Generation | BackendError]:  # fmt: skip
        """The wrapped backend's."""
        extra = {} if hidden is None else {"hidden": hidden}
        return self.inner.astream_generate(
            prompt, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """The wrapped backend's, timed as ``force``."""
        started = time.perf_counter()
        try:
            return self.inner.teacher_force(requests, top_k=top_k)
        finally:
            self._timed("force", started)

    async def ateacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """The wrapped backend's, timed as ``force``."""
        started = time.perf_counter()
        try:
            return await self.inner.ateacher_force(requests, top_k=top_k)
        finally:
            self._timed("force", started)

    def __repr__(self) -> str:
        return f"TimedBackend({self.inner!r})"
