"""A message's plain text, read off the object's ``content`` (no LangChain import)."""

from __future__ import annotations

from typing import Any

from esi_guard.exceptions import InputError

__all__ = ["message_text"]


def message_text(message: Any, *, skip_other_blocks: bool = False) -> str:
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
