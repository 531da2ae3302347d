"""A local llama.cpp OpenAI-compatible server (llama-cpp-python), for the API backend.

``LlamaServer`` starts ``python -m llama_cpp.server`` on loopback with ``--logits_all true``
(what makes echo logprobs possible; through ``ranked.py``, which ranks its logprobs with
numpy: the same ones, faster), waits until it answers, and stops it again::

    from integrations.llamacpp.server import LlamaServer

    with LlamaServer.start() as server:          # the embedded SmolLM2 GGUF, a free port
        backend = server.backend(mode="echo")     # an OpenAIBackend on it
        ...

The model name the server reports is the GGUF's absolute path, so ``OpenAIBackend`` reads
the chat template from the file. Needs ``pip install 'llama-cpp-python[server]'`` (part of the
project's test set-up). From the checkout's root, ``python -m integrations.llamacpp.server``
runs the same server in the foreground::

    python -m integrations.llamacpp.server            # http://127.0.0.1:8000/v1
    python -m integrations.llamacpp.server --port 0   # a free port, printed first

Its first stdout line is ``ESI_GUARD_SERVER_URL=<base_url> MODEL=<model>``; then the process
*becomes* the server (``exec``), so stopping it stops the server.

This launcher is for the project's tests, examples and benchmarks (and for trying the API
backend locally), so it lives beside the library, not in the wheel: import it from a
checkout, with the checkout's root on ``sys.path``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from esi_guard.backends import embedded_gguf
from esi_guard.exceptions import BackendError

if TYPE_CHECKING:
    from esi_guard.backends.openai import OpenAIBackend

__all__ = ["CHATML", "LlamaServer", "embedded_gguf", "free_port", "main", "server_command"]

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)
"""SmolLM2's ChatML template without its default system prompt, for an ``OpenAIBackend``
on the embedded model's server: shorter prompts (llama.cpp's echo cost grows with every
prompt token)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_command(
    model: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    n_ctx: int = 2048,
    n_threads: int | None = None,
    ranked: bool = True,
) -> list[str]:
    """The ``llama_cpp.server`` command line serving ``model`` with logprobs for every token.

    It runs through :mod:`integrations.llamacpp.ranked`, which ranks the logprobs with
    numpy (llama-cpp-python ranks the vocabulary in Python for every token it reports);
    ``ranked=False``: ``python -m llama_cpp.server`` as it is.
    """
    launcher = (
        [str(Path(__file__).with_name("ranked.py"))] if ranked else ["-m", "llama_cpp.server"]
    )
    command = [
        sys.executable, *launcher,
        "--model", str(model),
        "--host", host,
        "--port", str(port),
        "--n_ctx", str(n_ctx),
        "--logits_all", "true",
    ]  # fmt: skip
    if n_threads:
        command += ["--n_threads", str(n_threads)]
    return command


class LlamaServer:
    """A llama.cpp server process of our own; a context manager that stops it on exit."""

    def __init__(
        self, process: subprocess.Popen[bytes], base_url: str, model: str, log: IO[bytes]
    ) -> None:
        self.process = process
        self._log = log
        self.base_url = base_url
        """The OpenAI base URL, ``http://host:port/v1``."""
        self.model = model
        """The model name the server answers to (the GGUF's absolute path)."""

    @classmethod
    def start(
        cls,
        model: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        timeout: float = 180.0,
        ranked: bool = True,
    ) -> LlamaServer:
        """Start a server on ``model`` (default: the embedded GGUF) and wait until it answers.

        ``port=0`` picks a free port; ``ranked=False`` serves without
        :mod:`integrations.llamacpp.ranked` (llama-cpp-python's own ranking of logprobs).
        Raises ``BackendError`` (with the server's last output) if it exits or does not
        answer within ``timeout`` seconds.
        """
        path = Path(model).resolve() if model is not None else embedded_gguf().resolve()
        if not path.is_file():
            msg = f"no GGUF model file at {path}"
            raise BackendError(msg)
        port = port or free_port(host)
        command = server_command(
            path, host=host, port=port, n_ctx=n_ctx, n_threads=n_threads, ranked=ranked
        )
        # The server logs every request: to a file, since a pipe nobody reads would fill up
        # and stall it.
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        server = cls(process, f"http://{host}:{port}/v1", str(path), log)
        server._wait(timeout)
        return server

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                msg = f"the llama.cpp server exited with {self.process.returncode}: {self._tail()}"
                self.stop()
                raise BackendError(msg)
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        msg = f"the llama.cpp server did not answer within {timeout:g}s: {self._tail()}"
        self.stop()
        raise BackendError(msg)

    def _tail(self) -> str:
        """The last lines the server has written."""
        if self._log.closed:
            return "(log closed)"
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:]) or "(no output)"

    def backend(self, **kwargs: Any) -> OpenAIBackend:
        """An ``OpenAIBackend`` on this server; keyword arguments go to its constructor."""
        from esi_guard.backends.openai import OpenAIBackend

        return OpenAIBackend(self.model, base_url=self.base_url, **kwargs)

    def stop(self) -> None:
        """Terminate the server (kill it if it does not stop within 15 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LlamaServer(base_url={self.base_url!r}, model={self.model!r})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Run llama.cpp's OpenAI-compatible server on loopback."
    )
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the embedded one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--n-threads", type=int, default=None)
    args = parser.parse_args(argv)

    model = (args.model or embedded_gguf()).resolve()
    port = args.port or free_port(args.host)
    command = server_command(
        model, host=args.host, port=port, n_ctx=args.n_ctx, n_threads=args.n_threads
    )
    print(f"ESI_GUARD_SERVER_URL=http://{args.host}:{port}/v1 MODEL={model}", flush=True)
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
