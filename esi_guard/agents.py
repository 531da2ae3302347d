"""ESI as LangChain agent middleware: score the final answer of a ``create_agent`` agent.

Use ``create_agent(model, tools, middleware=[ESIMiddleware(threshold=0.3)])``. A tool-calling turn
passes on unscored (``response_metadata["esi"]["decision"] == "pass"``); a final answer is scored
like one handed to ``ESIGuard.score``, the last human message as the question. The system message,
earlier turns, tool calls and tool results are context, never intervened on, folded into text alike
for every backend (:func:`esi_guard.guard._inputs.fold_tools`); tool schemas are not scored.

Like the guard it can ``flag`` (the score in ``response_metadata["esi"]``), ``abstain`` (content
replaced; the loop ends) or ``route`` (the request re-run on ``fallback``); or it raises
:class:`~esi_guard.UncertainAnswerError` for a middleware listed before it (LangChain's
``ModelFallbackMiddleware``), whose answer comes back unscored, marked ``fallback_used``. An
unscorable answer follows ``on_error``, never trusted. With ``stream_mode="messages"``, tokens are
held until decided (``nostream`` tag): a withheld answer never shows. Needs the ``agents`` extra
(``langchain`` 1.x and ``langgraph``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import add_usage
from langchain_core.runnables.config import ensure_config, var_child_runnable_config
from langgraph.constants import TAG_NOSTREAM

from esi_guard._keywords import check_keywords
from esi_guard._pipeline.decide import acted, untrusted
from esi_guard._text import message_text
from esi_guard.applied import apply
from esi_guard.backends.adapters import backend_for
from esi_guard.backends.base import Backend
from esi_guard.backends.fake import FakeBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.exceptions import ConfigurationError, UncertainAnswerError
from esi_guard.guard import DEFAULT_ABSTAIN_MESSAGE, ESIGuard
from esi_guard.guard._inputs import fold_tools
from esi_guard.result import ESIResult, OnError

__all__ = ["ESIMiddleware"]

MiddlewareAction = Literal["flag", "abstain", "route", "raise"]
SCORING_OPTIONS = ("intervention", "n_variants", "top_k", "distance", "support", "seed")
"""The guard's scoring settings the middleware takes (see :class:`~esi_guard.ESIGuard`)."""
TOOL_TURN = "tool_calls: the model called tools; only a final answer is scored"

Handler = Callable[[ModelRequest[Any]], ModelResponse[Any]]
AsyncHandler = Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]


@dataclass(frozen=True)
class _Raised:
    """The request this middleware just raised on, to recognise its fallback's call."""

    messages: list[Any]
    model: Any
    result: ESIResult


KEPT_RAISED = 128
"""How many raised-on requests a middleware remembers for their fallback's call."""


