r"""``esi-guard serve`` under load: micro-batching's throughput ratio, p99, and a soak run.

    python -m benchmarks.timing server throughput --backend embedded --requests 256 --clients 32
    python -m benchmarks.timing server throughput --backend transformers --requests 256 --clients 32
    python -m benchmarks.timing server soak --backend fake --requests 10000 --clients 32
    python -m benchmarks.timing server soak --backend embedded --requests 500 --clients 32
    python -m benchmarks.timing server soak --backend proxy --requests 300 --clients 16 \
        --n-variants 4

Each run starts the server in a subprocess of its own (``server`` below: the app
``esi-guard serve`` runs, on the fake backend, or the embedded model through llama.cpp or,
``--backend transformers``, through transformers, which generates a batch's answers together) on a
free loopback port, and sends guarded requests from ``--clients`` concurrent HTTP clients.
``--backend proxy`` is proxy mode: the guard on an ``OpenAIBackend`` whose upstream is the
real llama.cpp server (llama-cpp-python, the embedded GGUF) behind the fault-injecting
proxy of the load test (``integrations/faultproxy.py``), which answers ``--fault-rate``
of the upstream HTTP requests with a 500, a 429, a 400, a malformed body, a hang past the
timeout or a dropped connection (seeded).

* **throughput**: the same requests to a server with micro-batching on
  (``--max-batch``) and off (``--max-batch 1``), one after the other: requests per second,
  p50 and p99 latency of each, and the ratio on/off.
* **soak**: ``--requests`` requests, each with its own question whose answer is known:
  lost (no answer), duplicated or crossed (an answer that is not its question's), unmarked
  (no ``esi``, or no ``X-ESI-*`` headers), errors, and the server's resident memory at the
  2,000th request (or a fifth of the run, if shorter) and at the last; growth must stay
  within 5%. In proxy mode, also: every answer that is not a 200 must be an OpenAI-shaped
  error (``{"error": {"message", "type", ...}}``; ``unshaped`` counts the others), and
  every 200 carries ``esi``, scored or failed closed (``scored: false`` with a reason).

Ends with one ``serve:`` line of figures; exits 1 when a soak loses, crosses or leaves
unmarked any request, or grows by more than 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from esi_guard import ESIGuard, FakeBackend, HFBackend, LlamaCppBackend, OpenAIBackend
from esi_guard.server import ServeSettings, create_app, run
from integrations.llamacpp.server import free_port

__all__ = ["add_arguments", "measure"]

ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root, where the server subprocess runs ``-m benchmarks.timing server run``."""
SYSTEM = "Answer in a few words."
PROXY_TIMEOUT = 20.0
"""Seconds per upstream HTTP attempt in proxy mode (a ``hang`` fault outlasts it)."""
TOPICS = ["France", "Japan", "Brazil", "Kenya", "Canada", "Norway", "Egypt", "Peru"]


def question(i: int) -> str:
    """The i-th question: distinct, each with a word of four letters or more to intervene on."""
    return f"What is the capital city of {TOPICS[i % len(TOPICS)]}, question number {i}?"


def fake_answer(i: int) -> str:
    """The fake backend's answer to the i-th question."""
    return f"answer number {i}"


# -- the server ------------------------------------------------------------------------------


def serve(
    backend: str, port: int, max_batch: int, n_variants: int, requests: int, upstream: str = ""
) -> None:
    """Run the server in this process until SIGTERM."""
    if backend == "fake":
        answers = {question(i): fake_answer(i) for i in range(requests)}
        engine: Any = FakeBackend(answers, default_sensitivity=0.5)
    elif backend == "proxy":
        from integrations.llamacpp.server import CHATML

        base_url, model = upstream.split(" ", 1)
        engine = OpenAIBackend(model, base_url=base_url, mode="chat", chat_template=CHATML,
                               timeout=PROXY_TIMEOUT, max_retries=4, retry_wait=0.2,
                               retry_max_wait=2.0, max_concurrency=4)  # fmt: skip
    elif backend == "transformers":
        engine = HFBackend.default()
    else:  # llama.cpp ignores OMP_NUM_THREADS: one thread when it says one, as torch does
        threads = int(os.environ.get("OMP_NUM_THREADS", 0)) or None
        engine = LlamaCppBackend.default(n_threads=threads)
    guard = ESIGuard(backend=engine, threshold=0.3, n_variants=n_variants, max_new_tokens=16)
    settings = ServeSettings(model_name="guarded", max_batch=max_batch, max_queue=4096)
    run(create_app(guard, settings), port=port, drain_seconds=5)


