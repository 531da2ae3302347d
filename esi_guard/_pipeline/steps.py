"""The scoring pipeline, with no LangChain: generate -> intervene -> score (force, decide).

Each prompt travels as an :class:`Item` that steps fill in or decide (its ``outcome``). The order
is written once, sans-IO, in :meth:`Pipeline.steps`; :meth:`Pipeline.run`, :meth:`~Pipeline.arun`,
:meth:`~Pipeline.stream`, :meth:`~Pipeline.astream` and
:func:`~esi_guard._pipeline.by_sentence.stream` only do its :class:`Work`. A whole call's failure
becomes each item's error (:func:`shield`), so one bad call never takes a batch down. Each step
runs inside the caller's ``hook``: how the guard traces steps without restating the order.
"""

from __future__ import annotations

from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

from esi_guard._pipeline.decide import Rule, assess, early, plan
from esi_guard._pipeline.items import Item, Outcome
from esi_guard.backends._types import Forced, ForcingRequest, Generation
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import HiddenSpec, merged
from esi_guard.combined import answer_signals
from esi_guard.exceptions import (
    BackendError,
    ConfigurationError,
    InputError,
    InterventionError,
)
from esi_guard.result import ScoringConfig

if TYPE_CHECKING:
    from esi_guard.interventions import Intervention

__all__ = [
    "AsyncStepHook",
    "Pipeline",
    "Step",
    "StepHook",
    "Steps",
    "Work",
    "ashield",
    "sent",
    "shield",
    "streamed",
    "wrapped",
]

Step = Literal["generate", "intervene", "score"]

T = TypeVar("T")


class StepHook(Protocol):
    """Called around each step: a context manager entered before it, exited after it.

    Each item's output or failure is then in ``item.steps[step]``; a step's raise passes through.
    """

    def __call__(self, step: Step, items: Sequence[Item]) -> AbstractContextManager[Any]:
        """The context the step runs in."""
        ...


class AsyncStepHook(Protocol):
    """Async :class:`StepHook`."""

    def __call__(self, step: Step, items: Sequence[Item]) -> AbstractAsyncContextManager[Any]:
        """The context the step runs in."""
        ...


class _NoHook:
    """The hook of an untraced run: it does nothing, sync or async."""

    def __call__(self, step: Step, items: Sequence[Item]) -> nullcontext[None]:
        return nullcontext()


_NO_HOOK = _NoHook()


@dataclass(frozen=True)
class Work:
    """What the order asks for: ``step`` for ``items``; results come back in order, one each."""

    step: Step
    items: list[Item]
    requests: list[ForcingRequest] = field(default_factory=list)


Steps = Generator[Work, list[Any], None]
"""The order of the steps (:meth:`Pipeline.steps`): works asked for, their results sent."""


