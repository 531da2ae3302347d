"""The guard on Ray Serve: ``esi-guard serve``'s endpoint in front, one guard per replica.

:func:`guard_app` makes two deployments: ``ESIGuardFront`` (one replica, no CPU) serves
:func:`esi_guard.server.app.serving_app` and hands each request to an ``ESIGuard`` replica, one
guard per process, whose micro-batcher makes the requests routed to it at once one batched call.
A replica whose engine cannot answer fails Ray's health check and is replaced; one that dies turns
its requests in flight into an OpenAI-shaped 503 ``replica_unavailable`` with ``Retry-After``,
never a 200 without a decision (a live stream past its first token gets it as an event).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from esi_guard._imports import import_extra
from esi_guard.exceptions import reason
from esi_guard.ray._cluster import connect
from esi_guard.result import ESIResult
from esi_guard.server._errors import ServeError, from_exception, overloaded, replica_unavailable
from esi_guard.server._metrics import Metrics
from esi_guard.server._schema import ChatRequest
from esi_guard.server._service import GONE, Answer, Gone, Service, wait
from esi_guard.server._settings import ServeSettings
from esi_guard.server._stream import sse
from esi_guard.server.app import serving_app

if TYPE_CHECKING:
    from esi_guard.guard import ESIGuard

ray = import_extra("ray", needed_by="esi_guard.ray", what="Ray Serve", extra="ray")
serve = import_extra("ray.serve", needed_by="esi_guard.ray", what="Ray Serve", extra="ray")
serve_errors = import_extra("ray.serve.exceptions", needed_by="esi_guard.ray", what="Ray Serve",
                            extra="ray")  # fmt: skip

__all__ = ["GuardAppArgs", "app_builder", "guard_app", "run_on_ray"]

log = logging.getLogger("esi_guard.server")

GuardFactory = Callable[[], "ESIGuard"]
"""Builds the guard in each replica (pickled to it: a function or a bound method)."""

APP_NAME = "esi-guard"
PROBE_PROMPT = "What is the capital of France?"


class GuardReplica:
    """One guard, its micro-batcher and metrics: a replica of the ``ESIGuard`` deployment."""

    async def __init__(  # type: ignore[misc]
        self, guard: GuardFactory, settings: ServeSettings, *, fresh_s: float,
        engine_timeout_s: float, probe_timeout_s: float,
    ) -> None:  # fmt: skip
        self.service = Service(guard(), settings)
        self.fresh_s = fresh_s
        self.engine_timeout_s = engine_timeout_s
        self.probe_timeout_s = probe_timeout_s
        await self.service.start()
        await self.service.warmed()  # takes traffic once the model has answered

    def describe(self) -> dict[str, Any]:
        """What the front needs (served names, token limit, live streams) and the process id."""
        service = self.service
        return {"name": service.name, "names": service.names, "max_tokens": service.max_tokens,
                "live": service.live, "line": service.start_line(),
                "pid": os.getpid()}  # fmt: skip

    async def complete(self, chat: ChatRequest, limit: int) -> Answer | ServeError:
        """The request's answer through this replica's micro-batcher, or its error."""
        try:
            answer = await self.service.complete(chat, limit, _never_gone)
        except ServeError as exc:
            return exc
        assert answer is not None  # never gone: a cancelled request is cancelled here
        return answer

    async def stream(self, chat: ChatRequest, limit: int, notes: list[str]) -> AsyncIterator[str]:
        """A live stream's events."""
        async for event in await self.service.stream(chat, limit, notes):
            yield event

    async def check_health(self) -> None:
        """Raise when the engine cannot answer (Ray then replaces this replica).

        Healthy without a probe if the engine answered within ``fresh_s`` or a batched call is
        under ``engine_timeout_s``; else a one-token call must answer within ``probe_timeout_s``.
        """
        service, now = self.service, time.monotonic()
        if not service.ready:
            msg = "not ready: the model has not answered"
            raise RuntimeError(msg)
        if now - service.answered_at < self.fresh_s:
            return
        running = service.running_since
        if running is not None:
            if now - running < self.engine_timeout_s:
                return
            msg = f"a batched call has run {now - running:.0f} s (engine_timeout_s)"
            raise RuntimeError(msg)
        try:
            output = await asyncio.wait_for(self._probe(), timeout=self.probe_timeout_s)
        except TimeoutError:
            if service.running_since is not None:  # a batch took the engine meanwhile
                return
            msg = f"the engine did not answer a probe within {self.probe_timeout_s:g} s"
            raise RuntimeError(msg) from None
        if not isinstance(output, ESIResult):
            msg = f"the engine cannot answer: {reason(output)}"
            raise RuntimeError(msg)

    async def _probe(self) -> Any:
        async with self.service.batcher.slot():
            guard = self.service.guard_for(1)
            (output,) = await guard.aassess([PROBE_PROMPT], failures="return")
        if isinstance(output, ESIResult):
            self.service.answered_at = time.monotonic()
        return output


