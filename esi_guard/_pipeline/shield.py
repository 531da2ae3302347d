"""Per-input failures: a batched call that fails becomes each input's own error.

So one bad call never takes a batch down, and nothing it failed to produce can pass as
an answer. Configuration and input errors still raise: they are the caller's to fix.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from esi_guard.exceptions import BackendError, ConfigurationError, InputError

__all__ = ["ashield", "shield", "wrapped"]

T = TypeVar("T")


def _checked(out: Sequence[Any], size: int, what: str) -> list[Any]:
    if len(out) != size:
        msg = f"{what} returned {len(out)} results for {size} inputs"
        return [BackendError(msg)] * size
    return list(out)


def wrapped(exc: Exception, what: str, kind: type[BackendError]) -> BackendError:
    """``exc`` as a ``kind`` error naming the step (itself when it already is one)."""
    if isinstance(exc, kind):
        return exc
    error = kind(f"{what} failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def shield(
    call: Callable[[], Sequence[T | BackendError]],
    size: int,
    what: str,
    kind: type[BackendError] = BackendError,
) -> list[T | BackendError]:
    """A batched step's results; a failure of the whole call is each input's ``kind`` error.

    Configuration and input errors still raise: they are the caller's to fix, and no
    answer has been produced that could slip through.
    """
    try:
        return _checked(call(), size, what)
    except (ConfigurationError, InputError):
        raise
    except Exception as exc:  # any engine failure fails closed, per input
        return [wrapped(exc, what, kind)] * size


async def ashield(
    call: Callable[[], Awaitable[Sequence[T | BackendError]]],
    size: int,
    what: str,
    kind: type[BackendError] = BackendError,
) -> list[T | BackendError]:
    """Async :func:`shield` (cancellation still propagates)."""
    try:
        return _checked(await call(), size, what)
    except (ConfigurationError, InputError):
        raise
    except Exception as exc:  # any engine failure fails closed, per input
        return [wrapped(exc, what, kind)] * size
