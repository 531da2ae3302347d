"""Child runs for the guard's steps, so a trace shows generation, intervention and scoring.

Each batched step runs once for all prompts and shows as one child run per prompt,
tagged ``esi:{step}`` (like langchain-core's ``retry:attempt:{n}``), whose output is a
small JSON-friendly summary, never raw distributions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun

from esi_guard._pipeline import Item
from esi_guard.backends.base import Generation
from esi_guard.result import ESIResult

__all__ = ["atraced", "traced"]

T = TypeVar("T")


def traced(
    managers: Sequence[CallbackManagerForChainRun],
    step: str,
    items: Sequence[Item],
    call: Callable[[], list[T]],
) -> list[T]:
    """Run one batched step, shown as a child run tagged ``esi:{step}`` under each input.

    ``managers`` are the run managers of all the guard's inputs; each item's is found by
    its ``index``.
    """
    if not items:
        return []
    children = [
        managers[item.index]
        .get_child(f"esi:{step}")
        .on_chain_start(None, {"question": item.prompt.question}, name=f"esi_{step}")
        for item in items
    ]
    try:
        outputs = call()
    except BaseException as exc:
        for child in children:
            child.on_chain_error(exc)
        raise
    for child, output in zip(children, outputs, strict=True):
        if isinstance(output, BaseException):
            child.on_chain_error(output)
        else:
            child.on_chain_end(_summary(output))
    return outputs


async def atraced(
    managers: Sequence[AsyncCallbackManagerForChainRun],
    step: str,
    items: Sequence[Item],
    call: Callable[[], Awaitable[list[T]]],
) -> list[T]:
    """Async :func:`traced`."""
    if not items:
        return []
    children = [
        await managers[item.index]
        .get_child(f"esi:{step}")
        .on_chain_start(None, {"question": item.prompt.question}, name=f"esi_{step}")
        for item in items
    ]
    try:
        outputs = await call()
    except BaseException as exc:
        for child in children:
            await child.on_chain_error(exc)
        raise
    for child, output in zip(children, outputs, strict=True):
        if isinstance(output, BaseException):
            await child.on_chain_error(output)
        else:
            await child.on_chain_end(_summary(output))
    return list(outputs)


def _summary(output: Any) -> dict[str, Any]:
    """What a child run shows: small and JSON-friendly, never raw distributions."""
    if isinstance(output, Generation):
        return {"answer": output.text, "n_tokens": len(output.token_ids)}
    if isinstance(output, ESIResult):
        return {"score": output.score, "scored": output.scored, "reason": output.reason}
    return {"variants": output}
