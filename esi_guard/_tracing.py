"""Child runs for the guard's steps, so a trace shows generation, intervention and scoring.

Each step shows as a child run of the guard's chat-model run, tagged ``esi:{step}`` (like
langchain-core's ``retry:attempt:{n}``), whose input is the question and whose output is
a small JSON-friendly summary, never raw distributions. ``batch`` runs each step once for
all prompts before the prompts' own runs start, so there the child runs are replayed
from what the steps gave (their timings are not the steps').
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)

from esi_guard._pipeline import Item, Pipeline
from esi_guard.backends.base import Generation
from esi_guard.result import ESIResult

__all__ = ["achild", "arun", "atraced", "child", "run", "traced"]

STEPS = ("generate", "intervene", "score")


def child(run_manager: CallbackManagerForLLMRun, tag: str) -> CallbackManager:
    """A callback manager for runs under ``run_manager``'s run, tagged ``tag``."""
    manager = CallbackManager(handlers=[], parent_run_id=run_manager.run_id)
    manager.set_handlers(run_manager.inheritable_handlers)
    manager.add_tags(run_manager.inheritable_tags)
    manager.add_metadata(run_manager.inheritable_metadata)
    manager.add_tags([tag], inherit=False)
    return manager


def achild(run_manager: AsyncCallbackManagerForLLMRun, tag: str) -> AsyncCallbackManager:
    """Async :func:`child`."""
    manager = AsyncCallbackManager(handlers=[], parent_run_id=run_manager.run_id)
    manager.set_handlers(run_manager.inheritable_handlers)
    manager.add_tags(run_manager.inheritable_tags)
    manager.add_metadata(run_manager.inheritable_metadata)
    manager.add_tags([tag], inherit=False)
    return manager


def traced(
    run_manager: CallbackManagerForLLMRun | None, step: str, item: Item, call: Callable[[], Any]
) -> None:
    """Run one step for ``item``, shown as a child run tagged ``esi:{step}``."""
    if run_manager is None:
        call()
        return
    run = child(run_manager, f"esi:{step}").on_chain_start(
        None, {"question": item.prompt.question}, name=f"esi_{step}"
    )
    try:
        call()
    except BaseException as exc:
        run.on_chain_error(exc)
        raise
    output = item.steps.get(step)
    if isinstance(output, BaseException):
        run.on_chain_error(output)
    else:
        run.on_chain_end(_summary(output))


async def atraced(
    run_manager: AsyncCallbackManagerForLLMRun | None,
    step: str,
    item: Item,
    call: Callable[[], Awaitable[Any]],
) -> None:
    """Async :func:`traced`."""
    if run_manager is None:
        await call()
        return
    run = await achild(run_manager, f"esi:{step}").on_chain_start(
        None, {"question": item.prompt.question}, name=f"esi_{step}"
    )
    try:
        await call()
    except BaseException as exc:
        await run.on_chain_error(exc)
        raise
    output = item.steps.get(step)
    if isinstance(output, BaseException):
        await run.on_chain_error(output)
    else:
        await run.on_chain_end(_summary(output))


def run(pipeline: Pipeline, item: Item, run_manager: CallbackManagerForLLMRun | None) -> None:
    """Every step for one prompt, each a child run (replayed when a batch ran them)."""
    if item.outcome is not None:
        replay(run_manager, item)
        return
    live = [item]
    traced(run_manager, "generate", item, lambda: pipeline.generated(live, pipeline.generate(live)))
    if item.outcome is None:
        intervene = lambda: pipeline.intervened(live, pipeline.intervene(live))  # noqa: E731
        traced(run_manager, "intervene", item, intervene)
        traced(run_manager, "score", item, lambda: pipeline.force(live))


async def arun(
    pipeline: Pipeline, item: Item, run_manager: AsyncCallbackManagerForLLMRun | None
) -> None:
    """Async :func:`run`."""
    if item.outcome is not None:
        await areplay(run_manager, item)
        return
    live = [item]

    async def generate() -> None:
        pipeline.generated(live, await pipeline.agenerate(live))

    async def intervene() -> None:
        pipeline.intervened(live, await pipeline.aintervene(live))

    await atraced(run_manager, "generate", item, generate)
    if item.outcome is None:
        await atraced(run_manager, "intervene", item, intervene)
        await atraced(run_manager, "score", item, lambda: pipeline.aforce(live))


def replay(run_manager: CallbackManagerForLLMRun | None, item: Item) -> None:
    """The child runs of steps that already ran for ``item`` (in a batch)."""
    for step in STEPS:
        if step in item.steps:
            traced(run_manager, step, item, lambda: None)


async def areplay(run_manager: AsyncCallbackManagerForLLMRun | None, item: Item) -> None:
    """Async :func:`replay`."""

    async def nothing() -> None:
        return None

    for step in STEPS:
        if step in item.steps:
            await atraced(run_manager, step, item, nothing)


def _summary(output: Any) -> dict[str, Any]:
    """What a child run shows: small and JSON-friendly, never raw distributions."""
    if isinstance(output, Generation):
        return {"answer": output.text, "n_tokens": len(output.token_ids)}
    if isinstance(output, ESIResult):
        return {"score": output.score, "scored": output.scored, "reason": output.reason}
    return {"variants": output}
