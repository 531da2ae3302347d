"""A Ray that ``esi-guard serve --ray`` starts is reachable from this machine only.

``run_on_ray`` as the CLI calls it (no address: a local Ray), the fake backend in one
replica; while it serves, every TCP socket listening and every UDP socket bound by the
processes it started (this one's new ones included) is listed: each is on loopback but
the one Ray Serve gives no way to move, a replica's inter-deployment gRPC server on
``[::]`` (docs/ray.md). Then the shutdown: no Ray process left, nothing in colour, no
``graceful_shutdown failed`` in what Ray relays.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

# Side by side (pytest -n), one local Ray at a time: every Ray test and docs/ray.md on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.xdist_group("ray"),
]

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from esi_guard.ray import run_on_ray  # noqa: E402
from esi_guard.ray._cluster import is_loopback  # noqa: E402
from esi_guard.server import ServeSettings  # noqa: E402
from integrations.llamacpp.server import free_port  # noqa: E402
from tests.unit.server.servers import fake_guard  # noqa: E402

RAY_PROCESSES = ("gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
                 "ray::ServeController", "ray::ProxyActor", "ray::ServeReplica")  # fmt: skip
"""Processes the list must hold (a check that found none would pass)."""


class Listening(NamedTuple):
    host: str
    port: int
    kind: str
    process: str

    def __str__(self) -> str:
        return f"{self.kind} {self.host}:{self.port}  {self.process}"


def _listening(processes: list[Any]) -> set[Listening]:
    """Listening TCP and bound UDP sockets of ``processes`` (those gone are skipped)."""
    found = set()
    for process in processes:
        try:
            name = _name(process.cmdline())
            sockets = process.net_connections("inet")
        except psutil.Error:
            continue
        for s in sockets:
            tcp = s.type == socket.SOCK_STREAM
            if (s.status == psutil.CONN_LISTEN) if tcp else not s.raddr:
                found.add(Listening(s.laddr.ip, s.laddr.port, "tcp" if tcp else "udp", name))
    return found


def _name(command: list[str]) -> str:
    """``gcs_server``, ``ray::ProxyActor``, or a Python process's script (``monitor.py``)."""
    words = [Path(word).name for word in command if word and not word.startswith("-")]
    if len(words) > 1 and words[0].startswith("python"):
        words = words[1:]
    return words[0] if words else "?"


def _ready(port: int, stop: threading.Event, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"esi-guard on Ray Serve never answered /health on port {port}")


def test_a_ray_started_by_serve_listens_on_loopback_and_stops_quietly(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_COLOR_PREFIX", "")  # so that the next line's absence is restored
    monkeypatch.delenv("RAY_COLOR_PREFIX")
    me = psutil.Process()
    before, port, stop = _listening([me]), free_port(), threading.Event()
    older = set(me.children(recursive=True))  # a session's server of this worker, say
    seen: list[set[Listening]] = []
    started: list[Any] = []

    def look() -> None:
        try:
            _ready(port, stop)
            started.extend(set(me.children(recursive=True)) - older)
            seen.append(_listening([me, *started]) - before)
        finally:
            stop.set()

    watcher = threading.Thread(target=look)
    watcher.start()
    try:
        run_on_ray(fake_guard, ServeSettings(warm_up=False), port=port, replica_cpus=0,
                   stop=stop)  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    (listening,) = seen
    shown = "\n".join(sorted(map(str, listening)))
    missing = [p for p in RAY_PROCESSES if not any(s.process.startswith(p) for s in listening)]
    assert missing == [], shown
    exposed = {s for s in listening if not is_loopback(s.host)}
    replica_grpc = {s for s in exposed if s.process.startswith("ray::ServeReplica")
                    and s.kind == "tcp" and s.host in ("::", "0.0.0.0")}  # fmt: skip
    assert exposed == replica_grpc, f"not on loopback:\n{shown}"
    assert len(replica_grpc) <= 2, shown  # the front's and the guard's replica, one each
    assert ("127.0.0.1", port) in {(s.host, s.port) for s in listening}, shown  # Serve's proxy
    assert not any(s.port == 8265 for s in listening), shown  # no dashboard

    assert not ray.is_initialized()
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [], alive
    relayed = capfd.readouterr().err
    assert "\x1b[" not in relayed and "graceful_shutdown" not in relayed, relayed[-3000:]
