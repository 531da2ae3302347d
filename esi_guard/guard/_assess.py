"""``ESIGuard.assess``: the results themselves, no chat-model run (the server, CLI, benchmarks)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

from esi_guard._pipeline.items import GuardedPrompt, Item, Outcome
from esi_guard._pipeline.steps import Pipeline
from esi_guard.exceptions import BackendError, InputError, ScoringError
from esi_guard.guard._inputs import parse_input
from esi_guard.result import ESIResult, OnError

__all__ = ["Assessed", "Failures", "arun", "astream", "items", "outcome", "raised", "run"]

Assessed = ESIResult | InputError | BackendError | ScoringError
"""What ``assess`` gives for one input: its result, or the error ``invoke`` would raise."""

Failures = Literal["decide", "return"]
"""A failed backend call: decided under ``on_error`` as ``invoke`` does, or returned."""

Checked = Callable[[GuardedPrompt], GuardedPrompt]
"""The guard's check of a parsed prompt (it warns once about a long whole message)."""


def raised(outcome: Outcome) -> BackendError | ScoringError:
    """What ``on_error="raise"`` raises for an unscored outcome."""
    if isinstance(outcome, BackendError):
        return outcome
    code = (outcome.reason or "").partition(":")[0] or None
    msg = f"the answer could not be scored: {outcome.reason}"
    return ScoringError(msg, result=outcome, code=code)


def items(inputs: Sequence[Any], checked: Checked) -> list[Item | InputError]:
    """An item per input, or the :class:`InputError` saying why it is not a prompt."""
    out: list[Item | InputError] = []
    for index, value in enumerate(inputs):
        try:
            out.append(Item(checked(parse_input(value)), index=index))
        except InputError as exc:
            out.append(exc)
    return out


def outcome(item: Item | InputError, on_error: OnError) -> Assessed:
    """A decided item's result, or the error ``invoke`` would raise in its place."""
    if isinstance(item, InputError):
        return item
    result = item.outcome
    assert result is not None  # the pipeline decides every item
    if isinstance(result, BackendError):
        return result
    if not result.scored and on_error == "raise":
        return raised(result)
    return result


def run(
    pipeline: Pipeline, inputs: Sequence[Any], checked: Checked, on_error: OnError
) -> list[Assessed]:
    """Every input through ``pipeline`` (each step once for all): their outcomes, in order."""
    parsed = items(inputs, checked)
    pipeline.run([item for item in parsed if isinstance(item, Item)])
    return [outcome(item, on_error) for item in parsed]


async def arun(
    pipeline: Pipeline, inputs: Sequence[Any], checked: Checked, on_error: OnError
) -> list[Assessed]:
    """Async :func:`run`."""
    parsed = items(inputs, checked)
    await pipeline.arun([item for item in parsed if isinstance(item, Item)])
    return [outcome(item, on_error) for item in parsed]


async def astream(
    pipeline: Pipeline, value: Any, checked: Checked, on_error: OnError
) -> AsyncIterator[str | Assessed]:
    """One input: its answer's text pieces as generated, then its outcome."""
    (item,) = items([value], checked)
    if isinstance(item, Item):
        async for piece in pipeline.astream(item):
            yield piece
    yield outcome(item, on_error)