class Server:
    """The server subprocess."""

    def __init__(
        self, backend: str, max_batch: int, n_variants: int, requests: int, upstream: str = ""
    ) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "benchmarks.timing", "server", "run",
                   "--backend", backend,
                   "--port", str(self.port), "--max-batch", str(max_batch),
                   "--n-variants", str(n_variants), "--requests", str(requests),
                   "--upstream", upstream]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                msg = "the server did not become ready"
                raise RuntimeError(msg)
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(30)

    def rss_kib(self) -> int:
        """The server's resident memory, from /proc."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0


# -- the clients -----------------------------------------------------------------------------


async def load(url: str, indices: list[int], clients: int, rss: Any = None) -> dict[str, Any]:
    """Send a request per index from ``clients`` concurrent clients; what came back."""
    pending = list(reversed(indices))
    results: dict[int, dict[str, Any]] = {}
    latencies: list[float] = []
    seen: list[int] = []
    memory: dict[str, int] = {}
    mark = min(2000, max(len(indices) // 5, 1))

    async def client(c: httpx.AsyncClient) -> None:
        while pending:
            i = pending.pop()
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": question(i)}]  # fmt: skip
            body = {"model": "guarded", "messages": messages}
            started = time.perf_counter()
            try:
                r = await c.post("/v1/chat/completions", json=body)
                results.setdefault(i, {"status": r.status_code, "body": r.json(),
                                       "headers": dict(r.headers), "count": 0})  # fmt: skip
                results[i]["count"] += 1
            except (httpx.TransportError, ValueError) as exc:
                results.setdefault(i, {"status": None, "error": repr(exc), "count": 1})
            latencies.append(time.perf_counter() - started)
            seen.append(i)
            if rss is not None and len(seen) == mark:
                memory["at_mark"] = rss()
        return None

    limits = httpx.Limits(max_connections=clients)
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        await asyncio.gather(*(client(c) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    if rss is not None:
        memory["at_end"] = rss()
    latencies.sort()
    return {"results": results, "seconds": elapsed, "rps": len(indices) / elapsed,
            "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "memory": memory, "mark": mark}  # fmt: skip


# -- the runs --------------------------------------------------------------------------------


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Micro-batching on, then off, on the same requests; the ratio of their throughputs."""
    indices = list(range(args.requests))
    out = {}
    for name, max_batch in (("on", args.max_batch), ("off", 1)):
        with Server(args.backend, max_batch, args.n_variants, args.requests) as server:
            asyncio.run(load(server.url, indices[: min(8, len(indices))], 8))  # warm
            run_ = asyncio.run(load(server.url, indices, args.clients))
        out[name] = {k: run_[k] for k in ("rps", "p50", "p99", "seconds")}
        print(f"batching {name}: {run_['rps']:.2f} req/s, p50 {run_['p50'] * 1000:.0f} ms, "
              f"p99 {run_['p99'] * 1000:.0f} ms ({args.requests} requests, "
              f"{args.clients} clients)")  # fmt: skip
    ratio = out["on"]["rps"] / out["off"]["rps"]
    print(f"serve: backend={args.backend} clients={args.clients} requests={args.requests} "
          f"ratio_on_off={ratio:.2f} p99_on_ms={out['on']['p99'] * 1000:.0f} "
          f"p99_off_ms={out['off']['p99'] * 1000:.0f}")  # fmt: skip
    return {**out, "ratio": ratio}


