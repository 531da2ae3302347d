"""Child runs for the guard's steps, so a trace shows generation, intervention and scoring.

Each step is a child run tagged ``esi:{step}`` (like ``retry:attempt:{n}``): the question in, a
small summary out. ``batch`` runs the steps before the prompts' runs start, so there they are
replayed (:func:`replay`; their timings are not the steps').
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol, TypeVar

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)

from esi_guard.backends._types import Generation
from esi_guard.result import ESIResult

__all__ = ["ATraced", "Traced", "achild", "areplay", "child", "replay"]


class _Prompt(Protocol):
    @property
    def question(self) -> str: ...


class Stepped(Protocol):
    """What a hook reads of an item: its question, and what each step gave."""

    @property
    def prompt(self) -> _Prompt: ...

    @property
    def steps(self) -> dict[str, Any]: ...


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


class Traced:
    """The pipeline's step hook: each step a child run of ``run_manager``'s run."""

    def __init__(self, run_manager: CallbackManagerForLLMRun | None) -> None:
        self.run_manager = run_manager

    @contextmanager
    def __call__(self, step: str, items: Sequence[Stepped]) -> Iterator[None]:
        """Open a run tagged ``esi:{step}`` per item; close it with what the step gave."""
        if self.run_manager is None:
            yield
            return
        manager = child(self.run_manager, f"esi:{step}")
        runs = [manager.on_chain_start(None, {"question": item.prompt.question},
                                       name=f"esi_{step}") for item in items]  # fmt: skip
        try:
            yield
        except BaseException as exc:
            for run in runs:
                run.on_chain_error(exc)
            raise
        for item, run in zip(items, runs, strict=True):
            output = item.steps.get(step)
            if isinstance(output, BaseException):
                run.on_chain_error(output)
            else:
                run.on_chain_end(_summary(output))


class ATraced:
    """Async :class:`Traced`."""

    def __init__(self, run_manager: AsyncCallbackManagerForLLMRun | None) -> None:
        self.run_manager = run_manager

    @asynccontextmanager
    async def __call__(self, step: str, items: Sequence[Stepped]) -> AsyncIterator[None]:
        """Async :meth:`Traced.__call__`."""
        if self.run_manager is None:
            yield
            return
        manager = achild(self.run_manager, f"esi:{step}")
        runs = [await manager.on_chain_start(None, {"question": item.prompt.question},
                                             name=f"esi_{step}") for item in items]  # fmt: skip
        try:
            yield
        except BaseException as exc:
            for run in runs:
                await run.on_chain_error(exc)
            raise
        for item, run in zip(items, runs, strict=True):
            output = item.steps.get(step)
            if isinstance(output, BaseException):
                await run.on_chain_error(output)
            else:
                await run.on_chain_end(_summary(output))


def replay(hook: Traced, item: Stepped) -> None:
    """The child runs of the steps that already ran for ``item`` (in a batch), in order."""
    for step in item.steps:
        with hook(step, [item]):
            pass


async def areplay(hook: ATraced, item: Stepped) -> None:
    """Async :func:`replay`."""
    for step in item.steps:
        async with hook(step, [item]):
            pass


def _summary(output: Any) -> dict[str, Any]:
    """What a child run shows: small and JSON-friendly, never raw distributions."""
    if isinstance(output, Generation):
        return {"answer": output.text, "n_tokens": len(output.token_ids)}
    if isinstance(output, ESIResult):
        return {"score": output.score, "scored": output.scored, "reason": output.reason}
    return {"variants": output}
