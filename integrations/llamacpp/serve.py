"""Run llama-cpp-python's OpenAI-compatible server on loopback with the embedded GGUF.

    .venv/bin/python integrations/llamacpp/serve.py            # http://127.0.0.1:8000/v1
    .venv/bin/python integrations/llamacpp/serve.py --port 0   # a free port, printed first

The first stdout line is ``ESI_GUARD_SERVER_URL=<base_url> MODEL=<model>``; then this
process *becomes* the server (``exec``), so stopping it stops the server. The model name
the server reports is the GGUF's absolute path, which lets ``OpenAIBackend`` read the chat
template from the file:

    OpenAIBackend(model=<model>, base_url=<base_url>, mode="echo")

From Python, ``integrations.llamacpp.server.LlamaServer.start()`` starts the same server in the
background and waits until it answers. Needs ``pip install 'llama-cpp-python[server]'``
(part of the project's test set-up).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from server import embedded_gguf, free_port, server_command  # beside this script


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
