"""A fault-injecting HTTP proxy on loopback, in front of a real OpenAI-compatible server.

Each request takes the next fault from ``faults`` (or passes through when none is left):
``"500"``, ``"429"``, ``"400"``, ``"malformed"`` (HTTP 200 with a body that is not JSON),
``"hang"`` (no answer for ``hang_seconds``), ``"drop"`` (the connection closes with no
answer). ``log`` records ``(path, fault)`` for every request, so tests count attempts.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULTS = ("500", "429", "400", "malformed", "hang", "drop")


class FaultProxy:
    def __init__(self, upstream: str, *, hang_seconds: float = 5.0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.hang_seconds = hang_seconds
        self.faults: deque[str | None] = deque()
        self.choose: Callable[[int], str | None] | None = None
        self.log: list[tuple[str, str | None]] = []
        self.on_request: Callable[[int], None] | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def count(self, path_part: str = "") -> int:
        return sum(path_part in path for path, _ in self.log)

    def _next(self, path: str) -> str | None:
        with self._lock:
            index = len(self.log)
            if self.choose is not None:
                fault = self.choose(index)
            else:
                fault = self.faults.popleft() if self.faults else None
            self.log.append((path, fault))
        if self.on_request is not None:
            self.on_request(index)
        return fault

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _reply(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._next(self.path)
                if fault == "500":
                    return self._reply(500, b'{"error": {"message": "injected 500"}}')
                if fault == "429":
                    return self._reply(
                        429, b'{"error": {"message": "injected 429"}}', {"Retry-After": "0"}
                    )
                if fault == "400":
                    return self._reply(400, b'{"error": {"message": "injected 400"}}')
                if fault == "malformed":
                    return self._reply(200, b'{"choices": [{"text": "trunc')
                if fault == "hang":
                    time.sleep(proxy.hang_seconds)
                    self.close_connection = True
                    return None
                if fault == "drop":
                    self.close_connection = True
                    return None
                return self._forward(body)

            def _forward(self, body: bytes) -> None:
                host, port = proxy.upstream
                conn = http.client.HTTPConnection(host, port, timeout=600)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host",)}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                except OSError:
                    self.close_connection = True  # upstream gone: drop, as a dead server would
                    return
                finally:
                    conn.close()
                self._reply(response.status, data)

            do_GET = _handle
            do_POST = _handle

        return Handler
