"""ESIGuard: a guarded chat model that generates, scores with ESI, decides and acts.

It knows no backend internals: the pipeline (:mod:`esi_guard._pipeline`) runs the steps and calls
the guard's tracing hook around each, so each is a tagged child run (``esi:generate``,
``esi:intervene``, ``esi:score``; ``esi:fallback`` when routing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import BasePromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import get_config_list

from esi_guard import _retired
from esi_guard._keywords import check_keywords
from esi_guard._pipeline.decide import Rule
from esi_guard._pipeline.items import GuardedPrompt, Item
from esi_guard._pipeline.steps import Pipeline
from esi_guard.backends.base import Backend
from esi_guard.guard import _assess, _batching, _config, _live, _sentences, _tracing
from esi_guard.guard._assess import raised
from esi_guard.guard._fields import DEFAULT_ABSTAIN_MESSAGE, GuardFields
from esi_guard.guard._inputs import parse_input, rendered, resolve
from esi_guard.guard._messages import (
    chat_result,
    decision,
    last_chunk,
    last_message_chunk,
    piece_chunk,
    sentences_last,
    sentences_last_chunk,
)
from esi_guard.guard._prompt import asked, warn_if_other
from esi_guard.guard._templates import TemplatedPrompt, warn_whole_message
from esi_guard.interventions import Intervention
from esi_guard.result import ESIResult

__all__ = ["DEFAULT_ABSTAIN_MESSAGE", "ESIGuard", "GuardInput"]

GuardInput: TypeAlias = (
    str | PromptValue | Sequence[BaseMessage | tuple[str, str] | dict[str, Any] | str]
)
"""What the guard takes: a string, a PromptValue, or a list of messages."""


class ESIGuard(GuardFields):
    """Guard a model's answers with the ESI uncertainty score: a guarded chat model.

    For each prompt it generates the greedy answer, makes ``n_variants`` intervened copies of the
    question (the last human message only), teacher-forces the answer after each, and scores how
    much the token distributions move. Above ``threshold`` it acts: ``flag`` marks the answer
    untrusted, ``abstain`` replaces it with ``abstain_message``, ``route`` returns ``fallback``'s.
    The result is in ``response_metadata["esi"]`` (see :class:`ESIResult`).

    **Failure policy** (``on_error``): an answer that cannot be scored (backend or intervention
    failure, context overflow, empty answer, no variant differs, NaN/inf; codes in
    :mod:`esi_guard.exceptions`) is withheld (``"abstain"``, the default), flagged (``"flag"``)
    or raised (``"raise"``; returned in place by ``batch(..., return_exceptions=True)``), always
    with ``scored: false`` and a ``reason``: never passed as trusted. An input that is not a
    prompt raises :class:`InputError` whatever the policy. One prompt's failure never touches the
    others of a batch; the guard keeps no state between calls.

    ``batch`` runs each step once for all prompts; ``stream`` holds the answer until it is scored
    unless ``stream_mode`` says otherwise, and traces every step either way.

    Example:
        .. code-block:: python

            guard = ESIGuard(threshold=0.3, action="abstain")   # or llm=your_model
            guard.invoke("What is the capital of France?").response_metadata["esi"]
    """

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

        Refused (a :class:`ConfigurationError` naming every difference) when the backend's model
        (its GGUF's digest, else ``model_id``), value kind or exactness, the ``intervention`` or a
        scoring option in ``kwargs`` (``n_variants``, ``top_k``, ``distance``, ``support``,
        ``seed``, ``max_new_tokens``) differ from the file's: a threshold holds only for scores
        computed the same way. Other options (``action``, ``fallback``...) pass through; SOC and
        Typo are rebuilt from the file, paraphrases must be passed in. The file's combined score
        applies. Another engine gets an :class:`EngineMismatchWarning`, another prompt (given here
        or sent by a call) one :class:`PromptMismatchWarning`.
        """
        return _config.from_threshold_file(
            cls, path, backend=backend, intervention=intervention, **kwargs
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

        The returned Runnable takes the prompt's variables (a dict) and returns the guard's
        ``AIMessage``; everything but the question is the same bytes in every row. A RAG chain::

            {"context": retriever | format_docs, "question": RunnablePassthrough()}
            | guard.with_prompt(prompt) | StrOutputParser()

        Raises:
            ConfigurationError: ``question_key`` is not one of the prompt's input variables, or
                ``context_key`` (context reliance, retired) is given.
        """
        if context_key is not None:
            error = _retired.retired("context_key", "with_prompt")
            raise error
        return TemplatedPrompt(prompt=prompt, question_key=question_key) | self

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
        items = _batching.items(inputs, kwargs, self._checked)
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
        items = _batching.items(inputs, kwargs, self._checked)
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
        """The answer as one last chunk once scored (live: its text first), from a traced invoke."""
        last = sentences_last_chunk if self.stream_mode == "sentences" else last_message_chunk
        yield from _live.stream(lambda: self.invoke(input, config, stop=stop, **kwargs), last)

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """Async :meth:`stream`."""
        last = sentences_last_chunk if self.stream_mode == "sentences" else last_message_chunk
        ainvoke = lambda: self.ainvoke(input, config, stop=stop, **kwargs)  # noqa: E731
        async for chunk in _live.astream(ainvoke, last):
            yield chunk

    def assess(
        self,
        inputs: Sequence[GuardInput],
        *,
        stop: Sequence[str] | None = None,
        failures: _assess.Failures = "decide",
    ) -> list[_assess.Assessed]:
        """Score and decide each input: the results themselves, not chat messages.

        The same steps and decisions as :meth:`batch`, without a chat-model run (no callbacks,
        traces or cache); ``route``'s fallback is the caller's to run. In each input's place: its
        decided :class:`ESIResult` (with ``prompt_tokens``), or the error :meth:`invoke` would raise
        (:class:`InputError`, :class:`BackendError`, or under ``on_error="raise"`` a
        :class:`ScoringError` holding the unscored result). ``failures="return"``: a failed backend
        call's :class:`BackendError` is returned whatever ``on_error`` (the server answers it as
        HTTP); unscorable answers still follow ``on_error``.
        """
        pipeline = self._pipeline(stop, failures == "return")
        return _assess.run(pipeline, inputs, self._checked, self.on_error)

    async def aassess(
        self,
        inputs: Sequence[GuardInput],
        *,
        stop: Sequence[str] | None = None,
        failures: _assess.Failures = "decide",
    ) -> list[_assess.Assessed]:
        """Async :meth:`assess`."""
        pipeline = self._pipeline(stop, failures == "return")
        return await _assess.arun(pipeline, inputs, self._checked, self.on_error)

    def astream_assess(
        self,
        input: GuardInput,
        *,
        stop: Sequence[str] | None = None,
        failures: _assess.Failures = "decide",
    ) -> AsyncIterator[str | _assess.Assessed]:
        """One input's answer text as generated (unscored, so only flaggable), then its result."""
        pipeline = self._pipeline(stop, failures == "return")
        return _assess.astream(pipeline, input, self._checked, self.on_error)

    def score(self, prompt: GuardInput, answer: str) -> ESIResult:
        """Score an answer the user already has, without generating; failures follow on_error."""
        parsed = self._checked(parse_input(prompt), apply=False)
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
        # Live: invoke streams through _generate, which has the run manager; stream() -> _stream.
        if self.stream_mode in ("live", "sentences") and not kwargs.get("stream"):
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
        elif self.stream_mode == "sentences" and _live.serving():
            for chunk in _sentences.sentences(pipeline, item, self.action, run_manager):
                _live.emit(chunk)
        else:
            pipeline.run([item], hook)
        return self._decided(item, self._routed(item, messages, run_manager))

    async def _arouted(self, item: Item, messages: list[BaseMessage], run_manager: Any) -> Any:
        """Async :meth:`_routed`."""
        if decision(item) != "route" or self.fallback is None:  # the validator sets one
            return None
        callbacks = _tracing.achild(run_manager, "esi:fallback") if run_manager else None
        return await self.fallback.ainvoke(messages, {"callbacks": callbacks})

    def _routed(
        self, item: Item, messages: list[BaseMessage], run_manager: CallbackManagerForLLMRun | None
    ) -> Any:
        """The fallback's answer where the item was routed; else None."""
        if decision(item) != "route" or self.fallback is None:  # the validator sets one
            return None
        callbacks = _tracing.child(run_manager, "esi:fallback") if run_manager else None
        return self.fallback.invoke(messages, {"callbacks": callbacks})

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
        elif self.stream_mode == "sentences" and _live.serving():
            async for chunk in _sentences.asentences(pipeline, item, self.action, run_manager):
                _live.emit(chunk)
        else:
            await pipeline.arun([item], hook)
        return self._decided(item, await self._arouted(item, messages, run_manager))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """One last chunk once the answer is scored; live or sentences: the text first."""
        if self.stream_mode == "hold":
            yield last_chunk(self._generate(messages, stop, run_manager, **kwargs))
            return
        item, pipeline = self._start(messages, stop, kwargs)
        if self.stream_mode == "sentences":
            for chunk in _sentences.sentences(pipeline, item, self.action, run_manager):
                yield ChatGenerationChunk(message=chunk)
            yield sentences_last(self._decided(item, self._routed(item, messages, run_manager)))
            return
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
        if self.stream_mode == "sentences":
            async for chunk in _sentences.asentences(pipeline, item, self.action, run_manager):
                yield ChatGenerationChunk(message=chunk)
            yield sentences_last(
                self._decided(item, await self._arouted(item, messages, run_manager))
            )
            return
        sent = ""
        async for piece in pipeline.astream(item, _tracing.ATraced(run_manager)):
            sent += piece
            yield piece_chunk(piece)
        yield last_chunk(self._decided(item), sent)

    # -- helpers ----------------------------------------------------------------------------

    def _pipeline(self, stop: Sequence[str] | None = None, failures: bool = False) -> Pipeline:
        rule = Rule(self.policy, self.scoring_config, self.backend.model_id,
                    action=self.action, on_error=self.on_error, decide_on=self.decide_on,
                    sentence_threshold=self.sentence_threshold,
                    threshold_source=self.threshold_source, keep_hidden=self.hidden_states,
                    return_failures=failures)  # fmt: skip
        stops = tuple(stop if stop is not None else self.stop or ())
        return Pipeline(self.backend, self.intervention, rule, stops)

    def _start(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[Item, Pipeline]:
        """This call's item (the one batch ran, when it is this prompt's) and pipeline."""
        check_keywords("ESIGuard call", kwargs, ())
        prompt = self._checked(resolve(parse_input(messages)))
        return _batching.item_for(prompt), self._pipeline(stop)

    def _checked(self, prompt: GuardedPrompt, *, apply: bool = True) -> GuardedPrompt:
        """``prompt`` as this guard asks it (``apply``: its system prompt, template); warns once."""
        if not self._warned:
            self._warned = warn_whole_message(prompt)
        if apply:
            prompt = asked(prompt, self.system_prompt, self.prompt_template)
        if not self._prompt_warned:
            self._prompt_warned = warn_if_other(prompt, self._calibrated_prompt)
        return prompt

    def _decided(self, item: Item, routed: Any = None) -> ChatResult:
        return chat_result(item, routed, self.on_error, self.abstain_message, self.backend.model_id)