async def _never_gone() -> bool:
    return False


class RemoteService:
    """The front's side of the routes (:class:`esi_guard.server._service.Served`), via replicas."""

    def __init__(self, replicas: Any, settings: ServeSettings, card: dict[str, Any]) -> None:
        self.replicas = replicas
        self.settings = settings
        self.metrics = Metrics()
        self.name: str = card["name"]
        self.names: tuple[str, ...] = tuple(card["names"])
        self.max_tokens: int = card["max_tokens"]
        self.live: bool = card["live"]
        self._line: str = card["line"]
        self.ready = False
        self.draining = False
        self.in_flight = 0

    def start_line(self) -> str:
        """The replicas' start-up line, as the front serves them."""
        return f"Ray Serve front: {self._line}"

    async def start(self) -> None:
        """Ready at once: the replicas answered before the front was built."""
        log.info("%s", self.start_line())
        self.ready = True
        self.metrics.ready.set(1)

    async def stop(self) -> None:
        """Not ready."""
        self.ready = False
        self.metrics.ready.set(0)

    async def complete(self, chat: ChatRequest, limit: int, gone: Gone) -> Answer | None:
        """A replica's answer; None if the client went away first (the request cancelled)."""
        response = self.replicas.complete.remote(chat, limit)
        output = await wait(asyncio.ensure_future(_awaited(response)), gone)
        if output is GONE:
            response.cancel()
            return None
        if isinstance(output, BaseException):
            raise self.failure(output)
        if isinstance(output, ServeError):
            self.metrics.decisions.labels("error", output.code or "error").inc()
            raise output
        self.metrics.decided(output.esi)
        return output  # type: ignore[no-any-return]

    async def stream(self, chat: ChatRequest, limit: int, notes: list[str]) -> AsyncIterator[str]:
        """A replica's live stream; a failure before its first event as an HTTP error."""
        events = self.replicas.options(stream=True).stream.remote(chat, limit, notes)
        try:
            first = await events.__anext__()
        except Exception as exc:
            raise self.failure(exc) from exc
        return self._relayed(first, events)

    async def _relayed(self, first: str, events: Any) -> AsyncIterator[str]:
        yield first
        try:
            async for event in events:
                yield event
        except Exception as exc:  # after the start, an error can only be an event
            yield sse(self.failure(exc).body())

    def failure(self, exc: BaseException) -> ServeError:
        """What a failed call to a replica becomes (see the module)."""
        retry = self.settings.retry_after
        if isinstance(exc, ServeError):
            failure = exc
        elif isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
            failure = replica_unavailable(retry, type(exc).__name__)
        elif isinstance(exc, serve_errors.BackPressureError):
            failure = overloaded(retry, "every replica's queue is full")
        elif isinstance(exc, ray.exceptions.RayTaskError):
            failure = from_exception(exc.as_instanceof_cause())
        elif isinstance(exc, ray.exceptions.RayError):
            failure = replica_unavailable(retry, type(exc).__name__)
        else:
            failure = from_exception(exc)
        self.metrics.decisions.labels("error", failure.code or "error").inc()
        return failure


async def _awaited(response: Any) -> Any:
    return await response


class GuardFront:
    """The HTTP front: ``esi-guard serve``'s app over :class:`RemoteService`."""

    async def __init__(self, replicas: Any, settings: ServeSettings) -> None:  # type: ignore[misc]
        card = await replicas.describe.remote()
        self.service = RemoteService(replicas, settings, card)

    def __serve_build_asgi_app__(self) -> Any:
        return serving_app(self.service)


def guard_app(
    guard: GuardFactory,
    settings: ServeSettings | None = None,
    *,
    num_replicas: int = 1,
    autoscaling_config: dict[str, Any] | None = None,
    replica_cpus: float = 1.0,
    max_ongoing_requests: int | None = None,
    health_check_period_s: float = 10.0,
    health_check_timeout_s: float = 30.0,
    engine_timeout_s: float = 900.0,
    ray_actor_options: dict[str, Any] | None = None,
) -> Any:
    """The guard as a Ray Serve application (pass it to ``serve.run``).

    Args:
        guard: Builds each replica's guard, e.g. ``lambda: ESIGuard(backend=...)`` or
            :meth:`GuardOptions.build <esi_guard.served.GuardOptions.build>`; its ``on_error``
            must be ``"abstain"`` or ``"flag"``.
        settings: ``esi-guard serve``'s settings: the batcher's per replica, the rest at the front.
        num_replicas: Replicas, one guard each (ignored with ``autoscaling_config``).
        autoscaling_config: Ray Serve's autoscaling (``min_replicas``, ``max_replicas``...).
        replica_cpus: Ray's ``num_cpus`` per replica; give a llama.cpp model as many threads.
        max_ongoing_requests: Requests a replica takes at once (default ``max_batch``); more wait
            in Ray's router, up to ``max_queue`` per replica, then 503 ``server_overloaded``.
        health_check_period_s: Seconds between health checks (none probes an engine fresh from one).
        health_check_timeout_s: Seconds a health check may take (the probe gets half).
        engine_timeout_s: A batched call running longer fails the health check.
        ray_actor_options: More of the replicas' Ray options (``num_gpus``, ``runtime_env``...).
    """
    settings = settings or ServeSettings()
    options = {"num_cpus": replica_cpus, **(ray_actor_options or {})}
    scale: dict[str, Any] = {"num_replicas": num_replicas}
    if autoscaling_config is not None:
        scale = {"num_replicas": "auto", "autoscaling_config": autoscaling_config}
    replicas = serve.deployment(
        GuardReplica, name="ESIGuard", ray_actor_options=options,
        max_ongoing_requests=max_ongoing_requests or settings.max_batch,
        max_queued_requests=settings.max_queue, health_check_period_s=health_check_period_s,
        health_check_timeout_s=health_check_timeout_s, **scale,
    ).bind(guard, settings, fresh_s=health_check_period_s, engine_timeout_s=engine_timeout_s,
           probe_timeout_s=max(1.0, health_check_timeout_s / 2))  # fmt: skip
    front = serve.deployment(
        serve.ingress()(GuardFront), name="ESIGuardFront", ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=100_000,
    )  # fmt: skip
    return front.bind(replicas, settings)


