"""``ESIGuard.with_prompt``: guard the prompt template a RAG app already has.

:class:`TemplatedPrompt` renders it once as given and once per variant with only the question
variable replaced, so all else is the same bytes in every row (ESI intervenes on the question only).
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import replace
from typing import Any

from langchain_core.prompts import BasePromptTemplate
from langchain_core.runnables import RunnableConfig, RunnableSerializable
from pydantic import ConfigDict

from esi_guard import _retired
from esi_guard._pipeline.items import GuardedPrompt, Templated
from esi_guard.backends._types import ChatMessage
from esi_guard.exceptions import ConfigurationError, InputError, WholeMessageWarning
from esi_guard.guard._inputs import TemplatedPromptValue, chat_messages, parse_input

__all__ = ["LONG_QUESTION", "TemplatedPrompt", "caller_level", "warn_whole_message"]

LONG_QUESTION = 512
"""A question longer than this (characters) is probably a whole RAG message: warn once."""


def warn_whole_message(prompt: GuardedPrompt) -> bool:
    """Warn that a long whole message is the question (not ESI); whether it warned."""
    if prompt.template is not None or len(prompt.question) <= LONG_QUESTION:
        return False
    warnings.warn(
        f"ESIGuard is intervening on a {len(prompt.question)}-character human message as the "
        "question: instructions and retrieved context in it are changed too, which is not "
        "ESI and costs a pass over the whole message per variant. Use "
        "guard.with_prompt(prompt, question_key='question') to intervene on the question "
        "alone.",
        WholeMessageWarning,
        stacklevel=caller_level(),
    )
    return True


def caller_level() -> int:
    """The ``stacklevel`` of the first frame outside esi_guard and LangChain: the user's call."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        ("esi_guard", "langchain")
    ):
        level, frame = level + 1, frame.f_back
    return level


class TemplatedPrompt(RunnableSerializable[dict[str, Any], TemplatedPromptValue]):
    """Render a prompt template so that the guard intervenes on one variable only."""

    prompt: Any
    """The template (``ChatPromptTemplate``, ``PromptTemplate``: any ``BasePromptTemplate``)."""
    question_key: str = "question"
    """The variable holding the question: the only text the intervention changes."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    def __init__(self, **kwargs: Any) -> None:
        """Refuse a ``question_key`` the prompt lacks, or a (retired) ``context_key``."""
        if kwargs.get("context_key") is not None:
            error = _retired.retired("context_key", "TemplatedPrompt")
            raise error
        super().__init__(**kwargs)
        if not isinstance(self.prompt, BasePromptTemplate):
            msg = f"with_prompt needs a LangChain prompt template; got {type(self.prompt).__name__}"
            raise ConfigurationError(msg)
        variables = sorted(self.prompt.input_variables)
        if self.question_key not in variables:
            msg = (
                f"question_key={self.question_key!r} is not a variable of the prompt; "
                f"its variables: {variables}"
            )
            raise ConfigurationError(msg)

    def invoke(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> TemplatedPromptValue:
        """The rendered prompt, carrying how to render its variants."""
        return self._call_with_config(self.render, input, config, run_type="prompt")

    async def ainvoke(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> TemplatedPromptValue:
        """Async :meth:`invoke` (rendering is pure: it runs in place)."""
        return self.invoke(input, config, **kwargs)

    def render(self, values: dict[str, Any]) -> TemplatedPromptValue:
        """Render ``values``; the question variable must be there and not empty.

        Raises:
            InputError: Not a dict, or the question is not non-empty text (other problems are
                the prompt's own errors).
        """
        if not isinstance(values, dict):
            msg = (
                f"with_prompt takes the prompt's variables as a dict (with {self.question_key!r}); "
                f"got {type(values).__name__}"
            )
            raise InputError(msg)
        question = values.get(self.question_key)
        if not isinstance(question, str) or not question.strip():
            got = "missing" if question is None else f"{question!r}"
            msg = f"the question variable {self.question_key!r} must be non-empty text; got {got}"
            raise InputError(msg)
        value = self.prompt.format_prompt(**values)
        template = Templated(
            question=question,
            render=lambda text: self._messages({**values, self.question_key: text}),
        )
        guarded = replace(parse_input(value), template=template)
        return TemplatedPromptValue(messages=value.to_messages(), guarded=guarded)

    def _messages(self, values: dict[str, Any]) -> list[ChatMessage]:
        return list(chat_messages(self.prompt.format_prompt(**values)))
