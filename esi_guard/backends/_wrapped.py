"""A backend that is another one: every call and property passed on to ``inner``.

Passing on every :class:`~esi_guard.backends.base.Backend` member means a wrapper never silently
falls back to a default its ``inner`` overrides.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import HiddenSpec

__all__ = ["Wrapped"]


class Wrapped(Backend):
    """Every member of :class:`Backend` is ``inner``'s; subclasses change some."""

    @property
    @abstractmethod
    def inner(self) -> Backend:
        """The backend every call goes to."""

    @property
    def model_id(self) -> str:
        """``inner``'s."""
        return self.inner.model_id

    @property
    def approximate(self) -> bool:
        """``inner``'s."""
        return self.inner.approximate

    @property
    def engine(self) -> str:
        """``inner``'s."""
        return self.inner.engine

    @property
    def model_sha256(self) -> str | None:
        """``inner``'s."""
        return self.inner.model_sha256

    @property
    def hidden_layers(self) -> tuple[int, ...] | None:
        """``inner``'s."""
        return self.inner.hidden_layers

    @property
    def hidden_size(self) -> int | None:
        """``inner``'s."""
        return self.inner.hidden_size

    def check_hidden(self, spec: HiddenSpec | None) -> None:
        """``inner``'s."""
        self.inner.check_hidden(spec)

    # Calls pass their arguments on as given (keywords an older backend lacks stay unsent).
    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.generate`."""
        return self.inner.generate(*args, **kwargs)

    async def agenerate(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.agenerate`."""
        return await self.inner.agenerate(*args, **kwargs)

    def stream_generate(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.stream_generate`."""
        return self.inner.stream_generate(*args, **kwargs)

    def astream_generate(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.astream_generate`."""
        return self.inner.astream_generate(*args, **kwargs)

    def stream_tokens(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.stream_tokens`."""
        return self.inner.stream_tokens(*args, **kwargs)

    def teacher_force(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.teacher_force`."""
        return self.inner.teacher_force(*args, **kwargs)

    async def ateacher_force(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.ateacher_force`."""
        return await self.inner.ateacher_force(*args, **kwargs)

    def open_forcing(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.open_forcing`."""
        return self.inner.open_forcing(*args, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.decode`."""
        return self.inner.decode(*args, **kwargs)

    def encode_answer(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.encode_answer`."""
        return self.inner.encode_answer(*args, **kwargs)

    def token_offsets(self, *args: Any, **kwargs: Any) -> Any:
        """``inner``'s :meth:`~Backend.token_offsets`."""
        return self.inner.token_offsets(*args, **kwargs)
