"""The prompt a guard asks under, and the one its threshold was calibrated under.

Another instruction gets another answer and score, so a threshold file records its system prompt
and template. :func:`difference` compares only the system messages and the question's message:
earlier turns are context a calibration run cannot have had.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from string import Formatter

from esi_guard._pipeline.items import GuardedPrompt, Templated
from esi_guard.backends._types import ChatMessage
from esi_guard.exceptions import ConfigurationError, PromptMismatchWarning
from esi_guard.guard._templates import caller_level

__all__ = [
    "PROMPT_ADVICE",
    "CalibratedPrompt",
    "asked",
    "check_template",
    "difference",
    "fields_of",
    "warn_if_other",
]

PROMPT_ADVICE = (
    ": the same question under another instruction gets another answer and another "
    "score, so the threshold holds only approximately. Ask under the calibrated prompt, "
    "or recalibrate under yours (`esi-guard calibrate --system TEXT` or `--prompt FILE`); "
    "silence this with warnings.filterwarnings('ignore', "
    "category=esi_guard.PromptMismatchWarning)"
)
"""The end of every :class:`PromptMismatchWarning`'s message: why it matters, the fixes."""


@dataclass(frozen=True)
class CalibratedPrompt:
    """The system prompt and template a threshold file's questions were asked under."""

    system: str | None
    """The system message before each question (None: none)."""
    template: str | None
    """The question's template (``{question}``, maybe ``{context}``); None: the bare question."""
    where: str
    """The file, as messages name it."""


def fields_of(template: str) -> list[str]:
    """The variables of a ``str.format`` template (as LangChain's f-string prompts read it)."""
    return [name for _, name, _, _ in Formatter().parse(template) if name is not None]


def check_template(template: str | None) -> str | None:
    """``template``, refused unless ``{question}`` is its one variable (a ConfigurationError)."""
    if template is None:
        return None
    try:
        names = set(fields_of(template))
    except ValueError as exc:
        msg = f"prompt_template is not a valid template ({exc}): {template!r}"
        raise ConfigurationError(msg) from exc
    if names != {"question"}:
        msg = (
            f"prompt_template renders a bare question, so {{question}} must be its one "
            f"variable; got {sorted(names)}: a template with a passage ({{context}}) goes "
            "through guard.with_prompt(prompt, question_key='question')"
        )
        raise ConfigurationError(msg)
    return template


@dataclass(frozen=True)
class _Rendered:
    """The prompt with its question message made from ``template`` (compared by value)."""

    messages: tuple[ChatMessage, ...]
    index: int
    template: str

    def __call__(self, text: str) -> list[ChatMessage]:
        messages = list(self.messages)
        messages[self.index] = ChatMessage(role="user", content=self.template.format(question=text))
        return messages


@dataclass(frozen=True)
class _Behind:
    """A template's rendering with the system message put first (compared by value)."""

    system: str
    render: Callable[[str], list[ChatMessage]]

    def __call__(self, text: str) -> list[ChatMessage]:
        return [ChatMessage(role="system", content=self.system), *self.render(text)]


def asked(prompt: GuardedPrompt, system: str | None, template: str | None) -> GuardedPrompt:
    """``prompt`` as the guard asks it: ``system`` and ``template``, each unless it has its own."""
    if template is not None and prompt.template is None:
        render = _Rendered(prompt.messages, prompt.question_index, template)
        prompt = replace(
            prompt,
            messages=tuple(render(prompt.question)),
            template=Templated(question=prompt.question, render=render),
        )
    if system is None or any(m["role"] == "system" for m in prompt.messages):
        return prompt
    first = ChatMessage(role="system", content=system)
    templated = prompt.template
    if templated is not None:
        templated = replace(templated, render=_Behind(system, templated.render))
    return GuardedPrompt((first, *prompt.messages), prompt.question_index + 1, templated)


def _pattern(template: str | None, question: str) -> re.Pattern[str]:
    """What the question's message reads under ``template``; any other variable any text."""
    if template is None:
        return re.compile(re.escape(question))
    parts = []
    for literal, name, _, _ in Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(re.escape(question) if name == "question" else "(?s:.*)")
    return re.compile("".join(parts))


def difference(prompt: GuardedPrompt, calibrated: CalibratedPrompt) -> str | None:
    """How ``prompt`` is not asked as ``calibrated`` was, in words; None when it is."""
    systems = [m["content"] for m in prompt.messages if m["role"] == "system"]
    expected = [] if calibrated.system is None else [calibrated.system]
    if systems != expected:
        given = " + ".join(repr(s) for s in systems) or "none"
        return (
            f"{calibrated.where} was calibrated under the system prompt "
            f"{calibrated.system!r}, this prompt has {given}"
        )
    message = prompt.messages[prompt.question_index]["content"]
    if _pattern(calibrated.template, prompt.question).fullmatch(message) is None:
        how = (
            "the question as its own message" if calibrated.template is None
            else f"the template {calibrated.template!r}"
        )  # fmt: skip
        return f"{calibrated.where} was calibrated with {how}, this prompt asks {message!r}"
    return None


def warn_if_other(prompt: GuardedPrompt, calibrated: CalibratedPrompt | None) -> bool:
    """Warn if ``prompt`` is not the calibrated one (:class:`PromptMismatchWarning`); True if so."""
    found = None if calibrated is None else difference(prompt, calibrated)
    if found is None:
        return False
    warnings.warn(found + PROMPT_ADVICE, PromptMismatchWarning, stacklevel=caller_level())
    return True
