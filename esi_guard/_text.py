"""Text helpers: a message's plain text (no LangChain import), a question's words, QWERTY keys."""

from __future__ import annotations

import unicodedata
from typing import Any

from esi_guard.exceptions import InputError

__all__ = ["NEIGHBOURS", "Word", "message_text", "question_words"]


def message_text(message: Any, *, skip_other_blocks: bool = False) -> str:
    """Plain text of a message's content (a string or text content blocks).

    A non-text block is an :class:`InputError`, or left out with ``skip_other_blocks`` (outputs).
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


Word = tuple[int, int, list[str]]
"""A word's start and end offsets in the question, and its characters."""


def question_words(question: str) -> list[Word]:
    """Each word's ``(start, end)`` and characters: a letter (``str.isalpha``) with its marks."""
    words: list[Word] = []
    chars: list[str] = []
    start = 0
    for at, char in enumerate(question):
        if char.isalpha():
            if not chars:
                start = at
            chars.append(char)
        elif chars and unicodedata.category(char)[0] == "M":
            chars[-1] += char
        elif chars:
            words.append((start, at, chars))
            chars = []
    if chars:
        words.append((start, len(question), chars))
    return words


_KEYBOARD = [
    "qwertyuiop",
    "asdfghjkl",
    "zxcvbnm",
]


def _keyboard_neighbours() -> dict[str, str]:
    neighbours: dict[str, str] = {}
    for row_index, row in enumerate(_KEYBOARD):
        for col, char in enumerate(row):
            near = [row[c] for c in (col - 1, col + 1) if 0 <= c < len(row)]
            for other in (row_index - 1, row_index + 1):
                if 0 <= other < len(_KEYBOARD):
                    near += [
                        _KEYBOARD[other][c]
                        for c in (col - 1, col, col + 1)
                        if 0 <= c < len(_KEYBOARD[other])
                    ]
            neighbours[char] = "".join(near)
    return neighbours


NEIGHBOURS = _keyboard_neighbours()
"""Each letter's neighbours on a QWERTY keyboard (what a typo hits instead)."""
