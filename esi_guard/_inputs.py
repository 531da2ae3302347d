"""Turn what a LangChain chain hands the guard into chat messages and find the question.

* a string is one user message, and the whole string is the question;
* a PromptValue or a list of messages keeps every message; the question is the last
  human message. System and earlier messages are never intervened on;
* a prompt rendered by ``ESIGuard.with_prompt`` (:class:`TemplatedPromptValue`) keeps
  its template: the question is the template's question variable, and only it changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

from langchain_core.messages import BaseMessage, convert_to_messages
from langchain_core.prompt_values import ChatPromptValue, PromptValue
from pydantic import Field

from esi_guard._pipeline import GuardedPrompt
from esi_guard.backends.base import ChatMessage
from esi_guard.exceptions import InputError

__all__ = [
    "GuardedPrompt",
    "TemplatedPromptValue",
    "chat_messages",
    "message_text",
    "parse_input",
    "rendered",
    "resolve",
]

_ROLES = {"human": "user", "ai": "assistant", "system": "system"}


def message_text(message: BaseMessage | Any, *, skip_other_blocks: bool = False) -> str:
    """Plain text of a message's content (a string or text content blocks).

    A non-text block (image, reasoning...) is an :class:`InputError`, or is left out
    with ``skip_other_blocks=True`` (for model outputs, whose text is all we read).
    """
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif not skip_other_blocks:
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                msg = f"cannot guard a message holding a {kind!r} content block; only text"
                raise InputError(msg)
        return "".join(parts)
    msg = f"message content of type {type(content).__name__} is not text"
    raise InputError(msg)


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
    if not role or message.type == "tool":
        msg = f"cannot guard a prompt holding a {message.type!r} message"
        raise InputError(msg)
    return str(role)


class TemplatedPromptValue(ChatPromptValue):
    """A prompt rendered by ``ESIGuard.with_prompt``: its messages, and where the question is.

    ``guarded`` carries the :class:`GuardedPrompt` whose template renders the variants.
    """

    guarded: Any = Field(default=None, exclude=True)


_RENDERED: ContextVar[GuardedPrompt | None] = ContextVar("esi_guard_rendered", default=None)


@contextmanager
def rendered(value: Any) -> Iterator[None]:
    """While the guard runs on ``value``: its template, if ``with_prompt`` rendered it.

    The chat-model machinery hands ``_generate`` plain messages; :func:`resolve` finds
    the template again from them.
    """
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
        InputError: Unsupported type, a message that is not text, invalid Unicode (lone
            surrogates), no human message, or an empty or whitespace-only question.
    """
    if isinstance(value, TemplatedPromptValue) and value.guarded is not None:
        return cast(GuardedPrompt, value.guarded)
    chat = chat_messages(value)
    users = [i for i, message in enumerate(chat) if message["role"] == "user"]
    if not users:
        msg = "the prompt has no human message to use as the question"
        raise InputError(msg)
    prompt = GuardedPrompt(messages=chat, question_index=users[-1])
    if not prompt.question.strip():
        msg = "the question (last human message) is empty"
        raise InputError(msg)
    return prompt


def chat_messages(value: Any) -> tuple[ChatMessage, ...]:
    """A guard input as chat messages (see :func:`parse_input` for the errors)."""
    chat: tuple[ChatMessage, ...]
    if isinstance(value, str):
        chat = (ChatMessage(role="user", content=value),)
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
        chat = tuple(ChatMessage(role=_role(m), content=message_text(m)) for m in messages)
    else:
        msg = (
            f"ESIGuard takes a string, a PromptValue or a list of messages; "
            f"got {type(value).__name__}"
        )
        raise InputError(msg)
    for message in chat:
        _check_text(message["content"])
    return chat
