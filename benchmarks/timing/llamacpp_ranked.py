r"""The llama.cpp server's echo logprobs ranked by numpy against llama-cpp-python's own ranking.

    python -m benchmarks.timing llamacpp-ranked --requests 12 --rounds 3

Two ``LlamaServer``\ s on the embedded model, one thread each: one through
``integrations/llamacpp/ranked.py`` (the launcher's default), one as
``python -m llama_cpp.server`` runs (``ranked=False``). Each round sends the same echo
requests (``--requests`` SciQ questions in ChatML with a short answer after them,
``logprobs=20``, 8 tokens generated: what the API backend's echo mode asks) to one server,
then to the other. Reported: the median over rounds of each server's seconds for all the
requests, their ratio, and whether every response's text and logprobs are the same JSON,
byte for byte.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from typing import Any

from benchmarks.shared_data import shared_data
from integrations.llamacpp.server import LlamaServer

__all__ = ["add_arguments", "measure"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)


def _bodies(n: int) -> list[dict[str, Any]]:
    with (shared_data() / "sciq" / "test.jsonl").open(encoding="utf-8") as handle:
        questions = [json.loads(line)["query"] for line, _ in zip(handle, range(n), strict=False)]
    return [
        {
            "prompt": f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\nThe answer is",
            "max_tokens": 8, "echo": True, "logprobs": 20, "temperature": 0,
        }
        for q in questions
    ]  # fmt: skip


def _post(server: LlamaServer, body: dict[str, Any]) -> str:
    request = urllib.request.Request(
        f"{server.base_url}/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=600) as reply:
        choice = json.loads(reply.read())["choices"][0]
    return json.dumps({"text": choice["text"], "logprobs": choice["logprobs"]})


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time both servers on the same requests, round after round; print and return it."""
    bodies = _bodies(args.requests)
    seconds: dict[str, list[float]] = {"plain": [], "ranked": []}
    answers: dict[str, list[str]] = {}
    with (
        LlamaServer.start(n_threads=1, ranked=False) as plain,
        LlamaServer.start(n_threads=1) as ranked,
    ):
        servers = {"plain": plain, "ranked": ranked}
        for server in servers.values():
            _post(server, bodies[0])  # warm
        for _ in range(args.rounds):
            for name, server in servers.items():
                start = time.perf_counter()
                answers[name] = [_post(server, body) for body in bodies]
                seconds[name].append(time.perf_counter() - start)
    record = {
        "requests": len(bodies),
        "rounds": args.rounds,
        "plain_s": statistics.median(seconds["plain"]),
        "ranked_s": statistics.median(seconds["ranked"]),
        "identical": answers["plain"] == answers["ranked"],
    }
    record["ratio"] = record["plain_s"] / record["ranked_s"]
    print(
        f"{record['requests']} echo requests, median of {args.rounds} rounds: llama-cpp-python's"
        f" ranking {record['plain_s']:.2f} s, numpy's {record['ranked_s']:.2f} s"
        f" ({record['ratio']:.1f}x); the same JSON: {record['identical']}"
    )
    return record