class ESIMiddleware(AgentMiddleware[Any, Any, Any]):
    """Score an agent's final answers with ESI and flag, withhold, re-route or raise.

    Args:
        threshold: Scores strictly above it are untrusted (or use :meth:`from_calibration`).
        action: ``flag``, ``abstain``, ``route`` (needs ``fallback``) or ``raise``.
        on_error: For an unscorable answer: ``abstain`` (withheld, default), ``flag`` or ``raise``.
        fallback: The chat model a routed request is re-run on.
        abstain_message: The content of a withheld answer.
        backend: Scores answers; default: built from the request's model, as ``ESIGuard(llm=...)``.
        llm: A model object to build that backend from, instead of the request's model.
        **scoring: ``intervention``, ``n_variants``, ``top_k``, ``distance``, ``support``, ``seed``:
            as :class:`~esi_guard.ESIGuard`'s.

    Raises:
        ConfigurationError: An invalid or unknown setting; at the first model call, a model it
            cannot score (naming its type).
    """

    def __init__(
        self,
        threshold: float | None = None,
        *,
        action: MiddlewareAction = "flag",
        on_error: OnError = "abstain",
        fallback: BaseChatModel | None = None,
        abstain_message: str = DEFAULT_ABSTAIN_MESSAGE,
        backend: Backend | None = None,
        llm: Any = None,
        **scoring: Any,
    ) -> None:
        check_keywords("ESIMiddleware", scoring, SCORING_OPTIONS)
        if action not in ("flag", "abstain", "route", "raise"):
            msg = f"action must be 'flag', 'abstain', 'route' or 'raise', got {action!r}"
            raise ConfigurationError(msg)
        if action == "route" and not isinstance(fallback, BaseChatModel):
            msg = f"action='route' needs a fallback chat model, got {type(fallback).__name__}"
            raise ConfigurationError(msg)
        if backend is not None and llm is not None:
            msg = "give backend= or llm=, not both"
            raise ConfigurationError(msg)
        if threshold is None:
            msg = "ESIMiddleware needs a threshold (or ESIMiddleware.from_calibration(path))"
            raise ConfigurationError(msg)
        super().__init__()
        self.action: MiddlewareAction = action
        self.fallback = fallback
        self.calibration: Path | None = None
        self._options: dict[str, Any] = {
            "threshold": threshold,
            "on_error": on_error,
            "abstain_message": abstain_message,
            **scoring,
        }
        ESIGuard(backend=FakeBackend(), **self._options)  # every setting checked now
        self._backend = backend_for(llm) if llm is not None else backend
        self._guards: dict[int, tuple[Any, ESIGuard]] = {}
        self._raised: OrderedDict[int, _Raised] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_calibration(cls, path: str | Path, **kwargs: Any) -> ESIMiddleware:
        """A middleware from a threshold file, checked against the backend at the first call."""
        calibrated = ThresholdFile.read(path)
        middleware = cls(threshold=calibrated.threshold, **kwargs)
        middleware.calibration = Path(path)
        return middleware

    # -- the middleware hooks ----------------------------------------------------------------

    def wrap_model_call(self, request: ModelRequest[Any], handler: Handler) -> ModelResponse[Any]:
        """Run the model call; score a final answer and act on it."""
        handed = self._handed_over(request)
        guard = None if handed else self.guard_for(request.model)
        with _held():
            response = handler(request)
        message = _answer(response)
        if handed is not None:
            return _with(response, message, _meta(handed, fallback_used=True))
        if guard is None or message is None or _tool_turn(response, message):
            return self._passed(response, message, guard)
        result = guard.score(_prompt(request), _answer_text(response, message))
        if self.action == "route" and untrusted(result):
            with _held():
                routed = handler(request.override(model=self._fallback()))
            return self._routed(routed, result, message)
        return self._decided(request, response, message, result)

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: AsyncHandler
    ) -> ModelResponse[Any]:
        """Async :meth:`wrap_model_call` (the scoring runs in a worker thread)."""
        handed = self._handed_over(request)
        guard = None if handed else await asyncio.to_thread(self.guard_for, request.model)
        with _held():
            response = await handler(request)
        message = _answer(response)
        if handed is not None:
            return _with(response, message, _meta(handed, fallback_used=True))
        if guard is None or message is None or _tool_turn(response, message):
            return self._passed(response, message, guard)
        answer = _answer_text(response, message)
        result = await asyncio.to_thread(guard.score, _prompt(request), answer)
        if self.action == "route" and untrusted(result):
            with _held():
                routed = await handler(request.override(model=self._fallback()))
            return self._routed(routed, result, message)
        return self._decided(request, response, message, result)

    # -- the guard per model -------------------------------------------------------------------

    def guard_for(self, model: Any) -> ESIGuard:
        """The guard that scores ``model``'s answers, built once per model object.

        Raises:
            ConfigurationError: No backend can be built from ``model``, or a threshold file differs.
        """
        with self._lock:
            kept = self._guards.get(id(model))
            if kept is not None and kept[0] is model:
                return kept[1]
            guard = self._build(self._backend or _backend(model))
            self._guards[id(model)] = (model, guard)
            return guard

    def _build(self, backend: Backend) -> ESIGuard:
        # The guard flags; the middleware takes the action (it can also route and raise).
        if self.calibration is None:
            return ESIGuard(backend=backend, action="flag", **self._options)
        options = {k: v for k, v in self._options.items() if k != "threshold"}
        return ESIGuard.from_calibration(self.calibration, backend=backend, **options)

    # -- acting on a result --------------------------------------------------------------------

    def _passed(
        self, response: ModelResponse[Any], message: AIMessage | None, guard: ESIGuard | None
    ) -> ModelResponse[Any]:
        """A turn that is not a final answer (tool calls), marked and passed on."""
        if message is None or guard is None:
            return response
        result = ESIResult(
            score=None,
            threshold=guard.threshold,
            decision="pass",
            scored=False,
            reason=TOOL_TURN,
            answer=message_text(message, skip_other_blocks=True),
            variants=[],
            answer_token_ids=[],
            token_scores=[],
            model=guard.backend.model_id,
            scoring=guard.scoring_config.as_metadata(),
            threshold_source=guard.threshold_source,
        )
        return _with(response, message, _meta(result))

    def _decided(
        self,
        request: ModelRequest[Any],
        response: ModelResponse[Any],
        message: AIMessage,
        result: ESIResult,
    ) -> ModelResponse[Any]:
        result = acted(result, self.action)
        if result.decision == "raise":
            with self._lock:
                self._raised[id(request.messages)] = _Raised(
                    request.messages, request.model, result
                )
                while len(self._raised) > KEPT_RAISED:
                    self._raised.popitem(last=False)
            decided = ("p_wrong", result.p_wrong) if result.p_wrong is not None else (
                "ESI", result.score)  # fmt: skip
            msg = (
                f"the agent's answer's {decided[0]} is {decided[1]:.4g} > threshold "
                f"{result.threshold}"
            )
            raise UncertainAnswerError(msg, result=result, answer=message)
        applied = apply(result, abstain_message=self._options["abstain_message"])
        content = applied.content if result.decision in ("abstain", "redact") else None
        finish = applied.finish_reason if result.decision == "abstain" else None
        return _with(response, message, applied.esi, content=content, finish_reason=finish)

    def _routed(
        self, routed: ModelResponse[Any], result: ESIResult, answered: AIMessage
    ) -> ModelResponse[Any]:
        """The fallback's response, its usage with the answer's it replaced (as ``apply``)."""
        result = acted(result, "route")
        message = _answer(routed)
        usage = None
        if message is not None and (answered.usage_metadata or message.usage_metadata):
            usage = add_usage(answered.usage_metadata, message.usage_metadata)
        return _with(routed, message, _meta(result, fallback_used=True), usage=usage)

    def _handed_over(self, request: ModelRequest[Any]) -> ESIResult | None:
        """The result raised on, if ``request`` re-runs it on another model (hooks copy context)."""
        with self._lock:
            raised = self._raised.get(id(request.messages))
            if raised is None or raised.messages is not request.messages:
                return None
            if raised.model is request.model:
                return None
            del self._raised[id(request.messages)]
            return raised.result

    def _fallback(self) -> BaseChatModel:
        assert self.fallback is not None  # the constructor requires one for action="route"
        return self.fallback


