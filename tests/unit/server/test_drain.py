"""SIGTERM: the server drains (``/health`` a 503, new requests refused), then exits."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from integrations.llamacpp.server import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
QUESTION = "What is the capital of France?"


def start(seconds: float, drain: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.server.slow_server", "--port", str(port),
         "--seconds", str(seconds), "--drain-seconds", str(drain)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/health/live", timeout=1)
            return process, url
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(
                    process.stderr.read().decode() if process.stderr else ""
                ) from None
            time.sleep(0.1)


def ask(url: str, out: dict[str, Any]) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": QUESTION}]}
    try:
        out["response"] = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    except httpx.TransportError as exc:
        out["error"] = exc


@pytest.mark.parametrize(("drain", "finished"), [(10, True), (1, False)])
def test_sigterm_drains_in_flight_requests_within_drain_seconds(drain: int, finished: bool) -> None:
    process, url = start(seconds=3.0, drain=drain)
    with process:
        waited, out, draining = terminated(process, url)
        log = process.stderr.read().decode() if process.stderr else ""
    health, refused, live = draining  # while the request was in flight
    assert health.status_code == 503 and health.json()["draining"] is True
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
    assert live.status_code == 200
    with pytest.raises(httpx.TransportError):  # gone once drained
        httpx.get(f"{url}/health/live", timeout=1)
    if finished:
        assert out["response"].status_code == 200, out
        assert out["response"].json()["choices"][0]["message"]["content"] == "Paris"
        assert waited < 5  # the answer's 3 s, not the 10 s allowed
    else:  # cut at the drain limit, well before the answer's 3 s
        assert "response" not in out or out["response"].status_code >= 500
        assert waited < 2.5
    assert "serving model 'fake' on engine fake: threshold 0.3" in log  # logged, at INFO
    assert "draining: 1 requests in flight" in log


def terminated(
    process: subprocess.Popen[bytes], url: str
) -> tuple[float, dict[str, Any], tuple[httpx.Response, ...]]:
    """SIGTERM while a request is in flight: seconds until the process ended, the request's
    end, and ``/health``, a new chat request and ``/health/live`` while it drained."""
    out: dict[str, Any] = {}
    asking = threading.Thread(target=ask, args=(url, out))
    asking.start()
    time.sleep(1.0)  # the request is in flight
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    body = {"model": "fake", "messages": [{"role": "user", "content": QUESTION}]}
    draining = (
        httpx.get(f"{url}/health", timeout=1),
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1),
        httpx.get(f"{url}/health/live", timeout=1),
    )
    # uvicorn re-raises the signal once it has shut down, as a process killed by it would end.
    assert process.wait(30) in (0, -signal.SIGTERM)
    waited = time.monotonic() - sent
    asking.join(30)
    return waited, out, draining
