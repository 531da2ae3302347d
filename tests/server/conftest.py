"""A real llama.cpp OpenAI-compatible server (llama-cpp-python) with the embedded model.

Started by ``integrations/llamacpp/serve.py`` on a free loopback port, once per session,
and stopped at the end. Tests here mark themselves ``integration`` and ``server``.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVE = Path(__file__).resolve().parents[2] / "integrations" / "llamacpp" / "serve.py"

# The SmolLM2 template without its default system prompt: shorter prompts, and llama.cpp's
# echo cost grows with every prompt token.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)


@dataclass
class LlamaServer:
    process: subprocess.Popen[str]
    base_url: str
    model: str

    @classmethod
    def start(cls, timeout: float = 180.0) -> LlamaServer:
        process = subprocess.Popen(
            [sys.executable, str(SERVE), "--port", "0", "--n-threads", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert process.stdout is not None
        first = process.stdout.readline().split()
        if not first or not first[0].startswith("ESI_GUARD_SERVER_URL="):
            process.kill()
            pytest.fail(f"serve.py did not announce its URL: {first!r}")
        server = cls(process, first[0].split("=", 1)[1], first[1].split("=", 1)[1])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"llama.cpp server exited with {process.returncode}")
            try:
                with urllib.request.urlopen(f"{server.base_url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        return server
            except OSError:
                time.sleep(0.5)
        server.stop()
        pytest.fail(f"llama.cpp server not ready within {timeout}s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    server = LlamaServer.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_server_2() -> Iterator[LlamaServer]:
    """A second server, so slow echo work can run on both cores."""
    server = LlamaServer.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_server() -> Iterator[LlamaServer]:
    """A server of the test's own, for tests that kill it."""
    server = LlamaServer.start()
    yield server
    server.stop()
