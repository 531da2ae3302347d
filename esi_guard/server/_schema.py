"""The wire format: OpenAI's chat-completions request, and responses built from guarded messages.

Pure pydantic: an unknown field is refused by name (``extra="forbid"``), never dropped; what the
server does not honour (non-greedy sampling, ``n`` above 1, tools, logprobs) is not in the schema.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from esi_guard.applied import ABSTAIN_FINISH_REASON

__all__ = [
    "ABSTAIN_FINISH_REASON",
    "Answer",
    "ChatRequest",
    "Message",
    "StreamOptions",
    "TextPart",
    "chunk",
    "completion",
    "esi_headers",
    "warning_headers",
    "whole_message_warning",
]


_Strict = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Answer:
    """One request's answer as the wire shows it."""

    content: str
    finish_reason: str
    usage: dict[str, int]
    esi: dict[str, Any]


class TextPart(BaseModel):
    """One text part of a message's content (other part types are refused)."""

    model_config = _Strict
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat message; ``developer`` is read as ``system``. Tool calls are refused."""

    model_config = _Strict
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None
    """Accepted as OpenAI's schema has it; the model does not see it."""

    def text(self) -> str:
        """The content as one string."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def as_chat(self) -> dict[str, str]:
        """The message as the guard takes it."""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.text()}


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage``."""

    model_config = _Strict
    include_usage: bool = False


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``'s body: the subset of OpenAI's schema the guard honours."""

    model_config = _Strict
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    temperature: float | None = None
    """Only 0 (or absent): ESI scores the greedy answer."""
    top_p: float | None = None
    """Only 1 (or absent)."""
    n: int | None = None
    """Only 1 (or absent)."""
    user: str | None = None
    """Accepted as OpenAI's schema has it; never logged."""

    @field_validator("temperature")
    @classmethod
    def _greedy(cls, value: float | None) -> float | None:
        if value not in (None, 0):
            msg = f"ESI scores the greedy answer: temperature must be 0, got {value}"
            raise ValueError(msg)
        return value

    @field_validator("top_p")
    @classmethod
    def _whole(cls, value: float | None) -> float | None:
        if value not in (None, 1):
            msg = f"ESI scores the greedy answer: top_p must be 1, got {value}"
            raise ValueError(msg)
        return value

    @field_validator("n")
    @classmethod
    def _one(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            msg = f"the guard gives one answer per request: n must be 1, got {value}"
            raise ValueError(msg)
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            msg = f"at most 4 stop sequences, got {len(value)}"
            raise ValueError(msg)
        return value

    def stops(self) -> tuple[str, ...]:
        """The stop sequences, as a tuple (empty when none)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def token_limit(self) -> int | None:
        """``max_completion_tokens`` or ``max_tokens`` (both given: the smaller)."""
        given = [v for v in (self.max_tokens, self.max_completion_tokens) if v is not None]
        return min(given) if given else None

    def chat(self) -> list[dict[str, str]]:
        """The messages as the guard takes them."""
        return [message.as_chat() for message in self.messages]

    def question(self) -> str:
        """The text the guard takes as the question: the last user message's ("" if none)."""
        users = [message for message in self.messages if message.role == "user"]
        return users[-1].text() if users else ""


def whole_message_warning(chat: ChatRequest, longest: int) -> str | None:
    """The ``whole_message`` warning for a question over ``longest`` characters, or None.

    A long last user message is probably a whole RAG message, intervened on whole (not ESI). The
    guard's :class:`~esi_guard.exceptions.WholeMessageWarning` lands in a log no client reads.
    """
    size = len(chat.question())
    if size <= longest:
        return None
    return (
        f"whole_message: the question is a {size}-character user message, intervened on as a "
        "whole: instructions and retrieved passages in it are changed too, which is not ESI. "
        "Send them in a system message and the question alone as the last user message."
    )


def esi_headers(info: dict[str, Any]) -> dict[str, str]:
    """``X-ESI-Score`` (``none``: no ESI score), ``-Decision``, any ``-P-Wrong``, ``-Warning``."""
    headers = {"X-ESI-Score": _shown(info.get("score")), "X-ESI-Decision": str(info["decision"])}
    if info.get("p_wrong") is not None:
        headers["X-ESI-P-Wrong"] = _shown(info["p_wrong"])
    return headers | warning_headers(info.get("warnings", ()))


def _shown(value: Any) -> str:
    return "none" if value is None or not math.isfinite(value) else f"{value:.6f}"


def warning_headers(warnings: Sequence[str]) -> dict[str, str]:
    """``X-ESI-Warning``: the warnings' codes, comma-separated (no header when none)."""
    if not warnings:
        return {}
    return {"X-ESI-Warning": ", ".join(warning.partition(":")[0] for warning in warnings)}


def completion(
    model: str, content: str, finish_reason: str, usage: dict[str, int], info: dict[str, Any]
) -> dict[str, Any]:
    """A ``chat.completion`` object with its ``esi``."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": finish_reason,
            "logprobs": None,
        }],
        "usage": usage,
        "esi": info,
    }  # fmt: skip


def chunk(
    ident: str,
    model: str,
    delta: dict[str, Any] | None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk``; ``delta=None`` is the usage chunk (no choices)."""
    out: dict[str, Any] = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }
    if usage is not None:
        out["usage"] = usage
    if info is not None:
        out["esi"] = info
    return out
