"""The FastAPI app: OpenAI's chat-completions endpoint in front of a guard.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health`` (and ``/health/live``,
``/health/ready``), ``GET /metrics``; docs/serve.md says what each answers.
"""

from __future__ import annotations

import copy
import hmac
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from esi_guard.guard import ESIGuard
from esi_guard.guard._templates import LONG_QUESTION
from esi_guard.server._errors import ServeError, from_validation, shutting_down
from esi_guard.server._schema import (
    ChatRequest,
    completion,
    esi_headers,
    warning_headers,
    whole_message_warning,
)
from esi_guard.server._service import Served, Service, noted
from esi_guard.server._settings import ServeSettings
from esi_guard.server._stream import held_events, include_usage

__all__ = ["create_app", "run", "serving_app"]

log = logging.getLogger("esi_guard.server")

_CHAT = "/v1/chat/completions"
_PATHS = (_CHAT, "/v1/models", "/health", "/health/live", "/health/ready", "/metrics")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                Awaitable[None]]  # fmt: skip


def create_app(guard: ESIGuard, settings: ServeSettings | None = None) -> FastAPI:
    """The server's ASGI app around ``guard``; ``esi-guard serve`` runs it with uvicorn.

    A stream is held until its answer is scored, unless the guard only flags (``action`` and
    ``on_error`` ``"flag"``): then tokens go out live, the last chunk with ``esi``. A client gone
    while queued is taken out, a live stream's stops generating; a request in a running batch
    finishes with it. A long whole user message is warned to its caller (``esi.warnings``,
    ``X-ESI-Warning``).

    Raises:
        ConfigurationError: ``guard.on_error="raise"``: a server answers every request.
    """
    return serving_app(Service(guard, settings or ServeSettings()))


def serving_app(service: Served) -> FastAPI:
    """The routes in front of ``service``: :class:`Service`, or Ray's (:mod:`esi_guard.ray`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="esi-guard", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    app.state.service = service
    app.add_exception_handler(ServeError, _serve_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_middleware(_Counted, service=service)

    @app.post(_CHAT)
    async def chat_completions(request: Request) -> Response:
        _check_key(service, request)
        if service.draining:
            raise shutting_down(service.settings.retry_after)
        body = await _body(request, service.settings.max_body_bytes)
        chat = _parse(body)
        if chat.model not in service.names:
            names = " or ".join(repr(name) for name in service.names)
            msg = f"The model {chat.model!r} does not exist: this server serves {names}"
            raise ServeError(404, msg, code="model_not_found", param="model")
        if service.settings.log_prompts:
            log.info("prompt: %s", json.dumps(chat.chat()))
        limit = min(chat.token_limit() or service.max_tokens, service.max_tokens)
        notes = [note for note in (whole_message_warning(chat, LONG_QUESTION),) if note]
        if chat.stream and service.live:
            events = await service.stream(chat, limit, notes)
            headers = {"X-ESI-Score": "pending", "X-ESI-Decision": "pending"}
            headers |= warning_headers(notes)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        answer = await service.complete(chat, limit, request.is_disconnected)
        if answer is None:
            return Response(status_code=499)
        answer = noted(answer, notes)
        if service.settings.log_prompts:
            log.info("answer (%s): %s", answer.esi["decision"], answer.content)
        headers = esi_headers(answer.esi)
        if chat.stream:
            events = held_events(service.name, answer, include_usage(chat))
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        return JSONResponse(completion(service.name, answer.content, answer.finish_reason,
                                       answer.usage, answer.esi), headers=headers)  # fmt: skip

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _check_key(service, request)
        cards = [{"id": name, "object": "model", "created": 0, "owned_by": "esi-guard"}
                 for name in service.names]  # fmt: skip
        return {"object": "list", "data": cards}

    @app.get("/health")
    @app.get("/health/ready")
    async def health() -> JSONResponse:
        body = {"live": True, "ready": service.ready, "draining": service.draining,
                "model": service.name}  # fmt: skip
        return JSONResponse(body, status_code=200 if service.ready else 503)

    @app.get("/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.exposition(), media_type="text/plain; version=0.0.4")

    return app


def run(
    app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, drain_seconds: int = 30
) -> None:
    """Serve ``app`` with uvicorn until SIGINT/SIGTERM, logging ``esi_guard``'s INFO lines.

    On the signal it drains: ``/health`` and new chat requests get a 503 while those in flight
    (streams included) get ``drain_seconds`` to finish; only then does it stop listening, so a
    probe sees the 503, not a refused connection. A second signal ends the drain at once.
    """
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    service: Service = app.state.service

    class _Draining(uvicorn.Server):
        drain_started: float | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            again = self.drain_started is not None
            super().handle_exit(sig, frame)  # records the signal: the process ends by it
            if again:
                self.config.timeout_graceful_shutdown = math.ceil(self._drain_left())
                return
            self.should_exit = False
            self.drain_started = time.monotonic()
            service.drain()
            log.info("draining: %d requests in flight, at most %d s; /health answers 503",
                     service.in_flight, drain_seconds)  # fmt: skip

        def _drain_left(self) -> float:
            started = self.drain_started or time.monotonic()
            return max(0.0, drain_seconds - (time.monotonic() - started))

        async def on_tick(self, counter: int) -> bool:
            if self.drain_started is not None and not self.should_exit:
                left = self._drain_left()
                if service.in_flight == 0 or left == 0:
                    self.config.timeout_graceful_shutdown = math.ceil(left)
                    self.should_exit = True
            return await super().on_tick(counter)

    logging_config = copy.deepcopy(LOGGING_CONFIG)
    logging_config["loggers"]["esi_guard"] = {
        "handlers": ["default"], "level": "INFO", "propagate": False,
    }  # fmt: skip
    config = uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=drain_seconds,
                            log_config=logging_config)  # fmt: skip
    _Draining(config).run()


# -- requests --------------------------------------------------------------------------------


def _check_key(service: Served, request: Request) -> None:
    """Bearer key, compared in constant time; neither key is ever logged."""
    key = service.settings.api_key
    if key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    expected = key.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        msg = "Incorrect API key provided: send Authorization: Bearer <key>"
        raise ServeError(401, msg, code="invalid_api_key")


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_large = ServeError(413, f"request body over {limit} bytes", code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > limit:
            raise too_large
    return bytes(data)


def _parse(body: bytes) -> ChatRequest:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # too deeply nested too
        msg = f"the body is not valid JSON: {exc}"
        raise ServeError(400, msg, code="invalid_json") from exc
    if not isinstance(data, dict):
        msg = f"the body must be a JSON object, got {type(data).__name__}"
        raise ServeError(400, msg, code="invalid_json")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc) from exc


# -- errors and counting ---------------------------------------------------------------------


async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
    headers = {**exc.headers}
    if request.url.path == _CHAT:
        headers.setdefault("X-ESI-Decision", "error")
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    error = ServeError(exc.status_code, str(exc.detail), code=code)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


class _Counted:
    """ASGI middleware: requests by endpoint and status, the in-flight gauge, request seconds."""

    def __init__(self, app: ASGI, service: Served) -> None:
        self.app = app
        self.service = service
        self.metrics = service.metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in _PATHS else "other"
        status = 500
        chat = path == _CHAT

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        if chat:
            self.service.in_flight += 1
            self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(path, str(status)).inc()
            if chat:
                self.service.in_flight -= 1
                self.metrics.in_flight.dec()
                self.metrics.steps.labels("request").observe(time.perf_counter() - started)