@dataclass(frozen=True)
class Pipeline:
    """A guard's scoring pipeline: its model, its intervention and its decision settings."""

    backend: Backend
    intervention: Intervention
    rule: Rule
    """The decision's settings and the results they give (:class:`Rule`)."""
    stop: tuple[str, ...] = ()
    """Stop sequences for generation."""

    @property
    def config(self) -> ScoringConfig:
        """How scores are computed (the rule's)."""
        return self.rule.config

    @cached_property
    def hidden(self) -> HiddenSpec | None:
        """The hidden states to read with each answer: the stages' and those to keep."""
        return merged(self.rule.policy.needs_hidden, self.rule.keep_hidden)

    def steps(
        self, items: Sequence[Item], answered: bool = False, variants_first: bool = False
    ) -> Steps:
        """The steps in their order, sans-IO: the only place the order is written.

        Yields the :class:`Work` of undecided items; a driver does it (:meth:`do`, or its own way)
        and sends the results back. ``answered``: the items hold their answers (no generation;
        the original row is forced). ``variants_first``: variants before the answer.
        """
        live = [item for item in items if item.outcome is None]
        if variants_first and live and self.rule.uses_esi:
            self.intervened(live, (yield Work("intervene", live)))
        if not answered:
            self.generated(live, (yield Work("generate", live)))
            live = [item for item in live if item.outcome is None]
        if live and self.rule.uses_esi and not variants_first:
            self.intervened(live, (yield Work("intervene", live)))
        if live:
            planned = self.planned(live, include_original=answered)
            forced = yield Work("score", live, [request for _, request in planned])
            self.assessed(live, planned, forced)

    def do(self, work: Work) -> list[Any]:
        """A step's work, done: one call for all its items (a failure in place, per item)."""
        if work.step == "score" and not work.requests:
            return []
        backend = self.backend
        call, size, what, kind = self._call(work, backend.generate,
                                             self.intervention.batch_variants,
                                             backend.teacher_force)  # fmt: skip
        return shield(call, size, what, kind)

    async def ado(self, work: Work) -> list[Any]:
        """Async :meth:`do`."""
        if work.step == "score" and not work.requests:
            return []
        backend = self.backend
        call, size, what, kind = self._call(work, backend.agenerate,
                                             self.intervention.abatch_variants,
                                             backend.ateacher_force)  # fmt: skip
        return await ashield(call, size, what, kind)

    def _call(
        self,
        work: Work,
        generate: Callable[..., Any],
        variants: Callable[..., Any],
        force: Callable[..., Any],
    ) -> tuple[Callable[[], Any], int, str, type[BackendError]]:
        """The one call ``work`` needs (``generate``, ``variants`` or ``force``, bound)."""
        if work.step == "generate":
            prompts = [item.prompt.messages for item in work.items]
            return (partial(generate, prompts=prompts, **self.stream_args()), len(work.items),
                    "generate", BackendError)  # fmt: skip
        if work.step == "intervene":
            questions = [item.prompt.question for item in work.items]
            config = self.config
            return (partial(variants, questions, config.n_variants, seed=config.seed),
                    len(work.items), "intervention", InterventionError)  # fmt: skip
        return (partial(force, work.requests, top_k=self.config.top_k), len(work.requests),
                "teacher_force", BackendError)  # fmt: skip

    def run(self, items: Sequence[Item], hook: StepHook = _NO_HOOK, answered: bool = False) -> None:
        """Every step for all ``items`` (one backend call per step); each ends decided."""
        steps = self.steps(items, answered)
        work = next(steps, None)
        while work is not None:
            with hook(work.step, work.items):
                work = sent(steps, self.do(work))

    async def arun(self, items: Sequence[Item], hook: AsyncStepHook = _NO_HOOK) -> None:
        """Async :meth:`run`."""
        steps = self.steps(items)
        work = next(steps, None)
        while work is not None:
            async with hook(work.step, work.items):
                work = sent(steps, await self.ado(work))

    def stream(self, item: Item, hook: StepHook = _NO_HOOK) -> Iterator[str]:
        """:meth:`run` for one item whose answer's text pieces come out as generated."""
        steps = self.steps([item])
        work = next(steps, None)
        while work is not None:
            with hook(work.step, work.items):
                if work.step == "generate":
                    args = self.stream_args()
                    pieces = self.backend.stream_generate(item.prompt.messages, **args)
                    done: list[Any] = [(yield from streamed(cast(Iterator[str], pieces)))]
                else:
                    done = self.do(work)
                work = sent(steps, done)

    async def astream(self, item: Item, hook: AsyncStepHook = _NO_HOOK) -> AsyncIterator[str]:
        """Async :meth:`stream`."""
        steps = self.steps([item])
        work = next(steps, None)
        while work is not None:
            async with hook(work.step, work.items):
                if work.step == "generate":
                    done: list[Any] = []
                    async for piece in self._apieces(item, done):
                        yield piece
                else:
                    done = await self.ado(work)
                work = sent(steps, done)

    # -- generate ---------------------------------------------------------------------------

    def generated(
        self, items: Sequence[Item], gens: Sequence[Generation | BackendError]
    ) -> list[Item]:
        """Record the answers; those that have one and the cascade does not decide go on."""
        for item, gen in zip(items, gens, strict=True):
            item.steps["generate"] = gen
            if isinstance(gen, BackendError):
                item.variants = []  # variants asked first: the whole call's result has none
                item.outcome = self.rule.failure(item, gen)
                continue
            item.answer, item.answer_ids = gen.text, gen.token_ids
            item.original, item.finish_reason = gen.topk, gen.finish_reason
            item.prompt_tokens, item.hidden = gen.prompt_tokens, gen.hidden
            failed = item.steps.get("intervene")
            if isinstance(failed, BackendError):  # variants came first: decided with its answer
                item.outcome = self.rule.failure(item, failed)
            elif self.rule.decides_early:
                kind = self.backend.values_kind
                item.signals = answer_signals(gen.topk, item.answer_ids, kind, item.answer)
                early(item, gen.topk, gen.hidden, self.rule, item.signals)
        return [item for item in items if item.outcome is None]

    async def _apieces(self, item: Item, done: list[Any]) -> AsyncIterator[str]:
        """One answer's text pieces as generated; its Generation (or failure) in ``done``."""
        gen: Generation | BackendError | None = None
        pieces = self.backend.astream_generate(item.prompt.messages, **self.stream_args())
        try:
            async for piece in pieces:
                if isinstance(piece, str):
                    yield piece
                else:
                    gen = piece
        except (ConfigurationError, InputError):
            raise
        except Exception as exc:  # the engine failed: this answer fails closed
            gen = wrapped(exc, "generate", BackendError)
        done.append(gen or BackendError("the backend streamed no answer"))

    def stream_args(self) -> dict[str, Any]:
        """An answer's generation settings (``generate``'s and ``stream_generate``'s keywords)."""
        args: dict[str, Any] = {
            "max_new_tokens": self.config.max_new_tokens,
            "top_k": self.config.top_k,
            "stop": self.stop,
        }
        if self.hidden is not None:
            args["hidden"] = self.hidden
        return args

    # -- intervene --------------------------------------------------------------------------

    def intervened(
        self, items: Sequence[Item], variants: Sequence[list[str] | BackendError]
    ) -> None:
        """Record the variants (or the intervention's failure)."""
        for item, texts in zip(items, variants, strict=True):
            item.steps["intervene"] = texts
            if isinstance(texts, BackendError):
                item.outcome = self.rule.failure(item, texts)
            else:
                item.variants = list(texts)

    # -- score ------------------------------------------------------------------------------

    def planned(
        self, items: Sequence[Item], include_original: bool
    ) -> list[tuple[Item, ForcingRequest]]:
        """The forcing requests of the scorable items (without ESI: the answer after the prompt)."""
        if not self.rule.uses_esi:
            return [
                (item, ForcingRequest(prompt=item.prompt.messages, variants=[],
                                      answer_ids=list(item.answer_ids), answer=item.answer,
                                      include_original=True, hidden=self.hidden))
                for item in items if item.outcome is None and item.answer_ids
            ]  # fmt: skip
        for item in items:
            if item.outcome is None and item.answer_ids and item.token_ends is None:
                item.token_ends = self.backend.token_offsets(item.answer_ids, item.answer)
        return plan(items, rule=self.rule, hidden=self.hidden, intervention=self.intervention,
                    include_original=include_original)  # fmt: skip

    def assessed(
        self,
        items: Sequence[Item],
        planned: Sequence[tuple[Item, ForcingRequest]],
        forced: Sequence[Forced | BackendError],
    ) -> list[Outcome]:
        """Every item decided from its planned requests' forced distributions."""
        return assess(items, planned, forced, self.rule, self.backend.values_kind)