class GuardAppArgs(BaseModel):
    """``app_builder``'s arguments: a Serve config's ``args`` (or ``serve run ... k=v``)."""

    model_config = ConfigDict(extra="forbid")

    guard: dict[str, Any] = Field(default_factory=dict)
    """``esi-guard serve``'s guard flags (:class:`~esi_guard.served.GuardOptions`): ``model``..."""
    server: dict[str, Any] = Field(default_factory=dict)
    """The server's settings (:class:`~esi_guard.server.ServeSettings`): ``api_key``..."""
    num_replicas: int = 1
    """Replicas, one guard each (the autoscaling minimum with ``max_replicas``)."""
    max_replicas: int | None = None
    """Autoscale from ``num_replicas`` up to this many."""
    replica_cpus: float = 1.0
    """Ray's ``num_cpus`` per replica (a model run in it gets as many threads by default)."""


def app_builder(args: GuardAppArgs) -> Any:
    """The application from a Serve config: ``import_path: esi_guard.ray:app_builder``."""
    from esi_guard.served import GuardOptions

    if isinstance(args, dict):
        args = GuardAppArgs.model_validate(args)
    options = GuardOptions.model_validate(args.guard).on_cpus(args.replica_cpus)
    options.check()
    settings = options.settings(**args.server)
    return guard_app(options.build, settings, **_scale(args.num_replicas, args.max_replicas,
                                                        args.replica_cpus, settings))  # fmt: skip


def _scale(
    replicas: int, max_replicas: int | None, replica_cpus: float, settings: ServeSettings
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"num_replicas": replicas, "replica_cpus": replica_cpus}
    if max_replicas is not None:
        kwargs["autoscaling_config"] = {
            "min_replicas": replicas, "max_replicas": max_replicas,
            "target_ongoing_requests": max(1, settings.max_batch // 2),
        }  # fmt: skip
    return kwargs


def run_on_ray(
    guard: GuardFactory,
    settings: ServeSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    max_replicas: int | None = None,
    replica_cpus: float = 1.0,
    address: str | None = None,
    route_prefix: str = "/",
    stop: threading.Event | None = None,
) -> None:
    """``esi-guard serve --ray``: serve :func:`guard_app` until SIGINT/SIGTERM (or ``stop``).

    Joins the Ray cluster at ``address`` (None: ``RAY_ADDRESS``) or starts a local one on loopback
    (:func:`~esi_guard.ray._cluster.connect`); Serve's proxy listens on ``host:port`` (on a running
    cluster, where its proxy already listens), the app under ``route_prefix``. On stop the
    application is deleted (its replicas drained) and a Ray started here stops; a joined cluster is
    left as it was.
    """
    connected, deployed = connect(address), False
    try:
        serve.start(http_options={"host": host, "port": port})
        app = guard_app(guard, settings, **_scale(replicas, max_replicas, replica_cpus, settings))
        deployed = True  # from here what serve.run deployed is deleted, even half of it
        serve.run(app, name=APP_NAME, route_prefix=route_prefix)
        base = f"http://{host}:{port}{route_prefix.rstrip('/')}/v1"
        log.info("esi-guard on Ray Serve: %s (%d replicas)", base, replicas)
        _until_stopped(stop or threading.Event())
    finally:
        if deployed:
            serve.delete(APP_NAME)
        if connected != "already":
            # Not serve.shutdown(): its controller call never returns by design, and the
            # raylet logs it as "graceful_shutdown failed... infinite retries remaining".
            ray.shutdown()


def _until_stopped(stop: threading.Event) -> None:
    """Return once ``stop`` is set, or on SIGINT/SIGTERM."""
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
