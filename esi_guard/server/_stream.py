"""Server-sent events: a chat completion's chunks, held until scored or live as generated."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from esi_guard.server._errors import ServeError
from esi_guard.server._schema import ChatRequest, chunk

if TYPE_CHECKING:
    from esi_guard.server._service import Answer, Service

__all__ = ["held_events", "include_usage", "live_events", "sse"]


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def include_usage(chat: ChatRequest) -> bool:
    """Whether the stream ends with a usage chunk (``stream_options.include_usage``)."""
    return chat.stream_options is not None and chat.stream_options.include_usage


def _ending(ident: str, model: str, answer: Answer, rest: str, usage: bool) -> list[str]:
    """The last events: what is left of the content, finish reason with ``esi``, usage."""
    out = [sse(chunk(ident, model, {"content": rest}))] if rest else []
    out.append(sse(chunk(ident, model, {}, finish_reason=answer.finish_reason, info=answer.esi)))
    if usage:
        out.append(sse(chunk(ident, model, None, usage=answer.usage, info=answer.esi)))
    out.append(sse("[DONE]"))
    return out


async def held_events(model: str, answer: Answer, usage: bool) -> AsyncIterator[str]:
    """A scored answer as a stream: the role, the content, the ending."""
    ident = f"chatcmpl-{uuid.uuid4().hex}"
    yield sse(chunk(ident, model, {"role": "assistant", "content": ""}))
    for event in _ending(ident, model, answer, answer.content, usage):
        yield event


async def live_events(
    service: Service, chat: ChatRequest, limit: int, notes: list[str]
) -> AsyncIterator[str]:
    """Tokens as generated, then the scored ending; an error after the start as an event."""
    ident, model = f"chatcmpl-{uuid.uuid4().hex}", service.name
    guard = service.guard_for(limit)
    async with service.batcher.slot():
        yield sse(chunk(ident, model, {"role": "assistant", "content": ""}))
        sent, output = "", None
        try:
            async for piece in guard.astream_assess(
                chat.chat(), stop=chat.stops() or None, failures="return"
            ):
                if not isinstance(piece, str):
                    output = piece
                    break
                sent += piece
                yield sse(chunk(ident, model, {"content": piece}))
            answer = service.answer(output)
        except Exception as exc:  # after the start, an error can only be an event
            failure = exc if isinstance(exc, ServeError) else service.failure(exc)
            yield sse(failure.body())
            return
        answer = service.noted(answer, notes)
        rest = answer.content[len(sent) :] if answer.content.startswith(sent) else ""
        for event in _ending(ident, model, answer, rest, include_usage(chat)):
            yield event
