"""The scoring pipeline, with no LangChain: generate -> intervene -> force -> assess -> result.

Each prompt travels as one :class:`Item`; a step fills in what it learned (the answer,
the variants) or decides the item's ``outcome`` (an unscored result, or the error that
``on_error="raise"`` will raise). The steps that talk to the backend or the intervention
come in a sync and an async form, and a failure of a whole call becomes every item's own
error (:func:`~esi_guard._shield.shield`), so one bad call never takes a batch down.
Everything else here is pure.

:meth:`Pipeline.run` (and ``arun``) drives it::

    live = pipeline.generated(items, pipeline.generate(items))   # Backend.generate
    pipeline.intervened(live, pipeline.intervene(live))          # the intervention
    pipeline.force(live)          # plan, Backend.teacher_force, assess

after which every item's ``outcome`` is set. The guard calls the same steps one by one
when it traces them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, cast

from esi_guard._items import Item, Outcome
from esi_guard._rounds import Rounds
from esi_guard._shield import ashield, shield, wrapped
from esi_guard.backends.base import Backend, Forced, ForcingRequest, Generation
from esi_guard.combined import CombinedScore, free_signals
from esi_guard.exceptions import (
    BackendError,
    ConfigurationError,
    InputError,
    InterventionError,
    ScoringError,
    reason,
)
from esi_guard.result import Decision, ESIResult, ScoringConfig
from esi_guard.scoring import Distance, TopK, esi_score
from esi_guard.sequential import schedule, settled

if TYPE_CHECKING:
    from esi_guard.interventions import Intervention

__all__ = [
    "Action",
    "OnError",
    "Pipeline",
    "raised",
]

Action = Literal["flag", "abstain", "route"]
OnError = Literal["abstain", "flag", "raise"]


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
    combined: CombinedScore | None = None
    """When set, decisions are on its ``p_wrong`` (the threshold is a probability)."""
    """Stop sequences for generation."""

    def run(self, items: Sequence[Item]) -> None:
        """Every step for all ``items`` (one backend call per step); each ends decided."""
        live = self.generated(items, self.generate(items))
        self.intervened(live, self.intervene(live))
        self.force(live)

    async def arun(self, items: Sequence[Item]) -> None:
        """Async :meth:`run`."""
        live = self.generated(items, await self.agenerate(items))
        self.intervened(live, await self.aintervene(live))
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
        """Record the answers; the items that have one go on."""
        for item, gen in zip(items, gens, strict=True):
            item.steps["generate"] = gen
            if isinstance(gen, BackendError):
                item.outcome = self.failure(item, gen)
                continue
            item.answer, item.answer_ids = gen.text, gen.token_ids
            item.original, item.finish_reason = gen.topk, gen.finish_reason
            item.prompt_tokens = gen.prompt_tokens
        return [item for item in items if item.outcome is None]

    def stream(self, item: Item) -> Iterator[str]:
        """One item's answer as text pieces while it is generated; then it is recorded."""
        gen: Generation | BackendError | None = None
        try:
            for piece in self.backend.stream_generate(item.prompt.messages, **self._stream_args()):
                if isinstance(piece, str):
                    yield piece
                else:
                    gen = piece
        except (ConfigurationError, InputError):
            raise
        except Exception as exc:  # the engine failed: this answer fails closed
            gen = wrapped(exc, "generate", BackendError)
        self.generated([item], [gen or BackendError("the backend streamed no answer")])

    async def astream(self, item: Item) -> AsyncIterator[str]:
        """Async :meth:`stream`."""
        gen: Generation | BackendError | None = None
        pieces = self.backend.astream_generate(item.prompt.messages, **self._stream_args())
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

    def _stream_args(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.config.max_new_tokens,
            "top_k": self.config.top_k,
            "stop": self.stop,
        }

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
                item.outcome = self.failure(item, texts)
            else:
                item.variants = list(texts)

    # -- force and assess -------------------------------------------------------------------

    def force(self, items: Sequence[Item], *, include_original: bool = False) -> list[Outcome]:
        """Teacher-force each item's answer after its variants and decide every item.

        One backend call, or one per round with sequential ESI (``min_variants``).
        """
        rounds = self._rounds(items, include_original)
        requests = next(rounds)
        top_k = self.config.top_k
        while True:
            call = partial(self.backend.teacher_force, requests, top_k=top_k)
            forced = shield(call, len(requests), "teacher_force") if requests else []
            try:
                requests = rounds.send(forced)
            except StopIteration as done:
                return cast(list[Outcome], done.value)

    async def aforce(self, items: Sequence[Item]) -> list[Outcome]:
        """Async :meth:`force`."""
        rounds = self._rounds(items, include_original=False)
        requests = next(rounds)
        top_k = self.config.top_k
        while True:
            acall = partial(self.backend.ateacher_force, requests, top_k=top_k)
            forced = await ashield(acall, len(requests), "teacher_force") if requests else []
            try:
                requests = rounds.send(forced)
            except StopIteration as done:
                return cast(list[Outcome], done.value)

    def _rounds(
        self, items: Sequence[Item], include_original: bool
    ) -> Generator[list[ForcingRequest], list[Forced | BackendError], list[Outcome]]:
        """The forcing requests of each round (sent back their results); the outcomes."""
        sizes = schedule(self.config.min_variants or self.config.n_variants, self.config.n_variants)
        if len(sizes) == 1:
            planned = self.plan(items, include_original=include_original)
            forced = yield [request for _, request in planned]
            return self.assess(items, planned, forced)
        rounds = Rounds(items)
        for number, size in enumerate(sizes):
            last = number == len(sizes) - 1
            live = rounds.start(size, last=last)
            planned = self.plan(live, include_original=include_original and number == 0,
                                known=rounds.known, context=number == 0)  # fmt: skip
            forced = yield [request for _, request in planned]
            outs = rounds.record(planned, forced)
            for item in live:
                if item.outcome is not None:
                    continue
                result = self._round_result(item, rounds, outs.get(id(item)))
                # An intervention may give fewer than n_variants: all of them used, decide.
                final = last or len(rounds.full[id(item)]) <= size
                if isinstance(result, BackendError):
                    item.outcome = self.failure(item, result)
                elif (
                    final
                    or not result.scored
                    or settled(
                        result.variant_scores, self.threshold, self.config.stop_constant or 0.0
                    )
                ):
                    result.stopped_early = not final
                    item.outcome = result
        for item in items:
            item.steps["score"] = item.outcome
        return [cast(Outcome, item.outcome) for item in items]

    def _round_result(
        self, item: Item, rounds: Rounds, out: Forced | BackendError | None
    ) -> ESIResult | BackendError:
        """The item's result from every variant forced so far (``out``: this round's)."""
        if isinstance(out, BackendError):
            return out
        result = self._scored(item, rounds.merged(item), rounds.context.get(id(item)))
        result.work = rounds.work(item)
        return result

    def plan(
        self,
        items: Sequence[Item],
        *,
        include_original: bool,
        known: dict[int, dict[str, Any]] | None = None,
        context: bool = True,
    ) -> list[tuple[Item, ForcingRequest]]:
        """The forcing requests of the items that can be scored; the others are decided.

        An item whose template has a context gets a second request right after its own:
        the answer forced once after the prompt without its context (``context_reliance``).
        It is a request of its own so that the variants keep their shared prefix.
        Sequential rounds pass the texts already forced per item (``known``): only new
        ones are asked for, and an item with none gets no request this round.
        """
        planned = []
        for item in items:
            if item.outcome is not None:
                continue
            problem = self._unscorable(item)
            if problem is not None:
                item.outcome = self.result(item, None, reason(problem))
                continue
            done = known.get(id(item), {}) if known is not None else {}
            texts = [text for text in item.changed if text not in done]
            if not texts and not include_original:
                continue
            request = ForcingRequest(
                prompt=item.prompt.messages,
                variants=[item.prompt.with_question(text) for text in texts],
                answer_ids=list(item.answer_ids),
                answer=item.answer,
                include_original=include_original,
            )
            planned.append((item, request))
            template = item.prompt.template
            if context and template is not None and template.without_context is not None:
                planned.append((item, replace(request, variants=[template.without_context],
                                              include_original=False)))  # fmt: skip
        return planned

    def assess(
        self,
        items: Sequence[Item],
        planned: Sequence[tuple[Item, ForcingRequest]],
        forced: Sequence[Forced | BackendError],
    ) -> list[Outcome]:
        """Score each planned item from its forced distributions; every item's outcome."""
        by_item: dict[int, list[Forced | BackendError]] = {}
        for (item, _), out in zip(planned, forced, strict=True):
            by_item.setdefault(id(item), []).append(out)
        for item in items:
            if id(item) not in by_item:
                continue
            out, *context = by_item[id(item)]
            if isinstance(out, BackendError):
                item.outcome = self.failure(item, out)
            else:
                item.outcome = self._scored(item, out, context[0] if context else None)
        for item in items:
            item.steps["score"] = item.outcome
        return [cast(Outcome, item.outcome) for item in items]

    def _scored(
        self, item: Item, forced: Forced, context: Forced | BackendError | None
    ) -> ESIResult:
        base = item.original if item.original is not None else forced.original
        changed = item.changed
        question = item.prompt.question
        try:
            if base is None:
                msg = "the backend returned no original distributions"
                raise ScoringError(msg)
            if len(forced.variants) != len(changed):
                msg = f"the backend returned {len(forced.variants)} variants for {len(changed)}"
                raise ScoringError(msg)
            # Back to all L variants, in order: repeats share a result, unchanged ones are
            # the original (exact at every position).
            by_text = dict(zip(changed, forced.variants, strict=True))
            full = [len(item.answer_ids)] * len(changed)
            exact = dict(zip(changed, forced.observed or full, strict=True))
            everyone = [base if text == question else by_text[text] for text in item.variants]
            observed = None
            if forced.observed is not None:
                observed = [
                    len(item.answer_ids) if text == question else exact[text]
                    for text in item.variants
                ]
            esi = esi_score(
                base,
                everyone,
                distance=cast(Distance, self.config.distance),
                kind=self.backend.values_kind,
                observed=observed,
                support=self.config.support,
            )
            reliance = None if context is None else self._reliance(base, context)
        except ScoringError as exc:
            return self.result(item, None, reason(exc))
        rows = len(changed) + (forced.original is not None) + (context is not None)
        signals = free_signals(base, item.answer_ids, self.backend.values_kind, esi.alphas)
        result = self.result(
            item, esi.score, None, [float(x) for x in esi.token_scores], rows, reliance, signals
        )
        result.variant_scores = [float(x) for x in esi.variant_scores]
        return result

    def _reliance(self, base: TopK, context: Forced | BackendError) -> float:
        """How far the answer's distributions move when the context is taken away."""
        if isinstance(context, BackendError):
            msg = f"context reliance: {context}"
            raise ScoringError(msg, code=context.code)
        if len(context.variants) != 1:
            msg = f"context reliance: the backend returned {len(context.variants)} rows for 1"
            raise ScoringError(msg)
        distance = cast(Distance, self.config.distance)
        kind = self.backend.values_kind
        return esi_score(base, context.variants, distance=distance, kind=kind,
                         observed=context.observed, support=self.config.support).score  # fmt: skip

    def _unscorable(self, item: Item) -> ScoringError | None:
        if not item.answer_ids:
            return ScoringError("the answer has no tokens to score", code="empty_answer")
        if not item.changed:
            msg = (
                "no variant differs from the question "
                f"({self.intervention.name} found nothing to change)"
            )
            return ScoringError(msg, code="no_effective_variant")
        return None

    # -- results ----------------------------------------------------------------------------

    def failure(self, item: Item, error: BackendError) -> Outcome:
        """A failed step's outcome under ``on_error``: the error itself, or unscored."""
        if self.on_error == "raise":
            return error
        return self.result(item, None, reason(error))

    def result(
        self,
        item: Item,
        score: float | None,
        why: str | None,
        token_scores: list[float] | None = None,
        forced: int = 0,
        context_reliance: float | None = None,
        signals: dict[str, float] | None = None,
    ) -> ESIResult:
        """The item's result: scored, or unscored with ``why``; the decision it implies."""
        decision: Decision
        p_wrong = None
        if score is not None and self.combined is not None:
            p_wrong = self.combined.p_wrong({"esi": score, **(signals or {})})
        if (
            score is not None
            and self.config.decide_on == "context_reliance"
            and context_reliance is None
        ):
            score, token_scores = None, None
            why = (
                "scoring_error: decide_on='context_reliance' needs a prompt with a context "
                "(ESIGuard.with_prompt(..., context_key=...))"
            )
        if score is None:
            decision = "flag" if self.on_error == "flag" else "abstain"
        elif context_reliance is not None and self.config.decide_on == "context_reliance":
            decision = "accept" if context_reliance >= self.threshold else self.action
        elif p_wrong is not None:
            decision = "accept" if p_wrong <= self.threshold else self.action
        else:
            decision = "accept" if score <= self.threshold else self.action
        return ESIResult(
            score=score,
            threshold=self.threshold,
            decision=decision,
            scored=score is not None,
            reason=why,
            answer=item.answer,
            variants=list(item.variants),
            answer_token_ids=[int(i) for i in item.answer_ids],
            token_scores=token_scores or [],
            model=self.backend.model_id,
            scoring=self.config.as_metadata(),
            finish_reason=item.finish_reason,
            work={"forced_variants": forced, "forced_tokens": forced * len(item.answer_ids)},
            context_reliance=context_reliance,
            variants_used=len(item.variants),
            signals=dict(signals or {}),
            p_wrong=p_wrong,
        )

    def _generate_args(self, items: Sequence[Item]) -> dict[str, Any]:
        return {"prompts": [item.prompt.messages for item in items], **self._stream_args()}


def raised(outcome: Outcome) -> BackendError | ScoringError:
    """What ``on_error="raise"`` raises for an unscored outcome."""
    if isinstance(outcome, BackendError):
        return outcome
    code = (outcome.reason or "").partition(":")[0] or None
    msg = f"the answer could not be scored: {outcome.reason}"
    return ScoringError(msg, result=outcome, code=code)