def soak(args: argparse.Namespace) -> int:
    """Every request answered once, with its own answer and marked; memory growth."""
    indices = list(range(args.requests))
    upstream = None
    if args.backend == "proxy":
        upstream = Upstream(args.fault_rate, args.seed)
    try:
        with Server(args.backend, args.max_batch, args.n_variants, args.requests,
                    upstream.address if upstream else "") as server:  # fmt: skip
            done = asyncio.run(load(server.url, indices, args.clients, rss=server.rss_kib))
    finally:
        if upstream is not None:
            upstream.stop()
    results = done["results"]
    lost = [i for i in indices if i not in results or results[i]["status"] is None]
    duplicated = [i for i, r in results.items() if r["count"] != 1]
    errors = [i for i, r in results.items() if r["status"] not in (None, 200)]
    unmarked, crossed = [], []
    for i, r in results.items():
        if r["status"] != 200:
            continue
        body, headers = r["body"], {k.lower(): v for k, v in r["headers"].items()}
        if "esi" not in body or "x-esi-decision" not in headers or "x-esi-score" not in headers:
            unmarked.append(i)
        content = body["choices"][0]["message"]["content"]
        if (
            args.backend == "fake"
            and body["esi"]["decision"] != "abstain"
            and (content != fake_answer(i))
        ):
            crossed.append(i)
    unshaped = [i for i in errors if not _openai_error(results[i]["body"])]
    answered = [r["body"] for r in results.values() if r["status"] == 200]
    failed_closed = [b for b in answered if not b.get("esi", {}).get("scored", True)]
    statuses = sorted({str(results[i]["status"]) for i in errors})
    memory = done["memory"]
    growth = memory["at_end"] / max(memory.get("at_mark", 1), 1) - 1
    print(f"serve: soak backend={args.backend} requests={args.requests} clients={args.clients} "
          f"lost={len(lost)} duplicated={len(duplicated)} crossed={len(crossed)} "
          f"unmarked={len(unmarked)} errors={len(errors)} ({','.join(statuses) or '-'}) "
          f"unshaped={len(unshaped)} failed_closed={len(failed_closed)} "
          f"faults={upstream.faults() if upstream else 0} rps={done['rps']:.1f} "
          f"p99_ms={done['p99'] * 1000:.0f} rss_mark_kib={memory.get('at_mark')} "
          f"rss_end_kib={memory['at_end']} rss_growth={growth:+.1%} "
          f"(from request {done['mark']})")  # fmt: skip
    bad = lost or duplicated or crossed or unmarked or unshaped or growth > 0.05
    return 1 if bad else 0


def _openai_error(body: Any) -> bool:
    """An OpenAI-shaped error body: ``{"error": {"message": str, "type": str, ...}}``."""
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


class Upstream:
    """Proxy mode's upstream: the real llama.cpp server behind the fault-injecting proxy."""

    def __init__(self, fault_rate: float, seed: int) -> None:
        import random

        from integrations.faultproxy import FAULTS, FaultProxy
        from integrations.llamacpp.server import LlamaServer

        self.server = LlamaServer.start(n_threads=1)
        self.proxy = FaultProxy(self.server.base_url, hang_seconds=PROXY_TIMEOUT + 1).start()
        rng = random.Random(seed)
        self.proxy.choose = lambda _: rng.choice(FAULTS) if rng.random() < fault_rate else None
        self.address = f"{self.proxy.base_url} {self.server.model}"

    def faults(self) -> int:
        """Upstream requests answered with a fault so far."""
        return sum(fault is not None for _, fault in self.proxy.log)

    def stop(self) -> None:
        """Stop the proxy and the server."""
        self.proxy.stop()
        self.server.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("what", choices=["throughput", "soak", "run"])
    parser.add_argument("--backend", choices=["fake", "embedded", "transformers", "proxy"],
                        default="fake")  # fmt: skip
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--n-variants", type=int, default=10)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fault-rate", type=float, default=0.08, help="proxy: of upstream calls")
    parser.add_argument("--seed", type=int, default=0, help="proxy: the faults' seed")
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)


def measure(args: argparse.Namespace) -> dict[str, Any] | None:
    """``run``: serve until SIGTERM; ``throughput``: its figures; ``soak``: exit 1 if bad."""
    if args.what == "run":
        serve(args.backend, args.port, args.max_batch, args.n_variants, args.requests,
              args.upstream)  # fmt: skip
        return None
    if args.what == "throughput":
        return throughput(args)
    if soak(args):
        sys.exit(1)
    return None
