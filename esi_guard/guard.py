"""ESIGuard: a guarded chat model that generates, scores with ESI, decides and acts.

The guard knows no backend internals: it asks its backend for greedy answers and for
teacher-forced distributions, its intervention for variants, and the pipeline
(:mod:`esi_guard._pipeline`) for the score. Each of those steps shows as a tagged child
run (``esi:generate``, ``esi:intervene``, ``esi:score``, and ``esi:fallback`` when routing).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeAlias

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import get_config_list
from pydantic import ConfigDict, Field, ValidationError, model_validator

from esi_guard import _tracing
from esi_guard._inputs import parse_input
from esi_guard._keywords import check_keywords, unknown_keyword
from esi_guard._messages import chat_result, decision, last_chunk
from esi_guard._pipeline import Action, Item, OnError, Pipeline, raised
from esi_guard.backends.adapters import backend_for
from esi_guard.backends.base import Backend
from esi_guard.backends.default import EmbeddedBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.exceptions import ConfigurationError, InputError
from esi_guard.interventions import Intervention, SkipOneChar, rebuild_intervention
from esi_guard.result import ESIResult, ScoringConfig
from esi_guard.scoring import Distance

__all__ = ["ESIGuard", "GuardInput"]

GuardInput: TypeAlias = (
    str | PromptValue | Sequence[BaseMessage | tuple[str, str] | dict[str, Any] | str]
)
"""What the guard takes: a string, a PromptValue, or a list of messages."""

DEFAULT_ABSTAIN_MESSAGE = "I am not confident enough to answer that reliably."

# The item ``batch`` already ran through the pipeline for the prompt being invoked now.
_PREFETCHED: ContextVar[Item | None] = ContextVar("esi_guard_prefetched", default=None)


class ESIGuard(BaseChatModel):
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

    The guard is a LangChain chat model (it passes langchain-tests' standard suites):
    ``invoke``, ``stream``, ``batch``, ``stream_events``, callbacks, ``stop``,
    ``usage_metadata`` (the answer's own tokens; ESI's extra work is in
    ``response_metadata["esi"]["work"]``) and ``output_version="v1"`` work as they do for
    any chat model. ``batch``/``abatch`` run each step once for all prompts through the
    backend, then give each prompt its run. ``stream`` and ``astream`` yield one chunk
    (``chunk_position="last"``): the answer is held until it has been scored, since a
    guard cannot vouch for text it has not seen whole.

    Example:
        .. code-block:: python

            from esi_guard import ESIGuard, HFBackend

            guard = ESIGuard(backend=HFBackend.default(), threshold=0.3, action="abstain")
            message = guard.invoke("What is the capital of France?")
            message.response_metadata["esi"]["score"]
    """

    backend: Backend = Field(default_factory=EmbeddedBackend)
    """The model engine (``HFBackend``, ``OpenAIBackend``...). Default: the small embedded
    model, loaded on first use and shared by every guard that uses it (for trying the
    guard; pass your own model with ``llm=`` or ``backend=``)."""
    llm: Any = Field(default=None, exclude=True, repr=False)
    """The model object you already have (a model id, a transformers pipeline,
    ``HuggingFacePipeline``, ``ChatHuggingFace``, ``ChatOpenAI``...): the guard builds its
    backend from it, sharing the loaded weights (see :mod:`esi_guard.backends.adapters`)."""
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
    max_new_tokens: int = Field(default=64, ge=1, alias="max_tokens")
    """Most tokens generated per answer (``max_tokens``, LangChain's name, works too)."""
    seed: int = 0
    """Seed of the intervention; variants depend only on it and the question."""
    on_error: OnError = "abstain"
    """What to do with an answer that cannot be scored: ``abstain``, ``flag`` or ``raise``."""

    stop: list[str] | None = None
    """Stop sequences: an answer ends before the first one (a call's ``stop`` wins)."""
    temperature: float | None = None
    """Only ``0`` or ``None``: ESI scores the greedy answer, so the guard never samples."""
    streaming: bool = False
    """LangChain's flag: ``invoke`` goes through ``_stream`` (still one chunk, when scored)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", populate_by_name=True)

    def __init__(self, **kwargs: Any) -> None:
        """Validate the configuration; any invalid or unknown field is a ConfigurationError."""
        if kwargs.get("llm") is not None:
            if kwargs.get("backend") is not None:
                msg = "give backend= or llm=, not both"
                raise ConfigurationError(msg)
            kwargs["backend"] = backend_for(kwargs["llm"])
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            extra = [e["loc"][0] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if extra:
                names = [*type(self).model_fields, "max_tokens"]
                error = unknown_keyword("ESIGuard", str(extra[0]), names)
                raise error from exc
            msg = f"invalid ESIGuard configuration: {exc}"
            raise ConfigurationError(msg) from exc

    @model_validator(mode="before")
    @classmethod
    def _one_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"max_tokens", "max_new_tokens"} <= data.keys():
            msg = "max_tokens and max_new_tokens are one setting: give one of them"
            raise ValueError(msg)
        return data

    @model_validator(mode="after")
    def _check(self) -> ESIGuard:
        if not math.isfinite(self.threshold):
            msg = f"threshold must be a finite number, got {self.threshold!r}"
            raise ConfigurationError(msg)
        if self.action == "route" and self.fallback is None:
            msg = "action='route' needs a fallback runnable"
            raise ConfigurationError(msg)
        if self.temperature not in (None, 0):
            msg = f"ESI scores the greedy answer: temperature must be 0, got {self.temperature}"
            raise ConfigurationError(msg)
        return self

    @classmethod
    def from_calibration(
        cls,
        path: str | Path,
        *,
        backend: Backend | None = None,
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
        if backend is not None:
            kwargs["backend"] = backend
        guard = cls(
            threshold=calibrated.threshold,
            intervention=intervention,
            **settings,
            **kwargs,
        )
        problems = expected.differences(guard.scoring_config, ignore=("system_prompt",))
        if guard.backend.model_id != calibrated.model:
            problems.insert(0, f"model: {calibrated.model!r} vs {guard.backend.model_id!r}")
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

    # -- public methods ---------------------------------------------------------------------

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """Guard many prompts: each step runs once for all of them through the backend."""
        items = self._prefetchable(inputs, kwargs)
        self._pipeline(kwargs.get("stop")).run([i for i in items if i is not None])
        out: list[Any] = []
        configs = get_config_list(config, len(inputs))
        for value, each, item in zip(inputs, configs, items, strict=True):
            with _prefetched(item), _kept(out, return_exceptions):
                out.append(self.invoke(value, each, **kwargs))
        return out

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """Async :meth:`batch`."""
        items = self._prefetchable(inputs, kwargs)
        await self._pipeline(kwargs.get("stop")).arun([i for i in items if i is not None])
        out: list[Any] = []
        configs = get_config_list(config, len(inputs))
        for value, each, item in zip(inputs, configs, items, strict=True):
            with _prefetched(item), _kept(out, return_exceptions):
                out.append(await self.ainvoke(value, each, **kwargs))
        return out

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

    # -- the chat-model surface -------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "esi-guard"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.backend.model_id,
            "threshold": self.threshold,
            "action": self.action,
            "on_error": self.on_error,
            **self.scoring_config.as_metadata(),
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider=self.backend.provider,
            ls_model_name=str(kwargs.get("model") or self.backend.model_id),
            ls_model_type="chat",
            ls_temperature=0.0,
            ls_max_tokens=self.max_new_tokens,
        )
        if stop or self.stop:
            params["ls_stop"] = list(stop or self.stop or [])
        return params

    def _convert_input(self, model_input: LanguageModelInput) -> PromptValue:
        parse_input(model_input)  # an InputError naming the problem, whatever the policy
        return super()._convert_input(model_input)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        item, pipeline = self._start(messages, stop, kwargs)
        _tracing.run(pipeline, item, run_manager)
        routed = None
        if decision(item) == "route":
            callbacks = _tracing.child(run_manager, "esi:fallback") if run_manager else None
            routed = self._fallback().invoke(messages, {"callbacks": callbacks})
        return chat_result(item, routed, self.on_error, self.abstain_message, self.backend.model_id)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        item, pipeline = self._start(messages, stop, kwargs)
        await _tracing.arun(pipeline, item, run_manager)
        routed = None
        if decision(item) == "route":
            callbacks = _tracing.achild(run_manager, "esi:fallback") if run_manager else None
            routed = await self._fallback().ainvoke(messages, {"callbacks": callbacks})
        return chat_result(item, routed, self.on_error, self.abstain_message, self.backend.model_id)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """One chunk, the last, once the answer has been scored."""
        yield last_chunk(self._generate(messages, stop, run_manager, **kwargs))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """Async :meth:`_stream`."""
        yield last_chunk(await self._agenerate(messages, stop, run_manager, **kwargs))

    # -- helpers ----------------------------------------------------------------------------

    def _pipeline(self, stop: Sequence[str] | None = None) -> Pipeline:
        return Pipeline(
            backend=self.backend,
            intervention=self.intervention,
            config=self.scoring_config,
            threshold=self.threshold,
            action=self.action,
            on_error=self.on_error,
            stop=tuple(stop if stop is not None else self.stop or ()),
        )

    def _prefetchable(
        self, inputs: Sequence[LanguageModelInput], kwargs: dict[str, Any]
    ) -> list[Item | None]:
        """An item per input that parses (the others fail again, by name, when invoked)."""
        check_keywords("ESIGuard call", kwargs, ("stop",))
        items: list[Item | None] = []
        for index, value in enumerate(inputs):
            try:
                items.append(Item(parse_input(value), index=index))
            except InputError:
                items.append(None)
        return items

    def _start(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[Item, Pipeline]:
        """This call's item (the one batch ran, when it is this prompt's) and pipeline."""
        check_keywords("ESIGuard call", kwargs, ())
        prompt = parse_input(messages)
        prefetched = _PREFETCHED.get()
        if prefetched is not None and prefetched.prompt == prompt:
            return prefetched, self._pipeline(stop)
        return Item(prompt), self._pipeline(stop)

    def _fallback(self) -> Runnable[Any, Any]:
        assert self.fallback is not None  # the validator requires one for action="route"
        return self.fallback


@contextmanager
def _prefetched(item: Item | None) -> Iterator[None]:
    """While invoking one prompt of a batch: the item the batch ran for it."""
    token = _PREFETCHED.set(item)
    try:
        yield
    finally:
        _PREFETCHED.reset(token)


@contextmanager
def _kept(out: list[Any], return_exceptions: bool) -> Iterator[None]:
    """With ``return_exceptions``, a prompt's error takes its place in ``out``."""
    try:
        yield
    except Exception as exc:
        if not return_exceptions:
            raise
        out.append(exc)
