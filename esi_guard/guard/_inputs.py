"""Turn what a LangChain chain hands the guard into chat messages and find the question.

A string is one user message and the question. Messages (or a PromptValue) are kept, the
question being the last *human* message; nothing else is intervened on. An agent's tool calls
and results are folded into text (:func:`fold_tools`): context, never the question. A prompt from
``ESIGuard.with_prompt`` (:class:`TemplatedPromptValue`) keeps its template: only its question
variable changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

from langchain_core.messages import BaseMessage, convert_to_messages
from langchain_core.prompt_values import ChatPromptValue, PromptValue
from pydantic import Field

from esi_guard._pipeline.items import GuardedPrompt
from esi_guard._text import message_text
from esi_guard.backends._types import ChatMessage
from esi_guard.exceptions import InputError

__all__ = [
    "GuardedPrompt",
    "TemplatedPromptValue",
    "chat_messages",
    "fold_tools",
    "message_text",
    "parse_input",
    "rendered",
    "resolve",
]

_ROLES = {"human": "user", "ai": "assistant", "system": "system"}


def _check_text(text: str) -> None:
    """Text a tokenizer and an HTTP body can carry: valid Unicode (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = (
            f"the prompt holds a lone surrogate code point ({text[exc.start]!r} at {exc.start}); "
            "it is not valid Unicode text"
        )
        raise InputError(msg) from None


def _role(message: BaseMessage) -> str:
    role = _ROLES.get(message.type) or getattr(message, "role", None)
    if not role:
        msg = f"cannot guard a prompt holding a {message.type!r} message"
        raise InputError(msg)
    return str(role)


TOOL_RESULT = "Tool result ({name}): {content}"
"""How a tool result reads in the prompt the guard scores (one paragraph per result)."""
TOOL_CALL = "Tool call: {name}({arguments})"
"""How a tool call reads, on its own line after the assistant message's text."""


def fold_tools(messages: Sequence[BaseMessage]) -> tuple[list[ChatMessage], int | None]:
    """Chat messages of a conversation that may hold tool calls and their results.

    Chat templates render tools differently (or not at all); folding them into text the same way
    keeps a threshold meaningful across backends. Returns the messages and the last human index.
    """
    chat: list[ChatMessage] = []
    question: int | None = None
    names: dict[str, str] = {}
    results: list[str] = []
    for message in messages:
        if message.type == "tool":
            call = str(getattr(message, "tool_call_id", ""))
            name = getattr(message, "name", None) or names.get(call, "tool")
            text = message_text(message, skip_other_blocks=True)
            results.append(TOOL_RESULT.format(name=name, content=text))
            continue
        if results:
            chat.append(ChatMessage(role="user", content="\n\n".join(results)))
            results = []
        role = _role(message)
        calls = list(getattr(message, "tool_calls", None) or ()) if role == "assistant" else []
        text = message_text(message, skip_other_blocks=bool(calls) or role == "assistant")
        for call in calls:
            names[str(call.get("id"))] = call["name"]
            arguments = json.dumps(call.get("args", {}), ensure_ascii=False)
            text += ("\n" if text else "") + TOOL_CALL.format(
                name=call["name"], arguments=arguments
            )
        if role == "user":
            question = len(chat)
        chat.append(ChatMessage(role=role, content=text))
    if results:
        chat.append(ChatMessage(role="user", content="\n\n".join(results)))
    return chat, question


class TemplatedPromptValue(ChatPromptValue):
    """A prompt rendered by ``ESIGuard.with_prompt``; ``guarded`` is its :class:`GuardedPrompt`."""

    guarded: Any = Field(default=None, exclude=True)


_RENDERED: ContextVar[GuardedPrompt | None] = ContextVar("esi_guard_rendered", default=None)


@contextmanager
def rendered(value: Any) -> Iterator[None]:
    """While the guard runs on ``value``: its template, if any, for :func:`resolve` to find."""
    guarded = value.guarded if isinstance(value, TemplatedPromptValue) else None
    token = _RENDERED.set(guarded)
    try:
        yield
    finally:
        _RENDERED.reset(token)


def resolve(prompt: GuardedPrompt) -> GuardedPrompt:
    """The templated prompt being run, when ``prompt`` is its messages; else ``prompt``."""
    templated = _RENDERED.get()
    if templated is not None and templated.messages == prompt.messages:
        return templated
    return prompt


def parse_input(value: Any) -> GuardedPrompt:
    """Chat messages and question of a guard input.

    Raises:
        InputError: Unsupported type, non-text message, invalid Unicode, or no or empty question.
    """
    if isinstance(value, TemplatedPromptValue) and value.guarded is not None:
        return cast(GuardedPrompt, value.guarded)
    chat, question = _parsed(value)
    if question is None:
        msg = "the prompt has no human message to use as the question"
        raise InputError(msg)
    prompt = GuardedPrompt(messages=tuple(chat), question_index=question)
    if not prompt.question.strip():
        msg = "the question (last human message) is empty"
        raise InputError(msg)
    return prompt


def chat_messages(value: Any) -> tuple[ChatMessage, ...]:
    """A guard input as chat messages (see :func:`parse_input` for the errors)."""
    return tuple(_parsed(value)[0])


def _parsed(value: Any) -> tuple[list[ChatMessage], int | None]:
    """Chat messages of a guard input and the index of its last human message."""
    chat: list[ChatMessage]
    question: int | None
    if isinstance(value, str):
        chat, question = [ChatMessage(role="user", content=value)], 0
    elif isinstance(value, PromptValue) or (
        isinstance(value, Sequence) and not isinstance(value, bytes | bytearray)
    ):
        try:
            messages = (
                value.to_messages()
                if isinstance(value, PromptValue)
                else convert_to_messages(value)
            )
        except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError) as exc:
            msg = f"cannot read the input as chat messages: {type(exc).__name__}: {exc}"
            raise InputError(msg) from exc
        chat, question = fold_tools(messages)
    else:
        msg = (
            f"ESIGuard takes a string, a PromptValue or a list of messages; "
            f"got {type(value).__name__}"
        )
        raise InputError(msg)
    for message in chat:
        _check_text(message["content"])
    return chat, question
