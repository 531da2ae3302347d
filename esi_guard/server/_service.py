"""What the server does with a request, apart from HTTP: the guard, the batcher, the answers.

Each prompt runs once through :meth:`ESIGuard.aassess` under the guard's own decision rule (an
unscored answer is withheld or flagged, never accepted); a routed answer's fallback runs here.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from langchain_core.messages import convert_to_messages

from esi_guard.applied import apply, esi_info
from esi_guard.exceptions import APIError, ConfigurationError
from esi_guard.guard import ESIGuard
from esi_guard.result import ESIResult
from esi_guard.server._batcher import Full, MicroBatcher
from esi_guard.server._errors import ServeError, from_exception, overloaded
from esi_guard.server._metrics import Metrics
from esi_guard.server._schema import Answer, ChatRequest, chunk
from esi_guard.server._settings import ServeSettings
from esi_guard.server._stream import ending, include_usage, sse
from esi_guard.server._timed import TimedBackend

__all__ = ["Answer", "Gone", "Routed", "Served", "Service", "noted"]

log = logging.getLogger("esi_guard.server")

WARM_UP_PROMPT = "What is the capital of France?"


@dataclass(frozen=True)
class Routed:
    """An untrusted answer's result and the fallback's answer sent in its place."""

    result: ESIResult
    fallback: Any


Gone = Callable[[], Awaitable[bool]]
"""Whether the request's client went away (``Request.is_disconnected``)."""


def noted(answer: Answer, warnings: list[str]) -> Answer:
    """``answer`` with the request's warnings in its ``esi`` (unchanged when none)."""
    if not warnings:
        return answer
    return replace(answer, esi={**answer.esi, "warnings": warnings})


