"""Child runs for the guard's steps, so a trace shows generation, intervention and scoring.

Each step shows as a child run of the guard's chat-model run, tagged ``esi:{step}`` (like
langchain-core's ``retry:attempt:{n}``), whose input is the question and whose output is
a small JSON-friendly summary, never raw distributions. ``batch`` runs each step once for
all prompts before the prompts' own runs start, so there the child runs are replayed
from what the steps gave (their timings are not the steps').
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)

from esi_guard import _live
from esi_guard._items import Item
from esi_guard._messages import piece_chunk
from esi_guard._pipeline import Pipeline
from esi_guard.backends.base import Generation
from esi_guard.result import ESIResult

__all__ = ["achild", "arun", "astreamed", "atraced", "child", "run", "streamed", "traced"]

STEPS = ("generate", "intervene", "score")


def child(run_manager: CallbackManagerForLLMRun, tag: str) -> CallbackManager:
    """A callback manager for runs under ``run_manager``'s run, tagged ``tag``."""
    return _inherit(
        CallbackManager(handlers=[], parent_run_id=run_manager.run_id), run_manager, tag
    )


def achild(run_manager: AsyncCallbackManagerForLLMRun, tag: str) -> AsyncCallbackManager:
    """Async :func:`child`."""
    manager = AsyncCallbackManager(handlers=[], parent_run_id=run_manager.run_id)
    return _inherit(manager, run_manager, tag)


M = TypeVar("M", CallbackManager, AsyncCallbackManager)


def _inherit(manager: M, parent: Any, tag: str) -> M:
    """What langchain-core's ``get_child`` does, for a chat-model run, which lacks it."""
    manager.set_handlers(parent.inheritable_handlers)
    manager.add_tags(parent.inheritable_tags)
    manager.add_metadata(parent.inheritable_metadata)
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


def run(
    pipeline: Pipeline,
    item: Item,
    run_manager: CallbackManagerForLLMRun | None,
    *,
    live: bool = False,
) -> None:
    """Every step for one prompt, each a child run (replayed when a batch ran them).

    ``live``: the answer's pieces go to the run's token callbacks as they are generated.
    """
    if item.outcome is not None:
        replay(run_manager, item)
        return
    if live:
        for piece in streamed(pipeline, item, run_manager):
            if run_manager is not None:
                run_manager.on_llm_new_token(piece, chunk=piece_chunk(piece))
            _live.emit(piece)
        return
    one = [item]
    traced(run_manager, "generate", item, lambda: pipeline.generated(one, pipeline.generate(one)))
    if item.outcome is None:
        intervene = lambda: pipeline.intervened(one, pipeline.intervene(one))  # noqa: E731
        traced(run_manager, "intervene", item, intervene)
        traced(run_manager, "score", item, lambda: pipeline.force(one))


async def arun(
    pipeline: Pipeline,
    item: Item,
    run_manager: AsyncCallbackManagerForLLMRun | None,
    *,
    live: bool = False,
) -> None:
    """Async :func:`run`."""
    if item.outcome is not None:
        await areplay(run_manager, item)
        return
    if live:
        async for piece in astreamed(pipeline, item, run_manager):
            if run_manager is not None:
                await run_manager.on_llm_new_token(piece, chunk=piece_chunk(piece))
            _live.emit(piece)
        return
    one = [item]

    async def generate() -> None:
        pipeline.generated(one, await pipeline.agenerate(one))

    async def intervene() -> None:
        pipeline.intervened(one, await pipeline.aintervene(one))

    await atraced(run_manager, "generate", item, generate)
    if item.outcome is None:
        await atraced(run_manager, "intervene", item, intervene)
        await atraced(run_manager, "score", item, lambda: pipeline.aforce(one))


def streamed(
    pipeline: Pipeline, item: Item, run_manager: CallbackManagerForLLMRun | None
) -> Iterator[str]:
    """The answer's pieces as they are generated, then the other steps: all child runs."""
    # The generate run stays open while the pieces flow out to the caller.
    run = None
    if run_manager is not None:
        run = child(run_manager, "esi:generate").on_chain_start(
            None, {"question": item.prompt.question}, name="esi_generate"
        )
    try:
        yield from pipeline.stream(item)
    except BaseException as exc:
        if run is not None:
            run.on_chain_error(exc)
        raise
    if run is not None:
        output = item.steps.get("generate")
        if isinstance(output, BaseException):
            run.on_chain_error(output)
        else:
            run.on_chain_end(_summary(output))
    if item.outcome is None:
        one = [item]
        intervene = lambda: pipeline.intervened(one, pipeline.intervene(one))  # noqa: E731
        traced(run_manager, "intervene", item, intervene)
        traced(run_manager, "score", item, lambda: pipeline.force(one))


async def astreamed(
    pipeline: Pipeline, item: Item, run_manager: AsyncCallbackManagerForLLMRun | None
) -> AsyncIterator[str]:
    """Async :func:`streamed`."""
    run = None
    if run_manager is not None:
        run = await achild(run_manager, "esi:generate").on_chain_start(
            None, {"question": item.prompt.question}, name="esi_generate"
        )
    try:
        async for piece in pipeline.astream(item):
            yield piece
    except BaseException as exc:
        if run is not None:
            await run.on_chain_error(exc)
        raise
    if run is not None:
        output = item.steps.get("generate")
        if isinstance(output, BaseException):
            await run.on_chain_error(output)
        else:
            await run.on_chain_end(_summary(output))
    if item.outcome is None:
        one = [item]

        async def intervene() -> None:
            pipeline.intervened(one, await pipeline.aintervene(one))

        await atraced(run_manager, "intervene", item, intervene)
        await atraced(run_manager, "score", item, lambda: pipeline.aforce(one))


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
