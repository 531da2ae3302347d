"""Start llama-cpp-python's OpenAI-compatible server on loopback with the embedded GGUF.

    .venv/bin/python integrations/llamacpp/serve.py            # http://127.0.0.1:8000/v1
    .venv/bin/python integrations/llamacpp/serve.py --port 0   # a free port, printed first

The first stdout line is ``ESI_GUARD_SERVER_URL=<base_url> MODEL=<model>``; then this
process *becomes* the server (``exec``), so stopping it stops the server. The model name
the server reports is the GGUF's absolute path, which lets ``OpenAIBackend`` read the chat
template from the file:

    OpenAIBackend(model=<model>, base_url=<base_url>, mode="echo")

``--logits_all true`` is what makes echo logprobs possible. Needs the project's test set-up
(``llama-cpp-python[server]``) or ``pip install 'llama-cpp-python[server]'``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def embedded_gguf() -> Path:
    from esi_guard.backends.hf import DEFAULT_GGUF, default_model_dir

    return default_model_dir() / DEFAULT_GGUF


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a .gguf file (default: the embedded one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--n-threads", type=int, default=None)
    args = parser.parse_args(argv)

    model = (args.model or embedded_gguf()).resolve()
    port = args.port or free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model),
        "--host", args.host,
        "--port", str(port),
        "--n_ctx", str(args.n_ctx),
        "--logits_all", "true",
    ]  # fmt: skip
    if args.n_threads:
        command += ["--n_threads", str(args.n_threads)]
    print(f"ESI_GUARD_SERVER_URL=http://{args.host}:{port}/v1 MODEL={model}", flush=True)
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