def sent(steps: Steps, done: list[Any]) -> Work | None:
    """The next work ``steps`` asks for once given ``done``; None when every item is decided."""
    try:
        return steps.send(done)
    except StopIteration:
        return None


def streamed(
    pieces: Iterable[T | Generation | BackendError],
) -> Generator[T, None, Generation | BackendError]:
    """A backend stream's pieces but its last, the Generation (or failure), which it returns."""
    gen: Generation | BackendError | None = None
    try:
        for piece in pieces:
            if isinstance(piece, (Generation, BackendError)):
                gen = piece
            else:
                yield piece
    except (ConfigurationError, InputError):
        raise
    except Exception as exc:  # the engine failed: this answer fails closed
        gen = wrapped(exc, "generate", BackendError)
    return gen or BackendError("the backend streamed no answer")


def _checked(out: Sequence[Any], size: int, what: str) -> list[Any]:
    if len(out) != size:
        msg = f"{what} returned {len(out)} results for {size} inputs"
        return [BackendError(msg)] * size
    return list(out)


def wrapped(exc: Exception, what: str, kind: type[BackendError]) -> BackendError:
    """``exc`` as a ``kind`` error naming the step (itself when it already is one)."""
    if isinstance(exc, kind):
        return exc
    error = kind(f"{what} failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def shield(
    call: Callable[[], Sequence[T | BackendError]],
    size: int,
    what: str,
    kind: type[BackendError] = BackendError,
) -> list[T | BackendError]:
    """A batched step's results; a failure of the whole call is each input's ``kind`` error.

    Configuration and input errors still raise: the caller's to fix, before any answer exists.
    """
    try:
        return _checked(call(), size, what)
    except (ConfigurationError, InputError):
        raise
    except Exception as exc:  # any engine failure fails closed, per input
        return [wrapped(exc, what, kind)] * size


async def ashield(
    call: Callable[[], Awaitable[Sequence[T | BackendError]]],
    size: int,
    what: str,
    kind: type[BackendError] = BackendError,
) -> list[T | BackendError]:
    """Async :func:`shield` (cancellation still propagates)."""
    try:
        return _checked(await call(), size, what)
    except (ConfigurationError, InputError):
        raise
    except Exception as exc:  # any engine failure fails closed, per input
        return [wrapped(exc, what, kind)] * size
