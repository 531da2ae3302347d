"""The guard's ``stream``: the answer's pieces to the caller while ``invoke`` runs.

It runs the traced ``invoke`` (langchain-core's stream path gives ``_stream`` no run manager, so
child runs would be lost) and hands pieces over through a context-variable sink (``live`` and
``sentences`` modes); the last chunk is the scored message less the text sent. Closing the
stream midway makes the next piece raise inside the guard, which stops generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk

from esi_guard.guard._messages import last_message_chunk

__all__ = ["Last", "Piece", "astream", "emit", "serving", "stream"]

Piece = str | AIMessageChunk
"""A piece of the answer: its text, or a chunk with metadata (a scored sentence)."""
Last = Callable[[AIMessage, str], AIMessageChunk]
"""The last chunk from the scored message and the text already sent."""

_SINK: ContextVar[Callable[[Piece], None] | None] = ContextVar("esi_guard_sink", default=None)
_END = object()


class _Gone(Exception):
    """The caller closed the stream: stop generating."""


def serving() -> bool:
    """Whether a stream is being served (an ``emit`` reaches a caller)."""
    return _SINK.get() is not None


def _chunk(piece: Piece) -> AIMessageChunk:
    return piece if isinstance(piece, AIMessageChunk) else AIMessageChunk(content=piece)


def emit(piece: Piece) -> None:
    """Hand one piece of the answer to the live stream being served, if any."""
    sink = _SINK.get()
    if sink is not None:
        sink(piece)


def stream(
    invoke: Callable[[], AIMessage], last: Last = last_message_chunk
) -> Iterator[AIMessageChunk]:
    """Pieces of ``invoke()``'s answer while it runs in a worker thread, then the rest."""
    pieces: queue.Queue[Any] = queue.Queue()
    gone = threading.Event()
    outcome: dict[str, Any] = {}

    def sink(piece: Piece) -> None:
        if gone.is_set():
            raise _Gone
        pieces.put(piece)

    def work() -> None:
        _SINK.set(sink)
        try:
            outcome["message"] = invoke()
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc
        finally:
            pieces.put(_END)

    thread = threading.Thread(target=work, name="esi-guard-live", daemon=True)
    thread.start()
    sent = ""
    try:
        while (piece := pieces.get()) is not _END:
            chunk = _chunk(piece)
            sent += str(chunk.content)
            yield chunk
    finally:
        gone.set()
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    yield last(outcome["message"], sent)


async def astream(
    ainvoke: Callable[[], Awaitable[AIMessage]], last: Last = last_message_chunk
) -> AsyncIterator[AIMessageChunk]:
    """Async :func:`stream`: ``ainvoke()`` runs as a task; closing the stream cancels it."""
    pieces: asyncio.Queue[Any] = asyncio.Queue()

    async def work() -> AIMessage:
        _SINK.set(pieces.put_nowait)
        try:
            return await ainvoke()
        finally:
            pieces.put_nowait(_END)

    task = asyncio.ensure_future(work())
    sent = ""
    try:
        while (piece := await pieces.get()) is not _END:
            chunk = _chunk(piece)
            sent += str(chunk.content)
            yield chunk
        message = await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    yield last(message, sent)
