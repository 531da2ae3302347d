"""ESIGuard: the Runnable that generates, scores with ESI, decides and acts.

The guard knows no backend internals: it asks its backend for greedy answers and for
teacher-forced distributions, its intervention for variants, and ``esi_score`` for the
number. Each of those steps shows as a tagged child run (``esi:generate``,
``esi:intervene``, ``esi:score``, and ``esi:fallback`` when routing).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSerializable
from langchain_core.runnables.config import patch_config
from pydantic import ConfigDict, Field, ValidationError, model_validator

from esi_guard._inputs import GuardedPrompt, message_text, parse_input
from esi_guard.backends.base import Backend, Forced, ForcingRequest, Generation
from esi_guard.exceptions import (
    BackendError,
    ConfigurationError,
    ContextLengthError,
    InputError,
    ScoringError,
)
from esi_guard.interventions import Intervention, SkipOneChar, Typo
from esi_guard.scoring import Distance, TopK, esi_score

__all__ = ["ESIGuard", "ESIResult", "GuardInput"]

GuardInput: TypeAlias = (
    str | PromptValue | Sequence[BaseMessage | tuple[str, str] | dict[str, Any] | str]
)
"""What the guard takes: a string, a PromptValue, or a list of messages."""

Action = Literal["flag", "abstain", "route"]
OnError = Literal["abstain", "flag", "raise"]
Decision = Literal["accept", "flag", "abstain", "route"]

DEFAULT_ABSTAIN_MESSAGE = "I am not confident enough to answer that reliably."


@dataclass
class ESIResult:
    """What the guard found about one answer; ``as_dict()`` is ``response_metadata["esi"]``."""

    score: float | None
    """ESI score, or None when the answer could not be scored."""
    threshold: float
    """Scores above it are not trusted."""
    decision: Decision
    """``accept`` (scored, at or below the threshold) or the action taken."""
    scored: bool
    """False when no score could be computed; the action is then taken (fail closed)."""
    reason: str | None
    """Why the answer was not scored, or None."""
    answer: str
    """The model's answer (kept here when withheld or replaced)."""
    variants: list[str]
    """The intervened question texts actually used."""
    answer_token_ids: list[int]
    """Answer tokens, end-of-sequence excluded."""
    token_scores: list[float]
    """Per-token contributions (mean over variants of alpha_t * D)."""
    model: str
    """Backend's model identity."""
    scoring: dict[str, Any] = field(default_factory=dict)
    """Scoring configuration: intervention, n_variants, top_k, distance, approximate."""
    finish_reason: str | None = None
    """``stop`` or ``length`` when the guard generated the answer."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy."""
        return asdict(self)


