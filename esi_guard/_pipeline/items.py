"""What travels through the scoring pipeline: a prompt (its question marked) and its item."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from esi_guard.backends._types import ChatMessage
from esi_guard.backends.hidden import HiddenStates
from esi_guard.exceptions import BackendError
from esi_guard.result import ESIResult
from esi_guard.scoring import TopK

__all__ = ["GuardedPrompt", "Item", "Outcome", "Templated"]

Outcome = ESIResult | BackendError


@dataclass(frozen=True)
class Templated:
    """A prompt rendered from a template whose question is one of its variables."""

    question: str
    """The question variable's value: the only text the intervention changes."""
    render: Callable[[str], list[ChatMessage]]
    """The prompt rendered again with the question variable replaced (all else as given)."""


@dataclass(frozen=True)
class GuardedPrompt:
    """A prompt as chat messages, and where its question is."""

    messages: tuple[ChatMessage, ...]
    """The whole prompt."""
    question_index: int
    """Index of the message that holds the question."""
    template: Templated | None = None
    """Its template, if any: the question is then a variable of it, and it renders variants."""

    @property
    def question(self) -> str:
        """The question text: the whole message, or the template's question variable."""
        if self.template is not None:
            return self.template.question
        return self.messages[self.question_index]["content"]

    def with_question(self, text: str) -> list[ChatMessage]:
        """The same prompt with the question replaced by ``text``."""
        if self.template is not None:
            return self.template.render(text)
        messages = list(self.messages)
        messages[self.question_index] = ChatMessage(role="user", content=text)
        return messages


@dataclass
class Item:
    """One prompt on its way through the pipeline."""

    prompt: GuardedPrompt
    """The prompt and its question."""
    index: int = 0
    """Where the prompt sits among the guard's inputs."""
    answer: str = ""
    """The answer (generated, or the one handed to ``ESIGuard.score``)."""
    answer_ids: tuple[int, ...] = ()
    """Its tokens, end-of-sequence excluded."""
    finish_reason: str | None = None
    """``stop`` or ``length`` for a generated answer."""
    original: TopK | None = None
    """The original distributions, when generation gave them."""
    prompt_tokens: int | None = None
    """How many tokens the prompt took, when the backend said."""
    hidden: HiddenStates | None = None
    """The answer's hidden states, when generation read them."""
    signals: dict[str, float] | None = None
    """The answer's free signals, once a stage before ESI read them (scoring reuses them)."""
    probe_score: float | None = None
    """With a cascade: the ESI probe's estimate, once the answer's states were read."""
    variants: list[str] = field(default_factory=list)
    """The L question texts the intervention made."""
    token_ends: list[int] | None = None
    """Each token's end offset in ``answer`` (for sentence scores); None: the backend can't say."""
    outcome: Outcome | None = None
    """The result, or the error to raise; None while the item is still on its way."""
    steps: dict[str, Any] = field(default_factory=dict)
    """What each step gave this item (``generate``, ``intervene``, ``score``), for traces."""

    @property
    def changed(self) -> list[str]:
        """The distinct variants that differ from the question (each forced once), in order."""
        question = self.prompt.question
        return [text for text in dict.fromkeys(self.variants) if text != question]