class Served(Protocol):
    """What the routes ask of the answers' source: :class:`Service`, or the Ray front's."""

    settings: ServeSettings
    metrics: Metrics
    name: str
    names: tuple[str, ...]
    max_tokens: int
    live: bool
    ready: bool
    draining: bool
    in_flight: int

    def start_line(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def complete(self, chat: ChatRequest, limit: int, gone: Gone) -> Answer | None:
        """The request's answer (a failure raised as :class:`ServeError`); None: it went."""
        ...

    async def stream(self, chat: ChatRequest, limit: int, notes: list[str]) -> AsyncIterator[str]:
        """A live stream's events (``live``): tokens as generated, the scored ending."""
        ...


class Service:
    """The guards, the micro-batcher and the metrics of one server."""

    def __init__(self, guard: ESIGuard, settings: ServeSettings) -> None:
        if guard.on_error == "raise":
            msg = (
                "a server answers every request: give the guard on_error='abstain' or 'flag' "
                "(what an answer that cannot be scored becomes), not 'raise'"
            )
            raise ConfigurationError(msg)
        self.settings = settings
        self.abstain_message = guard.abstain_message
        self.metrics = Metrics()
        backend = TimedBackend(guard.backend, self._step)
        self.guard = guard.model_copy(update={"backend": backend})
        # A long whole message is each response's warning here, not the server log's.
        self.guard._warned = True
        self.live = guard.action == "flag" and guard.on_error == "flag"
        """Whether a stream shows tokens as generated (nothing can then be withheld)."""
        self.name = settings.model_name or guard.backend.model_id
        self.names = tuple(dict.fromkeys((self.name, *settings.model_aliases)))
        """The model names a request may send: the served name first."""
        self.max_tokens = guard.max_new_tokens
        self._sized: dict[int, ESIGuard] = {}
        self.batcher = MicroBatcher(
            self._run,
            max_batch=settings.max_batch,
            window=settings.batch_window_ms / 1000,
            max_queue=settings.max_queue,
            slots=settings.slots,
            on_batch=self.metrics.batched,
        )
        self.metrics.watch_queue(lambda: self.batcher.depth)
        self.ready = False
        self.draining = False
        """Set on SIGTERM: not ready, new chat requests refused, those in flight finishing."""
        self.in_flight = 0
        """Chat requests being served (streams until their last event)."""
        self.answered_at = 0.0
        """When the engine last answered (``time.monotonic``; 0: never)."""
        self.running_since: float | None = None
        """When the batched call now running started (None: none is)."""
        self._warming: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the batcher and warm up (or be ready at once without ``warm_up``)."""
        log.info("%s", self.start_line())
        self.batcher.start()
        if self.settings.warm_up:
            self._warming = asyncio.get_running_loop().create_task(self.warm_up())
        else:
            self.ready = True
            self.metrics.ready.set(1)

    async def warmed(self) -> None:
        """Return once the warm-up has answered (at once without ``warm_up``)."""
        if self._warming is not None:
            await asyncio.shield(self._warming)

    async def stop(self) -> None:
        """Not ready; the warm-up cancelled, the batcher stopped."""
        self.ready = False
        if self._warming is not None:
            self._warming.cancel()
        await self.batcher.stop()

    async def complete(self, chat: ChatRequest, limit: int, gone: Gone) -> Answer | None:
        """The request through the micro-batcher; None if its client went away first."""
        try:
            future = self.batcher.submit((limit, chat.stops()), chat.chat())
        except Full as exc:
            raise overloaded(self.settings.retry_after, f"server overloaded: {exc}") from exc
        output = await wait(future, gone)
        if output is GONE:
            return None
        return self.answer(output)

    async def stream(self, chat: ChatRequest, limit: int, notes: list[str]) -> AsyncIterator[str]:
        """Tokens, then the scored ending; a failure before the first token is an HTTP error."""
        events = live_events(self, chat, limit, notes)
        first = await anext(events)
        return _chained(first, events)

    def start_line(self) -> str:
        """What the server runs with, for its start-up log line (never the API key)."""
        guard, settings = self.guard, self.settings
        source = f" ({settings.threshold_source})" if settings.threshold_source else ""
        signal = " on p_wrong" if guard.combined is not None else ""
        auth = "on (Bearer key on /v1/*)" if settings.api_key is not None else "off"
        names = " or ".join(repr(name) for name in self.names)
        return (
            f"serving model {guard.backend.model_id!r} on engine {guard.backend.engine}: "
            f"threshold {guard.threshold:g}{signal}{source}, action {guard.action}, "
            f"on error {guard.on_error}, auth {auth}; requests send model {names}"
        )

    def drain(self) -> None:
        """Turn not ready and refuse new chat requests, letting those in flight finish."""
        self.draining = True
        self.ready = False
        self.metrics.ready.set(0)

    def _step(self, step: str, seconds: float) -> None:
        self.metrics.steps.labels(step).observe(seconds)

    def guard_for(self, limit: int) -> ESIGuard:
        """The guard for a token limit (at most the server's)."""
        limit = min(limit, self.max_tokens)
        if limit not in self._sized:
            self._sized[limit] = self.guard.model_copy(update={"max_new_tokens": limit})
        return self._sized[limit]

    async def _run(self, key: Hashable, prompts: list[Any]) -> Sequence[Any]:
        limit, stop = cast("tuple[int, tuple[str, ...]]", key)
        started = time.perf_counter()
        self.running_since = time.monotonic()
        try:
            results = await self.guard_for(limit).aassess(
                prompts, stop=stop or None, failures="return"
            )
            if any(isinstance(result, ESIResult) for result in results):
                self.answered_at = time.monotonic()
            routed = (self._routed(p, r) for p, r in zip(prompts, results, strict=True))
            return await asyncio.gather(*routed)  # a batch's fallbacks answer at once
        finally:
            self.running_since = None
            self._step("guard", time.perf_counter() - started)

    async def _routed(self, prompt: Any, result: Any) -> Any:
        """``result``, or with ``action="route"`` the fallback's answer for an untrusted one."""
        if not isinstance(result, ESIResult) or result.decision != "route":
            return result
        assert self.guard.fallback is not None  # the guard requires one for action="route"
        try:
            return Routed(result, await self.guard.fallback.ainvoke(convert_to_messages(prompt)))
        except Exception as exc:  # the fallback's failure is this request's
            return exc

    def answer(self, output: Any) -> Answer:
        """A result (or :class:`Routed`) as the wire shows it; a failure raised as ServeError."""
        routed = output.fallback if isinstance(output, Routed) else None
        result = output.result if isinstance(output, Routed) else output
        if not isinstance(result, ESIResult):
            raise self.failure(output)
        applied = apply(result, routed, abstain_message=self.abstain_message)
        usage = {"prompt_tokens": applied.input_tokens, "completion_tokens": applied.output_tokens,
                 "total_tokens": applied.total_tokens}  # fmt: skip
        answer = Answer(applied.content, applied.finish_reason, usage, esi_info(applied.esi))
        return self._counted(answer)

    def _counted(self, answer: Answer) -> Answer:
        self.metrics.decided(answer.esi)
        return answer

    def failure(self, output: Any) -> ServeError:
        """A failure as its error, naming the served model, not the backend's id (a GGUF path)."""
        error = output if isinstance(output, BaseException) else TypeError(type(output).__name__)
        openai = sys.modules.get("openai")
        if openai is not None and isinstance(error, openai.APIError):
            error = APIError(f"the fallback failed: {type(error).__name__}", original=error)
        failure = from_exception(error)
        model_id = self.guard.backend.model_id
        if model_id and model_id != self.name and model_id in failure.message:
            failure.message = failure.message.replace(model_id, self.name)
        self.metrics.decisions.labels("error", failure.code or "error").inc()
        return failure

    async def warm_up(self, retry_seconds: float = 2.0) -> None:
        """Ask the model once, until it answers; then the server is ready."""
        while True:
            async with self.batcher.slot():
                (output,) = await self.guard_for(self.max_tokens).aassess(
                    [WARM_UP_PROMPT], failures="return"
                )
            if isinstance(output, ESIResult):
                self.answered_at = time.monotonic()
                self.ready = not self.draining
                self.metrics.ready.set(int(self.ready))
                log.info("ready: %s answered", self.name)
                return
            log.warning("not ready: the model did not answer (%s)", type(output).__name__)
            await asyncio.sleep(retry_seconds)


GONE = object()
"""What :func:`wait` gives when the client went away."""


async def wait(future: asyncio.Future[Any], gone: Gone, poll: float = 0.1) -> Any:
    """The future's output (a failure as its exception), or :data:`GONE` if the client left."""
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=poll)
            if done:
                try:
                    return future.result()
                except Exception as exc:  # a failure in place of the answer
                    return exc
            if await gone():
                future.cancel()
                return GONE
    except asyncio.CancelledError:
        future.cancel()
        raise


async def live_events(
    service: Service, chat: ChatRequest, limit: int, notes: list[str]
) -> AsyncIterator[str]:
    """Tokens, then the scored ending; a failure is raised before the first event, sent after."""
    ident, model = f"chatcmpl-{uuid.uuid4().hex}", service.name
    guard = service.guard_for(limit)
    async with service.batcher.slot():
        pieces = guard.astream_assess(chat.chat(), stop=chat.stops() or None, failures="return")
        try:
            first = await anext(pieces)
            answer = None if isinstance(first, str) else service.answer(first)
        except ServeError:
            raise
        except Exception as exc:  # before the first event: the request's HTTP error
            raise service.failure(exc) from exc
        yield sse(chunk(ident, model, {"role": "assistant", "content": ""}))
        sent = ""
        if answer is None:
            sent, output = str(first), None
            yield sse(chunk(ident, model, {"content": sent}))
            try:
                async for piece in pieces:
                    if not isinstance(piece, str):
                        output = piece
                        break
                    sent += piece
                    yield sse(chunk(ident, model, {"content": piece}))
                answer = service.answer(output)
            except Exception as exc:  # after the start, an error can only be an event
                failure = exc if isinstance(exc, ServeError) else service.failure(exc)
                yield sse(failure.body())
                return
        answer = noted(answer, notes)
        rest = answer.content[len(sent) :] if answer.content.startswith(sent) else ""
        for event in ending(ident, model, answer, rest, include_usage(chat)):
            yield event


async def _chained(first: str, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``first``, then the rest of ``events`` (closed with it: a client gone stops it)."""
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await events.aclose()  # type: ignore[attr-defined]
