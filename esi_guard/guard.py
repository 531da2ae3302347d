"""ESIGuard: the Runnable that generates, scores with ESI, decides and acts.

The guard knows no backend internals: it asks its backend for greedy answers and for
teacher-forced distributions, its intervention for variants, and ``esi_score`` for the
number. Each of those steps shows as a tagged child run (``esi:generate``,
``esi:intervene``, ``esi:score``, and ``esi:fallback`` when routing).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSerializable
from langchain_core.runnables.config import patch_config
from pydantic import ConfigDict, Field, ValidationError, model_validator

from esi_guard import _tracing
from esi_guard._inputs import message_text, parse_input
from esi_guard._pipeline import Action, Item, OnError, Pipeline, raised
from esi_guard.backends.base import Backend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.exceptions import BackendError, ConfigurationError, InputError
from esi_guard.interventions import Intervention, SkipOneChar, rebuild_intervention
from esi_guard.result import ESIResult, ScoringConfig
from esi_guard.scoring import Distance

__all__ = ["ESIGuard", "GuardInput"]

GuardInput: TypeAlias = (
    str | PromptValue | Sequence[BaseMessage | tuple[str, str] | dict[str, Any] | str]
)
"""What the guard takes: a string, a PromptValue, or a list of messages."""

DEFAULT_ABSTAIN_MESSAGE = "I am not confident enough to answer that reliably."


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

    **Failure policy** (``on_error``), for every answer that cannot be scored (the
    backend or the intervention failed, the prompt does not fit the context, the answer
    is empty, no variant differs from the question, NaN/inf distributions; the codes
    are drawn in :mod:`esi_guard.exceptions`):

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

    A failure of one prompt's request is that prompt's alone; a failure of a whole
    backend call is each of its prompts'. The guard holds no state between calls: one
    guard may serve many threads and tasks (backends bound their own concurrency).

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
        calibrated = ThresholdFile.read(path)
        expected = calibrated.scoring
        options = ("n_variants", "top_k", "distance", "seed", "max_new_tokens")
        settings = {key: kwargs.pop(key, getattr(expected, key)) for key in options}
        if intervention is None:
            intervention = rebuild_intervention(expected.intervention)
        guard = cls(
            backend=backend,
            threshold=calibrated.threshold,
            intervention=intervention,
            **settings,
            **kwargs,
        )
        problems = expected.differences(guard.scoring_config, ignore=("system_prompt",))
        if backend.model_id != calibrated.model:
            problems.insert(0, f"model: {calibrated.model!r} vs {backend.model_id!r}")
        if problems:
            msg = (
                f"threshold file {path} does not match this guard (calibrated vs given): "
                + "; ".join(problems)
            )
            raise ConfigurationError(msg)
        return guard

    @property
    def scoring_config(self) -> ScoringConfig:
        """How this guard computes scores (what a threshold file must match)."""
        return ScoringConfig(
            intervention=self.intervention.describe(),
            n_variants=self.n_variants,
            top_k=self.top_k,
            distance=self.distance,
            values=self.backend.values_kind,
            approximate=self.backend.approximate,
            seed=self.seed,
            max_new_tokens=self.max_new_tokens,
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
        item = Item(parsed, answer=answer, answer_ids=tuple(ids), variants=variants)
        (outcome,) = self._pipeline().force([item], include_original=True)
        if isinstance(outcome, ESIResult) and (outcome.scored or self.on_error != "raise"):
            return outcome
        raise raised(outcome)

    # -- the work: two mirrored drivers over the pipeline ---------------------------------

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
        # _abatch mirrors these steps one for one (sync and async callbacks, backends and
        # fallbacks); everything between the calls is the pipeline's.
        pipeline, parsed, items = self._pipeline(), *_parse_all(inputs)
        gens = _tracing.traced(run_manager, "generate", items, lambda: pipeline.generate(items))
        live = pipeline.generated(items, gens)
        variants = _tracing.traced(run_manager, "intervene", live, lambda: pipeline.intervene(live))
        pipeline.intervened(live, variants)
        _tracing.traced(run_manager, "score", live, lambda: pipeline.force(live))
        routed, fallback_inputs, fallback_configs = _routing(inputs, items, run_manager, config)
        answers = self._fallback().batch(fallback_inputs, fallback_configs) if routed else []
        return self._assemble(parsed, items, dict(zip(routed, answers, strict=True)))

    async def _abatch(
        self,
        inputs: list[GuardInput],
        run_manager: list[AsyncCallbackManagerForChainRun],
        config: list[RunnableConfig],
    ) -> list[Any]:
        pipeline, parsed, items = self._pipeline(), *_parse_all(inputs)
        gens = await _tracing.atraced(
            run_manager, "generate", items, lambda: pipeline.agenerate(items)
        )
        live = pipeline.generated(items, gens)
        variants = await _tracing.atraced(
            run_manager, "intervene", live, lambda: pipeline.aintervene(live)
        )
        pipeline.intervened(live, variants)
        await _tracing.atraced(run_manager, "score", live, lambda: pipeline.aforce(live))
        routed, fallback_inputs, fallback_configs = _routing(inputs, items, run_manager, config)
        answers = await self._fallback().abatch(fallback_inputs, fallback_configs) if routed else []
        return self._assemble(parsed, items, dict(zip(routed, answers, strict=True)))

    def _pipeline(self) -> Pipeline:
        return Pipeline(
            backend=self.backend,
            intervention=self.intervention,
            config=self.scoring_config,
            threshold=self.threshold,
            action=self.action,
            on_error=self.on_error,
        )

    def _fallback(self) -> Runnable[Any, Any]:
        assert self.fallback is not None  # the validator requires one for action="route"
        return self.fallback

    def _assemble(
        self, parsed: list[Any], items: list[Item], fallback_out: dict[int, Any]
    ) -> list[Any]:
        """One AIMessage per input (or its InputError / BackendError), in input order."""
        out: list[Any] = list(parsed)
        for item in items:
            result = item.outcome
            assert result is not None  # the pipeline decides every item
            if isinstance(result, BackendError):
                out[item.index] = result
            elif not result.scored and self.on_error == "raise":
                out[item.index] = raised(result)
            else:
                fallback = fallback_out.get(item.index)
                out[item.index] = _message(result, fallback, self.abstain_message)
        return out


# -- helpers shared by the sync and async drivers ------------------------------------------


def _parse_all(inputs: list[GuardInput]) -> tuple[list[Any], list[Item]]:
    """Parsed prompts (or the InputError in place) and an item for each that parsed."""
    parsed: list[Any] = []
    for value in inputs:
        try:
            parsed.append(parse_input(value))
        except InputError as exc:
            parsed.append(exc)
    items = [Item(p, index=i) for i, p in enumerate(parsed) if not isinstance(p, InputError)]
    return parsed, items


def _single(results: list[Any]) -> AIMessage:
    first = results[0]
    if isinstance(first, Exception):
        raise first
    assert isinstance(first, AIMessage)
    return first


def _routing(
    inputs: list[GuardInput],
    items: list[Item],
    run_managers: Sequence[Any],
    configs: list[RunnableConfig],
) -> tuple[list[int], list[GuardInput], list[RunnableConfig]]:
    """Which inputs go to the fallback, with their child configs."""
    routed = [
        item.index
        for item in items
        if isinstance(item.outcome, ESIResult) and item.outcome.decision == "route"
    ]
    child_configs = [
        patch_config(configs[i], callbacks=run_managers[i].get_child("esi:fallback"))
        for i in routed
    ]
    return routed, [inputs[i] for i in routed], child_configs


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
