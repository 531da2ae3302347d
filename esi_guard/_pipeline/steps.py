"""The scoring pipeline, with no LangChain: generate -> intervene -> score (force, assess).

Each prompt travels as one :class:`Item`; a step fills in what it learned (the answer,
the variants) or decides the item's ``outcome`` (an unscored result, or the error that
``on_error="raise"`` will raise). The steps that talk to the backend or the intervention
come in a sync and an async form, and a failure of a whole call becomes every item's own
error (:func:`~esi_guard._pipeline.shield.shield`), so one bad call never takes a batch
down. Decisions are :class:`~esi_guard._pipeline.decide.Rule`'s.

The order of the steps is written once, in :meth:`Pipeline.order`; :meth:`Pipeline.run`,
:meth:`~Pipeline.arun`, :meth:`~Pipeline.stream` and :meth:`~Pipeline.astream` are thin
drivers over it. Each step runs inside the caller's ``hook`` (a context manager per step,
given the step's name and items), which is how the guard shows every step as a child run
without restating the order, as ``BaseChatModel.generate`` hands its run manager down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

from esi_guard._pipeline.assess import assess, plan
from esi_guard._pipeline.decide import Rule
from esi_guard._pipeline.items import Item, Outcome
from esi_guard._pipeline.shield import ashield, shield, wrapped
from esi_guard.backends._types import Forced, ForcingRequest, Generation
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import HiddenSpec, HiddenStates, merged
from esi_guard.combined import free_signals
from esi_guard.exceptions import (
    BackendError,
    ConfigurationError,
    InputError,
    InterventionError,
)
from esi_guard.policy import Policy, granularity
from esi_guard.result import Action, OnError, ScoringConfig
from esi_guard.scoring import TopK

if TYPE_CHECKING:
    from esi_guard.interventions import Intervention

__all__ = ["AsyncStepHook", "Pipeline", "Step", "StepHook"]

Step = Literal["generate", "intervene", "score"]

T = TypeVar("T")


class StepHook(Protocol):
    """Called around each step: a context manager entered before it, exited after it.

    Exited normally, the step's output per item is in ``item.steps[step]`` (an
    exception there is the step's failure for that item); an exception raised by the
    step itself passes through the hook's exit.
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
class Pipeline:
    """The guard's settings, as the steps need them."""

    backend: Backend
    intervention: Intervention
    config: ScoringConfig
    threshold: float
    action: Action
    on_error: OnError
    stop: tuple[str, ...] = ()
    """Stop sequences for generation."""
    keep_hidden: HiddenSpec | None = None
    """Hidden states to read and keep in each result (beside what the policy's stages read)."""
    decision_policy: Policy | None = None
    """The stages that decide each answer (None: ESI alone at ``threshold``)."""
    return_failures: bool = False
    """A failed step's error is the item's outcome whatever ``on_error`` (:class:`Rule`)."""
    sentence_threshold: float | None = None
    """The threshold of sentences' scores (None: ``threshold``)."""
    threshold_source: str = "given"
    """Where the threshold came from (:attr:`ESIGuard.threshold_source`)."""
    decide_on: Literal["esi", "sentences"] = "esi"
    """What the threshold applies to: the answer's score, or each sentence's."""

    @cached_property
    def policy(self) -> Policy:
        """The stages that decide each answer (:class:`~esi_guard.policy.Policy`)."""
        if self.decision_policy is not None:
            return self.decision_policy
        return Policy.of(self.threshold, granularity=granularity(self.action, self.decide_on))

    @cached_property
    def hidden(self) -> HiddenSpec | None:
        """The hidden states to read with each answer: the stages' and those to keep."""
        return merged(self.policy.needs_hidden, self.keep_hidden)

    @cached_property
    def rule(self) -> Rule:
        """How results are decided."""
        return Rule(self.threshold, self.action, self.on_error, self.config,
                    self.backend.model_id, self.policy, self.keep_hidden is not None,
                    self.return_failures, self.sentence_threshold,
                    self.threshold_source, self.decide_on)  # fmt: skip

    def order(
        self, items: Sequence[Item], answered: bool = False
    ) -> Iterator[tuple[Step, list[Item]]]:
        """The steps in their order, each with the items it runs for; the only place it is written.

        An item decided by a step (a failed generation) leaves the order; an item that
        reaches intervention is scored even when the intervention failed (the score step
        records its outcome). ``answered``: the items hold their answers (``score``):
        no generation.
        """
        live = [item for item in items if item.outcome is None]
        if not answered:
            yield "generate", live
            live = [item for item in live if item.outcome is None]
        if live and self.rule.uses_esi:
            yield "intervene", live
        if live:
            yield "score", live

    def run(self, items: Sequence[Item], hook: StepHook = _NO_HOOK, answered: bool = False) -> None:
        """Every step for all ``items`` (one backend call per step); each ends decided."""
        for step, live in self.order(items, answered):
            with hook(step, live):
                if step == "generate":
                    self.generated(live, self.generate(live))
                elif step == "intervene":
                    self.intervened(live, self.intervene(live))
                else:
                    self.force(live, include_original=answered)

    async def arun(self, items: Sequence[Item], hook: AsyncStepHook = _NO_HOOK) -> None:
        """Async :meth:`run`."""
        for step, live in self.order(items):
            async with hook(step, live):
                if step == "generate":
                    self.generated(live, await self.agenerate(live))
                elif step == "intervene":
                    self.intervened(live, await self.aintervene(live))
                else:
                    await self.aforce(live)

    def stream(self, item: Item, hook: StepHook = _NO_HOOK) -> Iterator[str]:
        """:meth:`run` for one item whose answer's text pieces come out as generated."""
        for step, live in self.order([item]):
            with hook(step, live):
                if step == "generate":
                    yield from self._pieces(item)
                elif step == "intervene":
                    self.intervened(live, self.intervene(live))
                else:
                    self.force(live)

    async def astream(self, item: Item, hook: AsyncStepHook = _NO_HOOK) -> AsyncIterator[str]:
        """Async :meth:`stream`."""
        for step, live in self.order([item]):
            async with hook(step, live):
                if step == "generate":
                    async for piece in self._apieces(item):
                        yield piece
                elif step == "intervene":
                    self.intervened(live, await self.aintervene(live))
                else:
                    await self.aforce(live)

    # -- generate ---------------------------------------------------------------------------

    def generate(self, items: Sequence[Item]) -> list[Generation | BackendError]:
        """Greedy answers, one per item (a failure in place)."""
        call = lambda: self.backend.generate(**self._generate_args(items))  # noqa: E731
        return shield(call, len(items), "generate")

    async def agenerate(self, items: Sequence[Item]) -> list[Generation | BackendError]:
        """Async :meth:`generate`."""
        call = lambda: self.backend.agenerate(**self._generate_args(items))  # noqa: E731
        return await ashield(call, len(items), "generate")

    def generated(
        self, items: Sequence[Item], gens: Sequence[Generation | BackendError]
    ) -> list[Item]:
        """Record the answers; those that have one and the cascade does not decide go on."""
        for item, gen in zip(items, gens, strict=True):
            item.steps["generate"] = gen
            if isinstance(gen, BackendError):
                item.outcome = self.rule.failure(item, gen)
                continue
            item.answer, item.answer_ids = gen.text, gen.token_ids
            item.original, item.finish_reason = gen.topk, gen.finish_reason
            item.prompt_tokens, item.hidden = gen.prompt_tokens, gen.hidden
            if self.rule.decides_early:
                self._early(item, gen.topk, gen.hidden)
        return [item for item in items if item.outcome is None]

    def _early(self, item: Item, topk: TopK | None, hidden: HiddenStates | None) -> None:
        """Decide ``item`` without ESI where the rule can (a cascade, or a guard without ESI)."""
        signals = None
        if topk is not None and item.answer_ids:
            signals = free_signals(topk, item.answer_ids, self.backend.values_kind,
                                   text=item.answer)  # fmt: skip
            item.signals = signals if topk is item.original else None
        item.outcome = self.rule.early(item, signals, hidden)
        if item.outcome is not None:
            item.steps["score"] = item.outcome

    def _pieces(self, item: Item) -> Iterator[str]:
        """One item's answer as text pieces while it is generated; then it is recorded."""
        pieces = self.backend.stream_generate(item.prompt.messages, **self.stream_args())
        return cast(Iterator[str], self.streamed(item, pieces))

    def streamed(self, item: Item, pieces: Iterable[T | Generation | BackendError]) -> Iterator[T]:
        """A backend stream's pieces but its last (the Generation), which is recorded.

        A failure of the engine midway fails the answer closed.
        """
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
        self.generated([item], [gen or BackendError("the backend streamed no answer")])

    async def _apieces(self, item: Item) -> AsyncIterator[str]:
        """Async :meth:`_pieces`."""
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
        self.generated([item], [gen or BackendError("the backend streamed no answer")])

    def stream_args(self) -> dict[str, Any]:
        """The generation settings of a streamed answer (``stream_generate``'s keywords)."""
        args: dict[str, Any] = {
            "max_new_tokens": self.config.max_new_tokens,
            "top_k": self.config.top_k,
            "stop": self.stop,
        }
        if self.hidden is not None:
            args["hidden"] = self.hidden
        return args

    # -- intervene --------------------------------------------------------------------------

    def intervene(self, items: Sequence[Item]) -> list[list[str] | BackendError]:
        """The question's variants, per item (a failure in place)."""
        questions = [item.prompt.question for item in items]
        n, seed = self.config.n_variants, self.config.seed
        call = lambda: self.intervention.batch_variants(questions, n, seed=seed)  # noqa: E731
        return shield(call, len(items), "intervention", InterventionError)

    async def aintervene(self, items: Sequence[Item]) -> list[list[str] | BackendError]:
        """Async :meth:`intervene`."""
        questions = [item.prompt.question for item in items]
        n, seed = self.config.n_variants, self.config.seed
        call = lambda: self.intervention.abatch_variants(questions, n, seed=seed)  # noqa: E731
        return await ashield(call, len(items), "intervention", InterventionError)

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

    # -- force and assess -------------------------------------------------------------------

    def force(self, items: Sequence[Item], *, include_original: bool = False) -> list[Outcome]:
        """Teacher-force each item's answer after its variants and decide every item.

        One backend call. A guard without ESI (an answer it was handed: it generated none)
        forces the answer after the prompt alone, for its distributions and states.
        """
        if not self.rule.uses_esi:
            return self._force_free(items)
        planned = self.planned(items, include_original)
        requests = [request for _, request in planned]
        call = partial(self.backend.teacher_force, requests, top_k=self.config.top_k)
        forced = shield(call, len(requests), "teacher_force") if requests else []
        return self.assessed(items, planned, forced)

    def _force_free(self, items: Sequence[Item]) -> list[Outcome]:
        """A guard without ESI scoring answers it did not generate: the original row only."""
        live = [item for item in items if item.outcome is None and item.answer_ids]
        requests = [
            ForcingRequest(prompt=item.prompt.messages, variants=[],
                           answer_ids=list(item.answer_ids), answer=item.answer,
                           include_original=True, hidden=self.hidden)
            for item in live
        ]  # fmt: skip
        call = partial(self.backend.teacher_force, requests, top_k=self.config.top_k)
        forced = shield(call, len(requests), "teacher_force") if requests else []
        for item, out in zip(live, forced, strict=True):
            if isinstance(out, BackendError):
                item.outcome = self.rule.failure(item, out)
            else:
                self._early(item, out.original, out.hidden)
        for item in items:
            if item.outcome is None:  # no tokens
                self._early(item, None, None)
            item.steps["score"] = item.outcome
        return [cast(Outcome, item.outcome) for item in items]

    async def aforce(self, items: Sequence[Item]) -> list[Outcome]:
        """Async :meth:`force`."""
        planned = self.planned(items, include_original=False)
        requests = [request for _, request in planned]
        acall = partial(self.backend.ateacher_force, requests, top_k=self.config.top_k)
        forced = await ashield(acall, len(requests), "teacher_force") if requests else []
        return self.assessed(items, planned, forced)

    def planned(
        self, items: Sequence[Item], include_original: bool
    ) -> list[tuple[Item, ForcingRequest]]:
        """The forcing requests of the items that can be scored (the others are decided)."""
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

    def _generate_args(self, items: Sequence[Item]) -> dict[str, Any]:
        return {"prompts": [item.prompt.messages for item in items], **self.stream_args()}