class ESIGuard(RunnableSerializable[GuardInput, AIMessage]):
    """Guard a model's answers with the ESI uncertainty score.

    For each prompt the guard generates the greedy answer, builds ``n_variants``
    intervened copies of the question (the last human message only), teacher-forces
    the same answer after each, and scores how much the token distributions move.
    Above ``threshold`` it acts: ``flag`` returns the answer marked untrusted,
    ``abstain`` replaces it with ``abstain_message``, ``route`` returns ``fallback``'s
    answer to the original input. An answer that cannot be scored (empty, or no
    variant differs from the question) is never passed as trusted: the action is
    handled by ``on_error`` and ``reason`` says why.

    **Failure policy** (``on_error``), for every answer that cannot be scored: the
    backend failed after its retries (``backend_error``), the prompt and answer do not
    fit the model's context (``context_overflow``), the answer is empty
    (``empty_answer``), no variant differs from the question
    (``no_effective_variant``), the distributions hold NaN/inf (``scoring_error``) or
    the intervention failed (``intervention_error``):

    * ``"abstain"`` (default): ``abstain_message`` is returned in its place;
    * ``"flag"``: the answer (empty when none was generated) is returned flagged;
    * ``"raise"``: the error is raised (``invoke``) or returned in place
      (``batch(..., return_exceptions=True)``): the backend's :class:`BackendError`
      or a :class:`ScoringError` whose ``result`` holds the answer.

    Either way ``response_metadata["esi"]`` has ``scored: false`` and ``reason``
    (``"<code>: <message>"``): an unscored answer is never passed as trusted. Inputs
    that are not a prompt at all (wrong type, no human message, empty question) raise
    :class:`InputError` whatever the policy.

    The output is an ``AIMessage`` whose ``response_metadata["esi"]`` holds the score,
    decision, variants, token scores and configuration (see :class:`ESIResult`).

    A failure that concerns one prompt (an API request that failed after its retries)
    is that prompt's alone; a failure of a whole backend call (a forward pass that
    raised) is every prompt of that call's. The other prompts keep their answers.
    The guard holds no state between calls, so one guard may serve many threads and
    tasks; :class:`~esi_guard.HFBackend` serialises its forward passes with a lock, and
    :class:`~esi_guard.OpenAIBackend` bounds its requests in flight.

    ``batch``/``abatch`` send all prompts through the backend together. ``stream`` and
    ``astream`` yield one chunk: the answer is held until it has been scored, since a
    guard cannot vouch for text it has not seen whole.

    Example:
        .. code-block:: python

            from esi_guard import ESIGuard, HFBackend

            guard = ESIGuard(backend=HFBackend.default(), threshold=0.3, action="abstain")
            message = guard.invoke("What is the capital of France?")
            message.response_metadata["esi"]["score"]
    """

    backend: Backend
    """The model engine (``HFBackend``, ``FakeBackend``...)."""
    threshold: float
    """Scores strictly above it are untrusted; calibrate it on labelled data."""
    intervention: Intervention = Field(default_factory=SkipOneChar)
    """How variants of the question are made (SOC with p=0.3, M*=3 by default)."""
    n_variants: int = Field(default=10, ge=1)
    """L, the number of intervened variants per question."""
    top_k: int = Field(default=100, ge=1)
    """k, the number of tokens kept in each truncated distribution."""
    distance: Distance = "hellinger"
    """Distance between truncated distributions."""
    action: Action = "flag"
    """What to do with an untrusted answer: ``flag``, ``abstain`` or ``route``."""
    fallback: Runnable[Any, Any] | None = None
    """Runnable invoked with the original input when ``action="route"``."""
    abstain_message: str = DEFAULT_ABSTAIN_MESSAGE
    """Content returned in place of an untrusted answer when ``action="abstain"``."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Most tokens generated per answer."""
    seed: int = 0
    """Seed of the intervention; variants depend only on it and the question."""
    on_error: OnError = "abstain"
    """What to do with an answer that cannot be scored: ``abstain``, ``flag`` or ``raise``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    def __init__(self, **kwargs: Any) -> None:
        """Validate the configuration; any invalid field is a :class:`ConfigurationError`."""
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            msg = f"invalid ESIGuard configuration: {exc}"
            raise ConfigurationError(msg) from exc

    @model_validator(mode="after")
    def _check(self) -> ESIGuard:
        if not math.isfinite(self.threshold):
            msg = f"threshold must be a finite number, got {self.threshold!r}"
            raise ConfigurationError(msg)
        if self.action == "route" and self.fallback is None:
            msg = "action='route' needs a fallback runnable"
            raise ConfigurationError(msg)
        return self

    @classmethod
    def from_calibration(
        cls,
        path: str | Path,
        *,
        backend: Backend,
        intervention: Intervention | None = None,
        **kwargs: Any,
    ) -> ESIGuard:
        """A guard with the threshold and scoring configuration of a calibration file.

        The file (written by ``esi-guard calibrate``) is refused, with a
        :class:`ConfigurationError` naming every difference, when the backend's model,
        value kind or exactness differ from those it was calibrated with, or when
        ``intervention`` or a scoring option in ``kwargs`` (``n_variants``, ``top_k``,
        ``distance``, ``seed``, ``max_new_tokens``) differs from the file's: a threshold
        only means something for scores computed the same way. Other options (``action``,
        ``fallback``, ``abstain_message``) pass through. SOC and Typo interventions are
        rebuilt from the file; others (paraphrases) must be passed in.
        """
        from esi_guard.calibration.file import ThresholdFile

        calibrated = ThresholdFile.read(path)
        scoring = calibrated.scoring
        problems = []
        found = {
            "model": backend.model_id,
            "values": backend.values_kind,
            "approximate": backend.approximate,
        }
        expected = {
            "model": calibrated.model,
            "values": scoring.values,
            "approximate": scoring.approximate,
        }
        options = ("n_variants", "top_k", "distance", "seed", "max_new_tokens")
        for key in options:
            expected[key] = getattr(scoring, key)
            found[key] = kwargs.pop(key, expected[key])
        if intervention is None:
            intervention = _rebuild_intervention(scoring.intervention)
        expected["intervention"] = scoring.intervention
        found["intervention"] = intervention.describe()
        problems = [
            f"{key}: calibrated with {expected[key]!r}, got {found[key]!r}"
            for key in expected
            if found[key] != expected[key]
        ]
        if problems:
            msg = f"threshold file {path} does not match this guard: " + "; ".join(problems)
            raise ConfigurationError(msg)
        return cls(
            backend=backend,
            threshold=calibrated.threshold,
            intervention=intervention,
            **{key: found[key] for key in options},
            **kwargs,
        )

    # -- public Runnable API ------------------------------------------------------------

    def invoke(
        self, input: GuardInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        """Answer, score and act on one prompt."""
        return self._call_with_config(self._invoke, input, config, **kwargs)

    async def ainvoke(
        self, input: GuardInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        """Async :meth:`invoke`."""
        return await self._acall_with_config(self._ainvoke, input, config, **kwargs)

    def batch(
        self,
        inputs: list[GuardInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """Guard many prompts with one batched pass through the backend per step."""
        if not inputs:
            return []
        return self._batch_with_config(
            self._batch, inputs, config, return_exceptions=return_exceptions, **kwargs
        )

    async def abatch(
        self,
        inputs: list[GuardInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """Async :meth:`batch`."""
        if not inputs:
            return []
        return await self._abatch_with_config(
            self._abatch, inputs, config, return_exceptions=return_exceptions, **kwargs
        )

    def stream(
        self, input: GuardInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[AIMessage]:
        """Yield the guarded answer as ONE chunk: it is held until it has been scored."""
        yield self.invoke(input, config, **kwargs)

    async def astream(
        self, input: GuardInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessage]:
        """Async :meth:`stream`: one chunk, after scoring."""
        yield await self.ainvoke(input, config, **kwargs)

    def score(self, prompt: GuardInput, answer: str) -> ESIResult:
        """Score an answer the user already has, without generating.

        The original distributions come from teacher forcing ``answer`` after the
        original prompt, in the same pass as the variants.
        """
        parsed = parse_input(prompt)
        ids = self.backend.encode_answer(parsed.messages, answer)
        variants = self.intervention.variants(parsed.question, self.n_variants, seed=self.seed)
        request, early = self._request(parsed, ids, variants, include_original=True, answer=answer)
        if request is None:
            assert early is not None
            if self.on_error == "raise":
                raise _error(early)
            return early
        forced = _shield(
            lambda: self.backend.teacher_force([request], top_k=self.top_k), 1, "teacher_force"
        )[0]
        if isinstance(forced, BackendError):
            result = self._failure(forced, answer, ids, variants)
        else:
            result = self._assess(parsed.question, answer, ids, variants, None, forced, None)
        if isinstance(result, ESIResult) and (result.scored or self.on_error != "raise"):
            return result
        raise _error(result)

    # -- the work -------------------------------------------------------------------------

    def _invoke(
        self, input: GuardInput, run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> AIMessage:
        return _single(self._batch([input], [run_manager], [config]))

    async def _ainvoke(
        self,
        input: GuardInput,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> AIMessage:
        return _single(await self._abatch([input], [run_manager], [config]))

    def _batch(
        self,
        inputs: list[GuardInput],
        run_manager: list[CallbackManagerForChainRun],
        config: list[RunnableConfig],
    ) -> list[Any]:
        # _abatch mirrors these steps one for one; the two stay parallel by design (sync and
        # async callbacks, backends and fallbacks), and every step they share is a helper.
        parsed, ok = _parse_all(inputs)
        managers = [run_manager[i] for i in ok]
        prompts: list[GuardedPrompt] = [parsed[i] for i in ok]
        gens = _traced(managers, "generate", prompts, lambda: self._generate(prompts))
        live, live_managers, live_prompts, live_gens = _live(managers, prompts, gens)
        variants = _traced(
            live_managers, "intervene", live_prompts, lambda: self._intervene(live_prompts)
        )
        scored = _traced(
            live_managers,
            "score",
            live_prompts,
            lambda: self._score_generated(live_prompts, live_gens, variants),
        )
        results = _merge(gens, live, scored, self)
        routed, fallback_inputs, fallback_configs = self._routing(
            inputs, ok, results, run_manager, config
        )
        answers = self._fallback().batch(fallback_inputs, fallback_configs) if routed else []
        return _assemble(parsed, ok, results, dict(zip(routed, answers, strict=True)), self)

    async def _abatch(
        self,
        inputs: list[GuardInput],
        run_manager: list[AsyncCallbackManagerForChainRun],
        config: list[RunnableConfig],
    ) -> list[Any]:
        parsed, ok = _parse_all(inputs)
        managers = [run_manager[i] for i in ok]
        prompts: list[GuardedPrompt] = [parsed[i] for i in ok]
        gens = await _atraced(managers, "generate", prompts, lambda: self._agenerate(prompts))
        live, live_managers, live_prompts, live_gens = _live(managers, prompts, gens)
        variants = await _atraced(
            live_managers, "intervene", live_prompts, lambda: self._aintervene(live_prompts)
        )
        scored = await _atraced(
            live_managers,
            "score",
            live_prompts,
            lambda: self._ascore_generated(live_prompts, live_gens, variants),
        )
        results = _merge(gens, live, scored, self)
        routed, fallback_inputs, fallback_configs = self._routing(
            inputs, ok, results, run_manager, config
        )
        answers = await self._fallback().abatch(fallback_inputs, fallback_configs) if routed else []
        return _assemble(parsed, ok, results, dict(zip(routed, answers, strict=True)), self)

    def _generate(self, prompts: list[GuardedPrompt]) -> list[Generation | BackendError]:
        messages = [p.messages for p in prompts]
        return _shield(
            lambda: self.backend.generate(
                messages, max_new_tokens=self.max_new_tokens, top_k=self.top_k
            ),
            len(prompts),
            "generate",
        )

    async def _agenerate(self, prompts: list[GuardedPrompt]) -> list[Generation | BackendError]:
        messages = [p.messages for p in prompts]
        return await _ashield(
            lambda: self.backend.agenerate(
                messages, max_new_tokens=self.max_new_tokens, top_k=self.top_k
            ),
            len(prompts),
            "generate",
        )

    def _intervene(self, prompts: list[GuardedPrompt]) -> list[list[str] | BackendError]:
        questions = [p.question for p in prompts]
        return _shield(
            lambda: self.intervention.batch_variants(questions, self.n_variants, seed=self.seed),
            len(prompts),
            "intervention",
        )

    async def _aintervene(self, prompts: list[GuardedPrompt]) -> list[list[str] | BackendError]:
        questions = [p.question for p in prompts]
        return await _ashield(
            lambda: self.intervention.abatch_variants(questions, self.n_variants, seed=self.seed),
            len(prompts),
            "intervention",
        )

    def _fallback(self) -> Runnable[Any, Any]:
        if self.fallback is None:  # the validator makes this unreachable for action="route"
            msg = "action='route' needs a fallback runnable"
            raise ConfigurationError(msg)
        return self.fallback

    @staticmethod
    def _routing(
        inputs: list[GuardInput],
        ok: list[int],
        results: list[ESIResult | BackendError],
        run_managers: Sequence[Any],
        configs: list[RunnableConfig],
    ) -> tuple[list[int], list[GuardInput], list[RunnableConfig]]:
        """Which results go to the fallback, with their original inputs and child configs."""
        routed = [
            i
            for i, result in enumerate(results)
            if isinstance(result, ESIResult) and result.decision == "route"
        ]
        originals = [ok[i] for i in routed]
        child_configs = [
            patch_config(configs[i], callbacks=run_managers[i].get_child("esi:fallback"))
            for i in originals
        ]
        return routed, [inputs[i] for i in originals], child_configs

    def _plan(
        self,
        prompts: list[GuardedPrompt],
        gens: list[Generation],
        variants: list[list[str] | BackendError],
    ) -> tuple[list[ForcingRequest], list[ESIResult | BackendError | None]]:
        requests: list[ForcingRequest] = []
        early: list[ESIResult | BackendError | None] = []
        for prompt, gen, texts in zip(prompts, gens, variants, strict=True):
            if isinstance(texts, BackendError):
                early.append(self._failure(texts, gen.text, gen.token_ids, []))
                continue
            request, result = self._request(
                prompt,
                gen.token_ids,
                texts,
                include_original=False,
                answer=gen.text,
                finish_reason=gen.finish_reason,
            )
            early.append(result)
            if request is not None:
                requests.append(request)
        return requests, early

    def _score_generated(
        self,
        prompts: list[GuardedPrompt],
        gens: list[Generation],
        variants: list[list[str] | BackendError],
    ) -> list[ESIResult | BackendError]:
        requests, early = self._plan(prompts, gens, variants)
        forced = (
            _shield(
                lambda: self.backend.teacher_force(requests, top_k=self.top_k),
                len(requests),
                "teacher_force",
            )
            if requests
            else []
        )
        return self._collect(prompts, gens, variants, early, forced)

    async def _ascore_generated(
        self,
        prompts: list[GuardedPrompt],
        gens: list[Generation],
        variants: list[list[str] | BackendError],
    ) -> list[ESIResult | BackendError]:
        requests, early = self._plan(prompts, gens, variants)
        forced = (
            await _ashield(
                lambda: self.backend.ateacher_force(requests, top_k=self.top_k),
                len(requests),
                "teacher_force",
            )
            if requests
            else []
        )
        return self._collect(prompts, gens, variants, early, forced)

    def _collect(
        self,
        prompts: list[GuardedPrompt],
        gens: list[Generation],
        variants: list[list[str] | BackendError],
        early: list[ESIResult | BackendError | None],
        forced: Sequence[Forced | BackendError],
    ) -> list[ESIResult | BackendError]:
        pending = iter(forced)
        out: list[ESIResult | BackendError] = []
        for prompt, gen, texts, result in zip(prompts, gens, variants, early, strict=True):
            if result is not None:
                out.append(result)
                continue
            assert not isinstance(texts, BackendError)  # _plan answered those early
            item = next(pending)
            if isinstance(item, BackendError):
                out.append(self._failure(item, gen.text, gen.token_ids, texts, gen.finish_reason))
                continue
            out.append(
                self._assess(
                    prompt.question,
                    gen.text,
                    gen.token_ids,
                    texts,
                    gen.topk,
                    item,
                    gen.finish_reason,
                )
            )
        return out

    def _request(
        self,
        prompt: GuardedPrompt,
        answer_ids: Sequence[int],
        variants: list[str],
        *,
        include_original: bool,
        answer: str = "",
        finish_reason: str | None = None,
    ) -> tuple[ForcingRequest | None, ESIResult | None]:
        """The forcing request for one answer, or the unscored result when there is none."""
        reason = None
        if not answer_ids:
            reason = "empty_answer: the answer has no tokens to score"
        elif all(text == prompt.question for text in variants):
            reason = (
                "no_effective_variant: no variant differs from the question "
                f"({self.intervention.name} found nothing to change)"
            )
        if reason is not None:
            return None, self._result(None, reason, answer, answer_ids, variants, [], finish_reason)
        # Each distinct changed text is forced once; a variant equal to the question has the
        # original's distributions (distance 0), so it is not run at all.
        request = ForcingRequest(
            prompt=prompt.messages,
            variants=[prompt.with_question(text) for text in _changed(variants, prompt.question)],
            answer_ids=list(answer_ids),
            answer=answer,
            include_original=include_original,
        )
        return request, None

    def _failure(
        self,
        error: BackendError,
        answer: str,
        answer_ids: Sequence[int],
        variants: list[str],
        finish_reason: str | None = None,
    ) -> ESIResult | BackendError:
        """A failed step's outcome under ``on_error``: the error itself, or unscored."""
        if self.on_error == "raise":
            return error
        code = "context_overflow" if isinstance(error, ContextLengthError) else "backend_error"
        if error.args and str(error.args[0]).startswith("intervention failed"):
            code = "intervention_error"
        reason = f"{code}: {error}"
        return self._result(None, reason, answer, answer_ids, variants, [], finish_reason)

    def _assess(
        self,
        question: str,
        answer: str,
        answer_ids: Sequence[int],
        variants: list[str],
        original: TopK | None,
        forced: Forced,
        finish_reason: str | None,
    ) -> ESIResult:
        base = original if original is not None else forced.original
        changed = _changed(variants, question)
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
            exact = dict(zip(changed, forced.observed or [len(answer_ids)] * len(changed),
                             strict=True))  # fmt: skip
            everyone = [base if text == question else by_text[text] for text in variants]
            observed = None
            if forced.observed is not None:
                observed = [len(answer_ids) if t == question else exact[t] for t in variants]
            esi = esi_score(
                base,
                everyone,
                distance=self.distance,
                kind=self.backend.values_kind,
                observed=observed,
            )
        except ScoringError as exc:
            return self._result(
                None, f"scoring_error: {exc}", answer, answer_ids, variants, [], finish_reason
            )
        return self._result(
            esi.score,
            None,
            answer,
            answer_ids,
            variants,
            [float(x) for x in esi.token_scores],
            finish_reason,
        )

    def _result(
        self,
        score: float | None,
        reason: str | None,
        answer: str,
        answer_ids: Sequence[int],
        variants: list[str],
        token_scores: list[float],
        finish_reason: str | None,
    ) -> ESIResult:
        decision: Decision
        if score is None:
            decision = "flag" if self.on_error == "flag" else "abstain"
        else:
            decision = "accept" if score <= self.threshold else self.action
        return ESIResult(
            score=score,
            threshold=self.threshold,
            decision=decision,
            scored=score is not None,
            reason=reason,
            answer=answer,
            variants=list(variants),
            answer_token_ids=[int(i) for i in answer_ids],
            token_scores=token_scores,
            model=self.backend.model_id,
            scoring={
                "intervention": self.intervention.describe(),
                "n_variants": self.n_variants,
                "top_k": self.top_k,
                "distance": self.distance,
                "values": self.backend.values_kind,
                "approximate": self.backend.approximate,
                "seed": self.seed,
                "on_error": self.on_error,
            },
            finish_reason=finish_reason,
        )


