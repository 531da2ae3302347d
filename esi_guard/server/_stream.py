"""Server-sent events: a chat completion's chunks and its scored ending."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from esi_guard.server._schema import Answer, ChatRequest, chunk

__all__ = ["ending", "held_events", "include_usage", "sse"]


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def include_usage(chat: ChatRequest) -> bool:
    """Whether the stream ends with a usage chunk (``stream_options.include_usage``)."""
    return chat.stream_options is not None and chat.stream_options.include_usage


def ending(ident: str, model: str, answer: Answer, rest: str, usage: bool) -> list[str]:
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
    for event in ending(ident, model, answer, answer.content, usage):
        yield event
