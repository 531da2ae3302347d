"""Helpers: servers on the fake backend, in memory (httpx's ASGI transport) or on loopback."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx

from esi_guard import ESIGuard, FakeBackend
from esi_guard.server import ServeSettings, create_app

QUESTION = "What is the capital of France?"
SHAKY = "Which river flows through the town of Tübingen?"
ANSWERS = {QUESTION: "Paris", SHAKY: "the Danube river"}


def fake_guard(**kwargs: Any) -> ESIGuard:
    """A guard whose SHAKY question scores high (1.5 sensitivity) and QUESTION 0."""
    backend = kwargs.pop("backend", None) or FakeBackend(ANSWERS, sensitivity={SHAKY: 1.5})
    kwargs.setdefault("threshold", 0.3)
    kwargs.setdefault("n_variants", 4)
    return ESIGuard(backend=backend, **kwargs)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@asynccontextmanager
async def client(guard: ESIGuard, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An in-memory client of a started app (its lifespan run; warm-up off unless asked)."""
    settings.setdefault("warm_up", False)
    app = create_app(guard, ServeSettings(**settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://guard") as c:
            c.app = app  # type: ignore[attr-defined]
            yield c


@contextmanager
def served(guard: ESIGuard, **settings: Any) -> Iterator[str]:
    """A real server on a free loopback port in a thread, ready; yields its ``/v1`` base URL."""
    import uvicorn

    app = create_app(guard, ServeSettings(**settings))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and server.servers):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    while app.state.service.settings.warm_up and not app.state.service.ready:
        if time.monotonic() > deadline + 90:  # the warm-up's answer, before the test's requests
            raise RuntimeError("the server did not become ready")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


async def wait_ready(c: httpx.AsyncClient, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while (await c.get("/health")).status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        await asyncio.sleep(0.02)


def process_ready(process: subprocess.Popen[bytes], url: str, seconds: float = 600) -> None:
    """Wait for an ``esi-guard serve`` process's ``/health``; its stderr if it dies or stalls."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(process.stderr.read().decode() if process.stderr else "")
        time.sleep(0.2)
