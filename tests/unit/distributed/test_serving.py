"""The Ray Serve front and replica without a cluster: deployment handles faked.

What a replica's death becomes on the wire (a retryable OpenAI-shaped 503, never a 200
without a decision), the front's app over a faked handle, the replica's health check on the
fake backend, and what ``app_builder`` accepts.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import httpx
import pytest

pytest.importorskip("ray.serve")

from ray import exceptions as ray_errors
from ray.serve import exceptions as serve_errors

from esi_guard import FakeBackend
from esi_guard.exceptions import BackendError
from esi_guard.ray.serving import (
    GuardAppArgs,
    GuardReplica,
    RemoteService,
    app_builder,
)
from esi_guard.server import ServeSettings
from esi_guard.server._errors import ServeError
from esi_guard.server.app import serving_app
from tests.unit.server.servers import ANSWERS, QUESTION, SHAKY, fake_guard, user

CHAT = "/v1/chat/completions"


class _Call:
    """A faked deployment handle's method: ``.remote(...)`` gives an awaitable response."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.cancelled = 0

    def remote(self, *args: Any) -> Any:
        call = self

        class Response:
            def __await__(self) -> Any:
                return call.run(*args).__await__()

            def cancel(self) -> None:
                call.cancelled += 1

        return Response()


class _Handle:
    """A deployment handle over one in-process replica, or one that fails as told."""

    def __init__(self, replica: GuardReplica | None = None, error: Exception | None = None):
        self.replica, self.error = replica, error
        self.complete = _Call(self._complete)

    async def _complete(self, chat: Any, limit: int) -> Any:
        if self.error is not None:
            raise self.error
        assert self.replica is not None
        # what crosses the process boundary is pickled
        return pickle.loads(pickle.dumps(await self.replica.complete(chat, limit)))


async def _replica(**guard: Any) -> GuardReplica:
    """A replica as Ray Serve makes one: its async constructor awaited."""
    replica = object.__new__(GuardReplica)
    await GuardReplica.__init__(  # type: ignore[func-returns-value,misc]
        replica, lambda: fake_guard(**guard), ServeSettings(warm_up=True), fresh_s=10.0,
        engine_timeout_s=60.0, probe_timeout_s=5.0,
    )  # fmt: skip
    return replica


def _client(service: RemoteService) -> httpx.AsyncClient:
    app = serving_app(service)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front")


async def _front(handle: _Handle, replica: GuardReplica | None = None) -> RemoteService:
    card = replica.describe() if replica is not None else {
        "name": "fake", "names": ("fake",), "max_tokens": 64, "live": False, "line": "fake",
        "pid": 0,
    }  # fmt: skip
    service = RemoteService(handle, ServeSettings(warm_up=False), card)
    await service.start()
    return service


def test_a_serve_error_crosses_processes_whole() -> None:
    error = ServeError(503, "gone", code="replica_unavailable", kind="server_error",
                       headers={"Retry-After": "1"})  # fmt: skip
    back = pickle.loads(pickle.dumps(error))
    assert (back.status, back.code, back.kind, back.headers) == (503, error.code, error.kind,
                                                                 error.headers)  # fmt: skip
    assert back.body() == error.body()


async def test_the_front_serves_a_replicas_answer_with_its_decision() -> None:
    replica = await _replica()
    async with _client(await _front(_Handle(replica), replica)) as c:
        shaky = await c.post(CHAT, json={"model": "fake", "messages": user(SHAKY)})
        sure = await c.post(CHAT, json={"model": "fake", "messages": user(QUESTION)})
        wrong_model = await c.post(CHAT, json={"model": "other", "messages": user(QUESTION)})
    assert sure.status_code == 200
    assert sure.json()["choices"][0]["message"]["content"] == ANSWERS[QUESTION]
    assert sure.json()["esi"]["decision"] == "accept"
    assert shaky.json()["esi"]["decision"] == "flag"
    assert shaky.headers["X-ESI-Decision"] == "flag"
    assert wrong_model.status_code == 404
    assert wrong_model.json()["error"]["code"] == "model_not_found"
    await replica.service.stop()


@pytest.mark.parametrize(
    "error",
    [ray_errors.ActorDiedError(), ray_errors.ActorUnavailableError("gone", None)],
    ids=["died", "unavailable"],
)
async def test_a_dead_replica_is_a_retryable_openai_shaped_503(error: Exception) -> None:
    async with _client(await _front(_Handle(error=error))) as c:
        r = await c.post(CHAT, json={"model": "fake", "messages": user(QUESTION)})
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "1"
    assert r.headers["X-ESI-Decision"] == "error"
    assert r.json()["error"]["code"] == "replica_unavailable"
    assert r.json()["error"]["type"] == "server_error"
    assert type(error).__name__ in r.json()["error"]["message"]


async def test_full_replica_queues_are_an_overload_503() -> None:
    async with _client(await _front(_Handle(error=serve_errors.BackPressureError(
        num_queued_requests=4, max_queued_requests=4)))) as c:  # fmt: skip
        r = await c.post(CHAT, json={"model": "fake", "messages": user(QUESTION)})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "server_overloaded"


async def test_a_replicas_error_reaches_the_client_as_its_own() -> None:
    replica = await _replica()
    async with _client(await _front(_Handle(replica), replica)) as c:
        r = await c.post(
            CHAT, json={"model": "fake", "messages": [{"role": "system", "content": "x"}]}
        )
    assert r.status_code == 400
    assert r.json()["error"]["param"].startswith("messages")
    await replica.service.stop()


async def test_a_client_gone_cancels_its_replica_call() -> None:
    started = asyncio.Event()

    async def forever(*_: Any) -> Any:
        started.set()
        await asyncio.sleep(60)

    handle = _Handle()
    handle.complete = _Call(forever)
    service = await _front(handle)
    from esi_guard.server._schema import ChatRequest

    chat = ChatRequest.model_validate({"model": "fake", "messages": user(QUESTION)})

    async def gone() -> bool:
        return started.is_set()

    assert await service.complete(chat, 8, gone) is None
    assert handle.complete.cancelled == 1


async def test_the_health_check_passes_while_the_engine_answers() -> None:
    replica = await _replica()
    await replica.check_health()  # answered at warm-up
    replica.service.answered_at = 0.0  # long ago: the probe runs
    await replica.check_health()
    await replica.service.stop()


async def test_the_health_check_fails_when_the_engine_cannot_answer() -> None:
    backend = FakeBackend(ANSWERS)
    replica = await _replica(backend=backend, on_error="abstain")
    backend.error = BackendError("the engine is gone")
    replica.service.answered_at = 0.0
    with pytest.raises(RuntimeError, match="cannot answer"):
        await replica.check_health()
    await replica.service.stop()


async def test_a_batch_running_past_the_engine_timeout_fails_the_health_check() -> None:
    replica = await _replica()
    replica.service.answered_at = 0.0
    replica.service.running_since = 0.0  # started long ago, still running
    with pytest.raises(RuntimeError, match="engine_timeout_s"):
        await replica.check_health()
    await replica.service.stop()


def test_app_builder_refuses_what_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="replicas"):
        GuardAppArgs.model_validate({"replicas": 2})
    with pytest.raises(ValueError, match="no_such_flag"):
        app_builder(GuardAppArgs(guard={"no_such_flag": 1}))
    with pytest.raises(ValueError, match="--upstream and --upstream-model go together"):
        app_builder(GuardAppArgs(guard={"upstream": "http://vllm:8000/v1"}))