def _backend(model: Any) -> Backend:
    try:
        return backend_for(model)
    except ConfigurationError as exc:
        kind = f"{type(model).__module__}.{type(model).__name__}"
        msg = (
            f"ESIMiddleware cannot score the answers of a {kind}: {exc}. "
            "Give ESIMiddleware(backend=...) a backend on the same weights"
        )
        raise ConfigurationError(msg) from exc


def _prompt(request: ModelRequest[Any]) -> list[BaseMessage]:
    system = [request.system_message] if request.system_message is not None else []
    return [*system, *request.messages]


def _answer(response: ModelResponse[Any]) -> AIMessage | None:
    """The response's model message (a structured-output ToolMessage may follow it)."""
    return next((m for m in response.result if isinstance(m, AIMessage)), None)


def _tool_turn(response: ModelResponse[Any], message: AIMessage) -> bool:
    """Whether the model called tools to go on (not a structured answer's response-format call)."""
    return bool(message.tool_calls) and response.structured_response is None


def _answer_text(response: ModelResponse[Any], message: AIMessage) -> str:
    """The final answer's text as scored: a structured answer's tool call folded to text."""
    if message.tool_calls and response.structured_response is not None:
        (folded,), _ = fold_tools([message])
        return folded["content"]
    return message_text(message, skip_other_blocks=True)


def _meta(result: ESIResult, *, fallback_used: bool = False) -> dict[str, Any]:
    esi = result.as_dict()
    if fallback_used:
        esi["fallback_used"] = True
    return esi


def _with(
    response: ModelResponse[Any],
    message: AIMessage | None,
    esi: dict[str, Any],
    *,
    content: str | None = None,
    finish_reason: str | None = None,
    usage: Any = None,
) -> ModelResponse[Any]:
    """``response`` with ``message`` carrying ``esi`` (and any content, finish reason, usage)."""
    if message is None:
        return response
    meta = {**message.response_metadata, "esi": esi}
    if finish_reason is not None:
        meta["finish_reason"] = finish_reason
    update: dict[str, Any] = {"response_metadata": meta}
    if content is not None:
        update["content"] = content
    if usage is not None:
        update["usage_metadata"] = usage
    if content is not None and response.structured_response is not None:
        # A structured answer withheld: its tool call and structured response go too, and
        # the agent ends (asked again, the model would answer the same).
        update |= {"tool_calls": [], "invalid_tool_calls": []}
        withheld = ModelResponse(result=[message.model_copy(update=update)])
        return _ended(withheld)
    marked = message.model_copy(update=update)
    result = [marked if m is message else m for m in response.result]
    return ModelResponse(result=result, structured_response=response.structured_response)


def _ended(response: ModelResponse[Any]) -> ModelResponse[Any]:
    """``response``, and the agent's loop ended after it (where langchain can say so)."""
    try:
        from langchain.agents.middleware.types import ExtendedModelResponse
        from langgraph.types import Command
    except ImportError:  # an older langchain: the agent asks the model again
        return response
    ended: Command[Any] = Command(update={"jump_to": "end"})
    return cast("ModelResponse[Any]", ExtendedModelResponse(model_response=response,
                                                            command=ended))  # fmt: skip


@contextmanager
def _held() -> Iterator[None]:
    """The model call's messages kept out of ``stream_mode="messages"`` until decided."""
    config = ensure_config()
    tags = [*(config.get("tags") or []), TAG_NOSTREAM]
    token = var_child_runnable_config.set({**config, "tags": tags})
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)
