"""The prompts a calibration run renders its questions with.

Closed-book questions follow ``DEFAULT_SYSTEM``; passages (SQuAD 2.0) go through a template
(``RAG_TEMPLATE`` unless one is given) and ``ESIGuard.with_prompt``, so only the question is
intervened on.
"""

from __future__ import annotations

from pathlib import Path

from esi_guard.calibration.data import Example
from esi_guard.exceptions import InputError

__all__ = ["DECLINE_PHRASE", "DEFAULT_SYSTEM", "RAG_TEMPLATE", "run_prompts"]

DEFAULT_SYSTEM = "Please directly answer the following question with one or few words."
DECLINE_PHRASE = "I don't know"
RAG_TEMPLATE = (
    "Answer the question using only the passage below, in a few words. If the passage does "
    f"not contain the answer, reply exactly: {DECLINE_PHRASE}\n\nPassage: {{context}}\n\n"
    "Question: {question}"
)
"""The default prompt for data with passages (SQuAD 2.0): one human message, the passage
before the question (so ESI's variants share the passage's prefix), and a fixed phrase to
decline with (see :func:`esi_guard.calibration.labels.declined`)."""


def run_prompts(
    examples: list[Example], system: str | None, prompt_file: Path | None, template: str | None
) -> tuple[str | None, str | None]:
    """The run's system prompt and template, checked against the data (passages or not)."""
    if prompt_file is not None:
        try:
            template = prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            msg = f"cannot read the prompt template {prompt_file}: {exc.strerror}"
            raise InputError(msg) from exc
    passages = any(e.context is not None for e in examples)
    if passages and not all(e.context is not None for e in examples):
        msg = "the data mixes questions with passages (SQuAD 2.0) and without: calibrate apart"
        raise InputError(msg)
    if passages and template is None:
        template = RAG_TEMPLATE
    if template is not None:
        where = prompt_file or "the built-in RAG template"
        if "{question}" not in template:
            msg = f"{where} has no {{question}} variable"
            raise InputError(msg)
        if passages and "{context}" not in template:
            msg = f"{where} has no {{context}} variable: the data has passages to put there"
            raise InputError(msg)
        if not passages and "{context}" in template:
            msg = f"{where} has a {{context}} variable but the data has no passages"
            raise InputError(msg)
    if system is None:
        system = None if template is not None else DEFAULT_SYSTEM
    return system or None, template
