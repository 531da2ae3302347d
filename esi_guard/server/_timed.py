"""A backend that times the one it wraps: the ``generate`` and ``force`` steps' seconds.

Timed here, as no callback sees them inside ``abatch``. All else is the wrapped backend's
(:class:`~esi_guard.backends._wrapped.Wrapped`), so a threshold file matches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from esi_guard.backends import Backend
from esi_guard.backends._wrapped import Wrapped

__all__ = ["TimedBackend"]


class TimedBackend(Wrapped):
    """``inner``, with each call's seconds handed to ``observe(step, seconds)``."""

    def __init__(self, inner: Backend, observe: Callable[[str, float], None]) -> None:
        self._inner = inner
        self._observe = observe
        self.provider = inner.provider  # type: ignore[misc]
        self.values_kind = inner.values_kind  # type: ignore[misc]

    @property
    def inner(self) -> Backend:
        """The wrapped backend: every call not timed here is its."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @contextmanager
    def _timed(self, step: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._observe(step, time.perf_counter() - started)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped backend's, timed as ``generate``."""
        with self._timed("generate"):
            return self._inner.generate(*args, **kwargs)

    async def agenerate(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped backend's, timed as ``generate``."""
        with self._timed("generate"):
            return await self._inner.agenerate(*args, **kwargs)

    def teacher_force(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped backend's, timed as ``force``."""
        with self._timed("force"):
            return self._inner.teacher_force(*args, **kwargs)

    async def ateacher_force(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped backend's, timed as ``force``."""
        with self._timed("force"):
            return await self._inner.ateacher_force(*args, **kwargs)

    def __repr__(self) -> str:
        return f"TimedBackend({self._inner!r})"
