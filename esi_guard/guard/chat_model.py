"""ESIGuard: a guarded chat model that generates, scores with ESI, decides and acts.

The guard knows no backend internals: it hands its prompts to the pipeline
(:mod:`esi_guard._pipeline`), which asks the backend for greedy answers and
teacher-forced distributions and the intervention for variants, in its own order, and
calls the guard's tracing hook around each step, so each shows as a tagged child run
(``esi:generate``, ``esi:intervene``, ``esi:score``; ``esi:fallback`` when routing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeAlias

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import BasePromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import get_config_list
from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from esi_guard._keywords import check_keywords
from esi_guard._pipeline.decide import raised
from esi_guard._pipeline.items import GuardedPrompt, Item
from esi_guard._pipeline.steps import Pipeline
from esi_guard.backends.base import Backend, HiddenSpec
from esi_guard.backends.default import EmbeddedBackend
from esi_guard.cascade import Band, Cascade, ESIProbe
from esi_guard.combined import CombinedScore
from esi_guard.exceptions import ConfigurationError
from esi_guard.guard import _batching, _config, _live, _tracing
from esi_guard.guard._inputs import parse_input, rendered, resolve
from esi_guard.guard._messages import chat_result, decision, last_chunk, piece_chunk
from esi_guard.guard._probes import check_hidden, guard_cascade
from esi_guard.guard._rules import check_settings
from esi_guard.guard._templates import TemplatedPrompt, warn_whole_message
from esi_guard.interventions import Intervention, SkipOneChar
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS, Action, ESIResult, OnError, ScoringConfig
from esi_guard.scoring import Distance, Support

__all__ = ["ESIGuard", "GuardInput"]

GuardInput: TypeAlias = (
    str | PromptValue | Sequence[BaseMessage | tuple[str, str] | dict[str, Any] | str]
)
"""What the guard takes: a string, a PromptValue, or a list of messages."""

DEFAULT_ABSTAIN_MESSAGE = "I am not confident enough to answer that reliably."


class ESIGuard(BaseChatModel):
    """Guard a model's answers with the ESI uncertainty score: a guarded chat model.

    For each prompt the guard generates the greedy answer, builds ``n_variants``
    intervened copies of the question (the last human message only), teacher-forces
    the same answer after each, and scores how much the token distributions move.
    Above ``threshold`` it acts: ``flag`` returns the answer marked untrusted,
    ``abstain`` replaces it with ``abstain_message``, ``route`` returns ``fallback``'s
    answer. The result is in ``response_metadata["esi"]`` (see :class:`ESIResult`).

    **Failure policy** (``on_error``): an answer that cannot be scored (backend or
    intervention failure, context overflow, empty answer, no variant differs, NaN/inf;
    codes in :mod:`esi_guard.exceptions`) is withheld (``"abstain"``, the default),
    flagged (``"flag"``) or raised (``"raise"``; returned in place by
    ``batch(..., return_exceptions=True)``), always with ``scored: false`` and a
    ``reason``: never passed as trusted. An input that is not a prompt at all raises
    :class:`InputError` whatever the policy. One prompt's failure never touches the
    others of a batch; the guard keeps no state between calls.

    As a LangChain chat model it passes langchain-tests' standard suites: ``batch`` runs
    each step once for all prompts through the backend, then gives each prompt its run;
    ``stream`` holds the answer until it is scored (one last chunk) unless
    ``stream_mode="live"``, and traces every step either way.

    Example:
        .. code-block:: python

            guard = ESIGuard(threshold=0.3, action="abstain")   # or llm=your_model
            guard.invoke("What is the capital of France?").response_metadata["esi"]
    """

    backend: Backend = Field(default_factory=EmbeddedBackend)
    """The model engine (``HFBackend``, ``OpenAIBackend``...). Default: the small embedded
    model, loaded on first use and shared by every guard that uses it (for trying the
    guard; pass your own model with ``llm=`` or ``backend=``)."""
    llm: Any = Field(default=None, exclude=True, repr=False)
    """The model object you already have (a model id, a transformers pipeline,
    ``HuggingFacePipeline``, ``ChatHuggingFace``, ``ChatOpenAI``...): the guard builds its
    backend from it, sharing the loaded weights (see :mod:`esi_guard.backends.adapters`)."""
    n_threads: int | None = Field(default=None, ge=1, exclude=True, repr=False)
    """CPU threads of the model the guard runs (None: the engine's own choice, every core
    for llama.cpp's teacher forcing), for a model it loads or shares: ``llm=`` a path, a
    hub id or ``"default"``, a loaded ``llama_cpp.Llama`` (or LangChain's ``ChatLlamaCpp``
    / ``LlamaCpp``), or no model (the embedded one: guards asking for the same threads
    share a copy). llama.cpp applies them to every decode of the backend's contexts, its
    float16 forcing copy's included; transformers (a path it loads, a pipeline, a model
    and tokenizer) through ``torch.set_num_threads``, for the whole process. A
    ``backend=`` or an API client (``ChatOpenAI``) is refused with them
    (:class:`ConfigurationError`): build the backend with its own threads
    (``LlamaCppBackend.from_path(..., n_threads=N)``). Give fewer than the cores where
    several guards' processes share them: llama.cpp's waiting threads spin, and
    processes each using every core slow each other down several times over. Scores do
    not depend on it (llama.cpp sums each output on one thread: 1 and 2 threads give the
    embedded model's answers and scores to the bit), so a threshold file ignores it."""
    threshold: float
    """Scores strictly above it are untrusted; calibrate it on labelled data. Left out with
    the embedded default model, it comes from that model's shipped calibration (with the
    scoring settings it was fitted with); any other model needs one."""
    intervention: Intervention = Field(default_factory=SkipOneChar)
    """How variants of the question are made (SOC with p=0.3, M*=3 by default)."""
    n_variants: int = Field(default=10, ge=1)
    """L, the number of intervened variants per question (the most, with ``min_variants``)."""
    min_variants: int | None = Field(default=None, ge=2)
    """Sequential ESI (off by default): score this many variants first, then twice as many
    and so on up to ``n_variants``, and stop as soon as the decision is settled (see
    :mod:`esi_guard.sequential`). Needs ``stop_constant``; ``from_calibration`` reads both
    from a file written by ``esi-guard calibrate --min-variants``."""
    stop_constant: float | None = Field(default=None, ge=0)
    """The sequential stopping rule's constant, fitted by ``esi-guard calibrate``."""
    top_k: int = Field(default=100, ge=1)
    """k, the number of tokens kept in each truncated distribution."""
    distance: Distance = "hellinger"
    """Distance between truncated distributions."""
    support: Support = "pair"
    """The tokens two truncated distributions are compared on: the union of their own
    top-k sets (``"pair"``), or of all the answer's distributions (``"all"``, as the
    authors' code). See :func:`~esi_guard.esi_score`."""
    action: Action = "flag"
    """What to do with an untrusted answer: ``flag``, ``abstain`` or ``route``."""
    fallback: Runnable[Any, Any] | None = None
    """Runnable invoked with the original input when ``action="route"``."""
    abstain_message: str = DEFAULT_ABSTAIN_MESSAGE
    """Content returned in place of an untrusted answer when ``action="abstain"``."""
    max_new_tokens: int = Field(default=DEFAULT_MAX_NEW_TOKENS, ge=1, alias="max_tokens")
    """Most tokens generated per answer (``max_tokens``, LangChain's name, works too)."""
    seed: int = 0
    """Seed of the intervention; variants depend only on it and the question."""
    on_error: OnError = "abstain"
    """What to do with an answer that cannot be scored: ``abstain``, ``flag`` or ``raise``."""
    decide_on: Literal["esi", "context_reliance"] = "esi"
    """The signal compared with ``threshold``: the ESI ``score`` (default; untrusted
    above it), or ``context_reliance`` (untrusted *below* it: the answer barely depends
    on the retrieved context; needs ``with_prompt(..., context_key=...)``, else every
    answer is unscored)."""
    combined: CombinedScore | None = None
    """A combined score (``esi-guard calibrate --score combined`` fits one; a threshold
    file carries it to ``from_calibration``): decisions are then made on its ``p_wrong``,
    from ESI and the answer's free signals, and ``threshold`` is a probability. One with a
    hidden-state probe needs a backend that gives hidden states (transformers, llama.cpp)."""
    hidden_states: HiddenSpec | None = None
    """Also read these hidden states with every answer (from its own forward passes) and
    keep them in its result (``ESIResult.hidden``): what ``esi-guard calibrate --features
    ...,hidden`` fits a probe on. Needs a backend that gives them."""
    esi_probe: ESIProbe | None = None
    """An ESI probe (``esi-guard distill`` writes one; a path is read): a cascade then
    decides each answer on the probe's estimate of ESI (or, with ``combined``, on
    ``p_wrong`` with that estimate) where it is outside ``probe_band``, and runs ESI only
    inside it (``ESIResult.decided_by``). Needs the backend the probe was distilled on."""
    probe_band: Band | None = None
    """Where the cascade's cheap score is too close to the threshold and ESI runs. None
    (deciding on ESI): fitted at the threshold on the probe's held-out distillation
    answers, so that its decisions differ from full ESI's on at most
    ``probe_disagreement`` of them with probability 0.9 (no labels needed); a threshold
    file calibrated with ``--esi-probe`` carries one fitted on labelled answers."""
    probe_disagreement: float = Field(default=0.02, gt=0, lt=1)
    """The share of decisions a label-free band may change against full ESI."""
    free_score: CombinedScore | None = None
    """A value-of-information cascade's cheap score: a combined score fitted without ESI
    (``esi-guard calibrate --score combined --cascade`` writes it, with its ``probe_band``,
    into the threshold file). Where its ``p_wrong`` is outside ``probe_band`` it decides
    (``decided_by="free"``, no variant forced); inside it, ESI runs and ``combined``
    decides."""

    stop: list[str] | None = None
    """Stop sequences: an answer ends before the first one (a call's ``stop`` wins)."""
    temperature: float | None = None
    """Only ``0`` or ``None``: ESI scores the greedy answer, so the guard never samples."""
    stream_mode: Literal["hold", "live"] = "hold"
    """``hold``: ``stream`` yields the answer once it is scored. ``live``: it yields the
    answer's text as it is generated, then a last chunk with the score and metadata; only
    with ``action="flag"`` and ``on_error`` ``"flag"`` or ``"raise"``, since an answer
    already shown cannot be withheld."""
    streaming: bool = False
    """LangChain's flag: ``invoke`` goes through ``_stream`` (still one chunk, when scored)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", populate_by_name=True)
    _warned: bool = PrivateAttr(default=False)
    _cascade: Cascade | None = PrivateAttr(default=None)

    def __init__(self, **kwargs: Any) -> None:
        """Validate the configuration; any invalid or unknown field is a ConfigurationError."""
        kwargs, shipped = _config.given_settings(kwargs)
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            own = set(type(self).model_fields) - set(BaseChatModel.model_fields)
            raise _config.configuration_error(exc, [*own, "max_tokens"]) from exc
        if shipped is not None:
            _config.check_file_match(shipped, self, stacklevel=2)

    @model_validator(mode="before")
    @classmethod
    def _one_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"max_tokens", "max_new_tokens"} <= data.keys():
            msg = "max_tokens and max_new_tokens are one setting: give one of them"
            raise ValueError(msg)
        return data

    @field_validator("esi_probe", mode="before")
    @classmethod
    def _read_probe(cls, value: Any) -> Any:
        return ESIProbe.read(value) if isinstance(value, (str, Path)) else value

    @model_validator(mode="after")
    def _check(self) -> ESIGuard:
        """Refuse settings that cannot work together (a :class:`ConfigurationError` saying why)."""
        check_settings(self)
        check_hidden(self.backend, self.combined, self.hidden_states)
        self._cascade = guard_cascade(self)
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
        :class:`ConfigurationError` naming every difference, when the backend's model (its
        GGUF's digest where both have one, else ``model_id``), value kind or exactness
        differ from those it was calibrated with, or when
        ``intervention`` or a scoring option in ``kwargs`` (``n_variants``, ``top_k``,
        ``distance``, ``support``, ``seed``, ``max_new_tokens``) differs from the file's: a
        threshold only means something for scores computed the same way. Other options (``action``,
        ``fallback``, ``abstain_message``) pass through. SOC and Typo interventions are
        rebuilt from the file; others (paraphrases) must be passed in. A file calibrated
        with ``--min-variants`` turns sequential ESI on with its fitted stopping rule
        (``min_variants=None`` turns it off); one calibrated with ``--score combined``
        decides on its combined score's ``p_wrong``. A file calibrated on another engine
        (transformers vs llama.cpp) is used with an :class:`EngineMismatchWarning`.
        """
        return _config.from_threshold_file(
            cls, path, backend=backend, intervention=intervention, **kwargs
        )

    @property
    def scoring_config(self) -> ScoringConfig:
        """How this guard computes scores (what a threshold file must match)."""
        return ScoringConfig(
            intervention=self.intervention.describe(),
            n_variants=self.n_variants,
            top_k=self.top_k,
            distance=self.distance,
            support=self.support,
            values=self.backend.values_kind,
            approximate=self.backend.approximate,
            seed=self.seed,
            max_new_tokens=self.max_new_tokens,
            decide_on=self.decide_on,
            min_variants=self.min_variants,
            stop_constant=self.stop_constant if self.min_variants is not None else None,
        )

    # -- public methods ---------------------------------------------------------------------

    def with_prompt(
        self,
        prompt: BasePromptTemplate[Any],
        question_key: str = "question",
        *,
        context_key: str | None = None,
    ) -> Runnable[dict[str, Any], AIMessage]:
        """This guard behind ``prompt``, intervening on the ``question_key`` variable only.

        The returned Runnable takes the prompt's variables (a dict) and returns the
        guard's ``AIMessage``. The prompt is rendered once as given and once per variant
        with only the question replaced, so instructions, retrieved context and history
        are the same bytes in every row. With ``context_key`` the answer is also forced
        once after the prompt with that variable emptied, and ``response_metadata["esi"]``
        reports ``context_reliance``. A RAG chain::

            {"context": retriever | format_docs, "question": RunnablePassthrough()}
            | guard.with_prompt(prompt, context_key="context") | StrOutputParser()

        Raises:
            ConfigurationError: ``question_key`` or ``context_key`` is not one of the
                prompt's input variables, or ``decide_on="context_reliance"`` without
                ``context_key``.
        """
        if self.decide_on == "context_reliance" and context_key is None:
            msg = "decide_on='context_reliance' needs with_prompt(..., context_key=...)"
            raise ConfigurationError(msg)
        templated = TemplatedPrompt(prompt=prompt, question_key=question_key,
                                    context_key=context_key)  # fmt: skip
        return templated | self

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """Guard one prompt (see the class)."""
        with rendered(input):
            return super().invoke(input, config, stop=stop, **kwargs)

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """Async :meth:`invoke`."""
        with rendered(input):
            return await super().ainvoke(input, config, stop=stop, **kwargs)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """Guard many prompts: each step runs once for all of them through the backend."""
        items = _batching.items(inputs, kwargs)
        self._pipeline(kwargs.get("stop")).run([i for i in items if i is not None])
        out: list[Any] = []
        configs = get_config_list(config, len(inputs))
        for value, each, item in zip(inputs, configs, items, strict=True):
            with _batching.prefetched(item), _batching.kept(out, return_exceptions):
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
        items = _batching.items(inputs, kwargs)
        await self._pipeline(kwargs.get("stop")).arun([i for i in items if i is not None])
        out: list[Any] = []
        configs = get_config_list(config, len(inputs))
        for value, each, item in zip(inputs, configs, items, strict=True):
            with _batching.prefetched(item), _batching.kept(out, return_exceptions):
                out.append(await self.ainvoke(value, each, **kwargs))
        return out

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        """The answer as one last chunk, once scored; live: its text first, as generated.

        Either way it runs the traced ``invoke`` (see :mod:`esi_guard.guard._live`), so the
        chat-model run, its tokens and every step show in callbacks and traces.
        """
        yield from _live.stream(lambda: self.invoke(input, config, stop=stop, **kwargs))

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """Async :meth:`stream`."""
        async for chunk in _live.astream(lambda: self.ainvoke(input, config, stop=stop, **kwargs)):
            yield chunk

    def score(self, prompt: GuardInput, answer: str) -> ESIResult:
        """Score an answer the user already has, without generating.

        The original distributions come from teacher forcing ``answer`` after the
        original prompt, in the same pass as the variants. It runs the pipeline's steps
        after generation, so a failure (the intervention's or the backend's) follows
        ``on_error`` as any answer's does.
        """
        parsed = self._checked(parse_input(prompt))
        ids = self.backend.encode_answer(parsed.messages, answer)
        item = Item(parsed, answer=answer, answer_ids=tuple(ids))
        self._pipeline().run([item], answered=True)
        outcome = item.outcome
        assert outcome is not None  # the pipeline decides every item
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

    def _should_stream(self, *, async_api: bool, run_manager: Any = None, **kwargs: Any) -> bool:
        # Live: invoke (and astream_events) stream through _generate, which has the run
        # manager for token callbacks and child runs; stream() still goes to _stream.
        if self.stream_mode == "live" and not kwargs.get("stream"):
            return False
        return super()._should_stream(async_api=async_api, run_manager=run_manager, **kwargs)

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
        hook = _tracing.Traced(run_manager)
        if item.outcome is not None:  # decided by batch
            _tracing.replay(hook, item)
        elif self.stream_mode == "live":
            for piece in pipeline.stream(item, hook):
                if run_manager is not None:
                    run_manager.on_llm_new_token(piece, chunk=piece_chunk(piece))
                _live.emit(piece)
        else:
            pipeline.run([item], hook)
        routed = None
        if decision(item) == "route":
            callbacks = _tracing.child(run_manager, "esi:fallback") if run_manager else None
            routed = self._fallback().invoke(messages, {"callbacks": callbacks})
        return self._decided(item, routed)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        item, pipeline = self._start(messages, stop, kwargs)
        hook = _tracing.ATraced(run_manager)
        if item.outcome is not None:  # decided by abatch
            await _tracing.areplay(hook, item)
        elif self.stream_mode == "live":
            async for piece in pipeline.astream(item, hook):
                if run_manager is not None:
                    await run_manager.on_llm_new_token(piece, chunk=piece_chunk(piece))
                _live.emit(piece)
        else:
            await pipeline.arun([item], hook)
        routed = None
        if decision(item) == "route":
            callbacks = _tracing.achild(run_manager, "esi:fallback") if run_manager else None
            routed = await self._fallback().ainvoke(messages, {"callbacks": callbacks})
        return self._decided(item, routed)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """One chunk, the last, once the answer has been scored.

        With ``stream_mode="live"``: the answer's text as it is generated, then that chunk.
        """
        if self.stream_mode == "hold":
            yield last_chunk(self._generate(messages, stop, run_manager, **kwargs))
            return
        item, pipeline = self._start(messages, stop, kwargs)
        sent = ""
        for piece in pipeline.stream(item, _tracing.Traced(run_manager)):
            sent += piece
            yield piece_chunk(piece)
        yield last_chunk(self._decided(item), sent)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """Async :meth:`_stream`."""
        if self.stream_mode == "hold":
            yield last_chunk(await self._agenerate(messages, stop, run_manager, **kwargs))
            return
        item, pipeline = self._start(messages, stop, kwargs)
        sent = ""
        async for piece in pipeline.astream(item, _tracing.ATraced(run_manager)):
            sent += piece
            yield piece_chunk(piece)
        yield last_chunk(self._decided(item), sent)

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
            combined=self.combined,
            keep_hidden=self.hidden_states,
            cascade=self._cascade,
        )

    def _start(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[Item, Pipeline]:
        """This call's item (the one batch ran, when it is this prompt's) and pipeline."""
        check_keywords("ESIGuard call", kwargs, ())
        prompt = self._checked(resolve(parse_input(messages)))
        return _batching.item_for(prompt), self._pipeline(stop)

    def _checked(self, prompt: GuardedPrompt) -> GuardedPrompt:
        """``prompt``; warn (once per guard) when a long whole message is the question."""
        if not self._warned:
            self._warned = warn_whole_message(prompt)
        return prompt

    def _decided(self, item: Item, routed: Any = None) -> ChatResult:
        return chat_result(item, routed, self.on_error, self.abstain_message, self.backend.model_id)

    def _fallback(self) -> Runnable[Any, Any]:
        assert self.fallback is not None  # the validator requires one for action="route"
        return self.fallback
