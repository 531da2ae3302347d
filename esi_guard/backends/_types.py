"""What backends exchange with the pipeline, in plain types (chat messages, not LangChain's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from esi_guard.backends.hidden import HiddenSpec, HiddenStates
from esi_guard.scoring import TopK

__all__ = [
    "AnswerPiece",
    "ChatMessage",
    "Forced",
    "ForcingRequest",
    "Generation",
    "Messages",
]


class ChatMessage(TypedDict):
    """One chat message, as chat templates and OpenAI-style APIs take it."""

    role: str
    content: str


Messages = Sequence[ChatMessage]
"""A prompt: the chat messages, the last of which the answer replies to."""


@dataclass(frozen=True)
class Generation:
    """A greedy answer and the original distributions at each of its tokens."""

    text: str
    """The decoded answer, special tokens removed."""
    token_ids: tuple[int, ...]
    """The answer's token ids, end-of-sequence excluded."""
    topk: TopK
    """Top-k of the original distribution at each answer position."""
    finish_reason: Literal["stop", "length"]
    """``stop``: an end token or a stop sequence ended it; ``length``: ``max_new_tokens`` did."""
    prompt_tokens: int | None = None
    """How many tokens the prompt took (the answer's usage), when the backend knows."""
    hidden: HiddenStates | None = None
    """The answer's hidden states, when ``generate`` was asked for them (``hidden=``)."""


@dataclass(frozen=True)
class ForcingRequest:
    """One answer to force after each of a prompt's variants."""

    prompt: Messages
    """The original prompt."""
    variants: Sequence[Messages]
    """The intervened prompts, same messages but the question."""
    answer_ids: Sequence[int]
    """The answer tokens to force."""
    answer: str = ""
    """The answer's text, for backends that send text (the API backend)."""
    include_original: bool = False
    """Also force the answer after the original prompt (to score an existing answer)."""
    hidden: HiddenSpec | None = None
    """With ``include_original``: also return the original row's hidden states."""


@dataclass(frozen=True)
class Forced:
    """Top-k distributions of a forced answer."""

    variants: list[TopK]
    """One per variant, in request order."""
    original: TopK | None = None
    """Under the original prompt, when the request asked for it."""
    observed: list[int] | None = None
    """Approximate backends: per variant, how many leading positions are exact (the rest score
    the distance's upper bound, :func:`~esi_guard.esi_score`); None: all."""
    hidden: HiddenStates | None = None
    """The original row's hidden states, when the request asked for them."""


@dataclass(frozen=True)
class AnswerPiece:
    """The next tokens of an answer being generated, with their original top-k.

    Yielded in order by :meth:`~esi_guard.backends.base.Backend.stream_tokens` before the
    :class:`Generation`, which may cut them short (a stop sequence) or add the last token.
    """

    token_ids: tuple[int, ...]
    """The new tokens."""
    topk: TopK
    """Top-k of the original distribution at each of them."""