# -- helpers shared by the sync and async paths -----------------------------------------


def _parse_all(inputs: list[GuardInput]) -> tuple[list[Any], list[int]]:
    """Parsed prompts (or the InputError in place) and the indices that parsed."""
    parsed: list[Any] = []
    for value in inputs:
        try:
            parsed.append(parse_input(value))
        except InputError as exc:
            parsed.append(exc)
    return parsed, [i for i, p in enumerate(parsed) if isinstance(p, GuardedPrompt)]


def _changed(variants: list[str], question: str) -> list[str]:
    """The distinct variant texts that differ from the question, in first-seen order."""
    return [text for text in dict.fromkeys(variants) if text != question]


def _error(result: ESIResult | BackendError) -> BackendError | ScoringError:
    """What ``on_error="raise"`` raises for an unscored outcome."""
    if isinstance(result, BackendError):
        return result
    return ScoringError(f"the answer could not be scored: {result.reason}", result=result)


def _checked(out: Sequence[Any], size: int, what: str) -> list[Any]:
    if len(out) != size:
        msg = f"{what} returned {len(out)} results for {size} inputs"
        return [BackendError(msg)] * size
    return list(out)


def _wrapped(exc: Exception, what: str) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    error = BackendError(f"{what} failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _shield(call: Callable[[], Sequence[Any]], size: int, what: str) -> list[Any]:
    """A batched step's results; a failure of the whole call is each input's error.

    Configuration and input errors still raise: they are the caller's to fix, and no
    answer has been produced that could slip through.
    """
    try:
        return _checked(call(), size, what)
    except (ConfigurationError, InputError):
        raise
    except Exception as exc:  # any engine failure fails closed, per input
        return [_wrapped(exc, what)] * size


async def _ashield(call: Callable[[], Any], size: int, what: str) -> list[Any]:
    """Async :func:`_shield` (cancellation still propagates)."""
    try:
        return _checked(await call(), size, what)
    except (ConfigurationError, InputError):
        raise
    except Exception as exc:  # any engine failure fails closed, per input
        return [_wrapped(exc, what)] * size


def _single(results: list[Any]) -> AIMessage:
    first = results[0]
    if isinstance(first, Exception):
        raise first
    assert isinstance(first, AIMessage)
    return first


def _traced(
    managers: list[CallbackManagerForChainRun],
    step: str,
    prompts: list[GuardedPrompt],
    call: Callable[[], list[Any]],
) -> list[Any]:
    """Run one batched step, shown as a child run tagged ``esi:{step}`` under each input."""
    if not prompts:
        return []
    children = [
        m.get_child(f"esi:{step}").on_chain_start(
            None, {"question": p.question}, name=f"esi_{step}"
        )
        for m, p in zip(managers, prompts, strict=True)
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


async def _atraced(
    managers: list[AsyncCallbackManagerForChainRun],
    step: str,
    prompts: list[GuardedPrompt],
    call: Callable[[], Any],
) -> list[Any]:
    """Async :func:`_traced`."""
    if not prompts:
        return []
    children = [
        await m.get_child(f"esi:{step}").on_chain_start(
            None, {"question": p.question}, name=f"esi_{step}"
        )
        for m, p in zip(managers, prompts, strict=True)
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


def _live(
    managers: list[Any], prompts: list[GuardedPrompt], gens: list[Generation | BackendError]
) -> tuple[list[int], list[Any], list[GuardedPrompt], list[Generation]]:
    """The prompts whose generation succeeded: indices, run managers, prompts, generations."""
    live = [i for i, gen in enumerate(gens) if isinstance(gen, Generation)]
    kept = [gen for gen in gens if isinstance(gen, Generation)]
    return live, [managers[i] for i in live], [prompts[i] for i in live], kept


def _merge(
    gens: list[Generation | BackendError],
    live: list[int],
    scored: list[ESIResult | BackendError],
    guard: ESIGuard,
) -> list[ESIResult | BackendError]:
    """Per prompt: its result, or the outcome of whichever step failed for it."""
    by_index = dict(zip(live, scored, strict=True))
    return [
        guard._failure(gen, "", [], []) if isinstance(gen, BackendError) else by_index[i]
        for i, gen in enumerate(gens)
    ]


def _assemble(
    parsed: list[Any],
    ok: list[int],
    results: list[ESIResult | BackendError],
    fallback_out: dict[int, Any],
    guard: ESIGuard,
) -> list[Any]:
    """One AIMessage per input (or its InputError / BackendError), in input order."""
    out: list[Any] = list(parsed)
    for position, (index, result) in enumerate(zip(ok, results, strict=True)):
        if isinstance(result, BackendError):
            out[index] = result
        elif not result.scored and guard.on_error == "raise":
            out[index] = _error(result)
        else:
            out[index] = _message(result, fallback_out.get(position), guard.abstain_message)
    return out


def _message(result: ESIResult, fallback: Any, abstain_message: str) -> AIMessage:
    meta = result.as_dict()
    if result.decision == "abstain":
        return AIMessage(content=abstain_message, response_metadata={"esi": meta})
    if result.decision == "route":
        inherited = dict(getattr(fallback, "response_metadata", {}) or {})
        meta["fallback_used"] = True
        return AIMessage(
            content=message_text(fallback), response_metadata={**inherited, "esi": meta}
        )
    return AIMessage(content=result.answer, response_metadata={"esi": meta})


def _rebuild_intervention(description: dict[str, Any]) -> Intervention:
    """SOC and Typo from their description; other interventions cannot be rebuilt."""
    kinds: dict[str, type[SkipOneChar] | type[Typo]] = {
        SkipOneChar.name: SkipOneChar,
        Typo.name: Typo,
    }
    kind = kinds.get(str(description.get("name")))
    if kind is None:
        msg = (
            f"the threshold file was calibrated with the intervention {description!r}, "
            "which cannot be rebuilt from the file: pass intervention=... "
        )
        raise ConfigurationError(msg)
    return kind(p=float(description["p"]), min_chars=int(description["min_chars"]))
