"""What the server does with a request, apart from HTTP: the guards, the batcher, the answers.

The guard the server was given keeps its settings (threshold, action, abstention text);
the server runs a copy with ``on_error="raise"`` so that a failure comes back as its
exception, by type: an unscored answer (:class:`ScoringError`, holding its result) gets
the given guard's ``on_error`` here (withheld or flagged, never accepted), a prompt
longer than the context becomes a 400, an upstream failure a 502 (:mod:`._errors`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from langchain_core.messages import AIMessage

from esi_guard.exceptions import APIError, ConfigurationError, ScoringError
from esi_guard.guard import ESIGuard
from esi_guard.result import ESIResult
from esi_guard.serve._batcher import MicroBatcher
from esi_guard.serve._errors import ServeError, from_exception
from esi_guard.serve._metrics import Metrics
from esi_guard.serve._schema import ABSTAIN_FINISH_REASON, esi_info
from esi_guard.serve._settings import ServeSettings
from esi_guard.serve._timed import TimedBackend

__all__ = ["Answer", "Service"]

log = logging.getLogger("esi_guard.serve")

WARM_UP_PROMPT = "What is the capital of France?"


@dataclass(frozen=True)
class Answer:
    """One request's answer as the wire shows it."""

    content: str
    finish_reason: str
    usage: dict[str, int]
    esi: dict[str, Any]


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
        self.policy = guard.on_error
        self.abstain_message = guard.abstain_message
        self.metrics = Metrics()
        backend = TimedBackend(guard.backend, self._step)
        self.guard = guard.model_copy(update={"on_error": "raise", "backend": backend})
        # A long whole message is each response's warning here, not the server log's.
        self.guard._warned = True
        self.live = guard.action == "flag" and guard.on_error == "flag"
        """Whether a stream shows tokens as generated (nothing can then be withheld)."""
        self.name = settings.model_name or guard.backend.model_id
        self.names = tuple(dict.fromkeys((self.name, *settings.model_aliases)))
        """The model names a request may send: the served name first."""
        self.max_tokens = guard.max_new_tokens
        self._sized: dict[tuple[int, bool], ESIGuard] = {}
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
            f"on error {self.policy}, auth {auth}; requests send model {names}"
        )

    def drain(self) -> None:
        """Turn not ready and refuse new chat requests, letting those in flight finish."""
        self.draining = True
        self.ready = False
        self.metrics.ready.set(0)

    def _step(self, step: str, seconds: float) -> None:
        self.metrics.steps.labels(step).observe(seconds)

    def guard_for(self, limit: int, live: bool = False) -> ESIGuard:
        """The guard for a token limit (at most the server's), held or live."""
        key = (min(limit, self.max_tokens), live)
        if key not in self._sized:
            update: dict[str, Any] = {"max_new_tokens": key[0]}
            if live:
                update["stream_mode"] = "live"
            self._sized[key] = self.guard.model_copy(update=update)
        return self._sized[key]

    async def _run(self, key: Hashable, prompts: list[Any]) -> Sequence[Any]:
        limit, stop = cast("tuple[int, tuple[str, ...]]", key)
        extra: dict[str, Any] = {"stop": list(stop)} if stop else {}
        started = time.perf_counter()
        try:
            return await self.guard_for(limit).abatch(prompts, return_exceptions=True, **extra)
        finally:
            self._step("guard", time.perf_counter() - started)

    def answer(self, output: Any) -> Answer:
        """A guarded call's output as the wire shows it; a failure as its :class:`ServeError`."""
        if isinstance(output, AIMessage):
            esi = dict(output.response_metadata["esi"])
            info = esi_info(esi)
            finish = esi.get("finish_reason") or "stop"
            if info["decision"] == "abstain":
                finish = ABSTAIN_FINISH_REASON
            elif esi.get("fallback_used"):
                finish = output.response_metadata.get("finish_reason") or "stop"
            usage: dict[str, Any] = dict(output.usage_metadata or {})
            return self._counted(Answer(str(output.content), finish, {
                "prompt_tokens": usage.get("input_tokens", 0),
                "completion_tokens": usage.get("output_tokens", 0),
                "total_tokens": usage.get("total_tokens", 0),
            }, info))  # fmt: skip
        if isinstance(output, ScoringError) and isinstance(output.result, ESIResult):
            return self._counted(self.unscored(output.result))
        raise self.failure(output)

    def unscored(self, result: ESIResult, *, shown: bool = False) -> Answer:
        """An answer that could not be scored, under the guard's ``on_error``.

        ``shown``: a live stream sent it already, so it can only be flagged.
        """
        decision = "flag" if shown or self.policy == "flag" else "abstain"
        info = esi_info({**result.as_dict(), "decision": decision})
        n = len(result.answer_token_ids)
        usage = {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}
        if decision == "abstain":
            return Answer(self.abstain_message, ABSTAIN_FINISH_REASON, usage, info)
        return Answer(result.answer, result.finish_reason or "stop", usage, info)

    @staticmethod
    def noted(answer: Answer, warnings: list[str]) -> Answer:
        """``answer`` with the request's warnings in its ``esi`` (unchanged when none)."""
        if not warnings:
            return answer
        return replace(answer, esi={**answer.esi, "warnings": warnings})

    def _counted(self, answer: Answer) -> Answer:
        self.metrics.decided(answer.esi)
        return answer

    def failure(self, output: Any) -> ServeError:
        """A failure in place of an answer; a fallback's openai error is the upstream's."""
        error = output if isinstance(output, BaseException) else TypeError(type(output).__name__)
        openai = sys.modules.get("openai")
        if openai is not None and isinstance(error, openai.APIError):
            error = APIError(f"the fallback failed: {type(error).__name__}", original=error)
        failure = from_exception(error)
        self.metrics.decisions.labels("error", failure.code or "error").inc()
        return failure

    async def warm_up(self, retry_seconds: float = 2.0) -> None:
        """Ask the model once, until it answers; then the server is ready."""
        while True:
            async with self.batcher.slot():
                (output,) = await self.guard_for(self.max_tokens).abatch(
                    [WARM_UP_PROMPT], return_exceptions=True
                )
            if isinstance(output, (AIMessage, ScoringError)):
                self.ready = not self.draining
                self.metrics.ready.set(int(self.ready))
                log.info("ready: %s answered", self.name)
                return
            log.warning("not ready: the model did not answer (%s)", type(output).__name__)
            await asyncio.sleep(retry_seconds)
