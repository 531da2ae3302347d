r"""The guard on Ray: replicas' throughput, a soak with killed replicas, calibration workers.

    python -m benchmarks.timing ray throughput --requests 128 --clients 16
    python -m benchmarks.timing ray soak --requests 1000 --clients 16 --kill-every 100
    python -m benchmarks.timing ray calibrate --data ../shared/data/sciq/test.jsonl --limit 200

``throughput``: the embedded model served by :func:`esi_guard.ray.guard_app` with 1 replica,
then 2 (one CPU and one llama.cpp thread each), the same requests from the same clients
(after a warm-up round); requests per second, p50/p99 latency, the ratio.

``soak``: 2 replicas; the clients are the openai SDK (``AsyncOpenAI``, its own retries,
``--max-retries``) while one replica is killed with SIGKILL every ``--kill-every``
answered requests. Every request must end answered and marked (``esi`` in the body, a
decision, ``X-ESI-Decision``), once; the 5xx the SDK saw and retried are counted by status
and code, and each kill's recovery (until Serve runs 2 replicas again) is timed.

``calibrate``: ``esi-guard calibrate`` on the same questions in one process with one
thread, in one process with every core's threads, and with ``--workers 2``, each into a
fresh cache; the wall times, their ratios and whether the threshold files are the same
(but for ``created``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from benchmarks.timing.server import SYSTEM, question
from integrations.llamacpp.server import free_port

__all__ = ["add_arguments", "measure"]

APP = "esi-guard"
MODEL = "guarded"


def embedded_guard(n_variants: int = 10, max_new_tokens: int = 16) -> Any:
    """Each replica's guard: the embedded model on one llama.cpp thread."""
    from esi_guard import ESIGuard, LlamaCppBackend

    return ESIGuard(backend=LlamaCppBackend.default(n_threads=1), threshold=0.3,
                    n_variants=n_variants, max_new_tokens=max_new_tokens)  # fmt: skip


class Cluster:
    """A local Ray with Serve's HTTP proxy on a free loopback port."""

    def __init__(self, cpus: int) -> None:
        import ray
        from ray import serve

        ray.init(num_cpus=cpus, include_dashboard=False, logging_level="WARNING")
        self.port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        self.url = f"http://127.0.0.1:{self.port}"

    def deploy(self, replicas: int, max_batch: int, n_variants: int, max_new_tokens: int) -> None:
        """Serve the embedded guard with ``replicas`` replicas (replacing what ran)."""
        from ray import serve

        from esi_guard.ray import guard_app
        from esi_guard.server import ServeSettings

        settings = ServeSettings(model_name=MODEL, max_batch=max_batch, max_queue=4096)
        guard = partial(embedded_guard, n_variants, max_new_tokens)
        serve.run(guard_app(guard, settings, num_replicas=replicas),
                  name=APP, route_prefix="/")  # fmt: skip

    def running(self) -> int:
        """Replicas of the guard deployment Serve runs now."""
        from ray import serve

        app = serve.status().applications.get(APP)
        if app is None or "ESIGuard" not in app.deployments:
            return 0
        return int(app.deployments["ESIGuard"].replica_states.get("RUNNING", 0))

    def pids(self, want: int, tries: int = 50) -> list[int]:
        """The replicas' process ids (asked until ``want`` distinct ones answered)."""
        from ray import serve

        handle = serve.get_deployment_handle("ESIGuard", app_name=APP)
        seen: set[int] = set()
        for _ in range(tries):
            seen.add(handle.describe.remote().result()["pid"])
            if len(seen) >= want:
                break
        return sorted(seen)

    def close(self) -> None:
        """Serve and Ray stopped."""
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()


async def _load(
    url: str, indices: list[int], clients: int, max_retries: int, done: list[int] | None = None
) -> dict[str, Any]:
    """A request per index from ``clients`` openai SDK clients; what each got.

    ``done`` gets each index as its request ends (another thread may watch it).
    """
    from openai import APIError, AsyncOpenAI

    statuses: Counter[str] = Counter()

    async def seen(response: httpx.Response) -> None:
        if response.status_code >= 500:
            await response.aread()
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = "unshaped"
            statuses[f"{response.status_code} {code}"] += 1

    http = httpx.AsyncClient(timeout=600, event_hooks={"response": [seen]},
                             limits=httpx.Limits(max_connections=clients))  # fmt: skip
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", http_client=http,
                         max_retries=max_retries)  # fmt: skip
    pending = list(reversed(indices))
    results: dict[int, list[dict[str, Any]]] = {}
    latencies: list[float] = []
    done = [] if done is None else done

    async def one_client() -> None:
        while pending:
            i = pending.pop()
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": question(i)}]  # fmt: skip
            started = time.perf_counter()
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=messages,  # type: ignore[arg-type]
                )
                body = json.loads(raw.text)
                outcome = {"status": raw.status_code, "body": body,
                           "decision_header": raw.headers.get("x-esi-decision")}  # fmt: skip
            except APIError as exc:
                outcome = {"status": getattr(exc, "status_code", None), "error": repr(exc)}
            results.setdefault(i, []).append(outcome)
            latencies.append(time.perf_counter() - started)
            done.append(i)

    started = time.perf_counter()
    async with http:
        await asyncio.gather(*(one_client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {"results": results, "seconds": elapsed, "rps": len(indices) / elapsed,
            "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "statuses": dict(statuses)}  # fmt: skip


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    """1 replica, then 2, on the same requests; the ratio of their throughputs."""
    cluster = Cluster(cpus=2)
    out: dict[str, Any] = {}
    try:
        for replicas in (1, 2):
            cluster.deploy(replicas, args.max_batch, args.n_variants, args.max_new_tokens)
            asyncio.run(_load(cluster.url, list(range(1000, 1008)), 8, 2))  # warm
            run = asyncio.run(_load(cluster.url, list(range(args.requests)), args.clients, 2))
            out[str(replicas)] = {k: run[k] for k in ("rps", "p50", "p99", "seconds")}
            print(f"{replicas} replica(s): {run['rps']:.2f} req/s, p50 {run['p50'] * 1000:.0f} "
                  f"ms, p99 {run['p99'] * 1000:.0f} ms ({args.requests} requests, "
                  f"{args.clients} clients)", flush=True)  # fmt: skip
    finally:
        cluster.close()
    ratio = out["2"]["rps"] / out["1"]["rps"]
    print(f"ray: throughput requests={args.requests} clients={args.clients} "
          f"n_variants={args.n_variants} max_new_tokens={args.max_new_tokens} "
          f"ratio_2_over_1={ratio:.2f} p50_1_ms={out['1']['p50'] * 1000:.0f} "
          f"p99_1_ms={out['1']['p99'] * 1000:.0f} p50_2_ms={out['2']['p50'] * 1000:.0f} "
          f"p99_2_ms={out['2']['p99'] * 1000:.0f}")  # fmt: skip
    return {**out, "ratio": ratio}


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """2 replicas, a replica SIGKILLed every ``--kill-every`` answers; the contract kept?"""
    cluster = Cluster(cpus=2)
    kills: list[dict[str, float]] = []
    stop = threading.Event()
    try:
        cluster.deploy(2, args.max_batch, args.n_variants, args.max_new_tokens)
        progress: list[int] = []

        def killer() -> None:
            next_kill = args.kill_every
            while not stop.is_set():
                if len(progress) >= next_kill and cluster.running() == 2:
                    pids = cluster.pids(2)
                    victim = pids[len(kills) % len(pids)]
                    killed = time.monotonic()
                    os.kill(victim, signal.SIGKILL)
                    while cluster.running() == 2 and not stop.is_set():  # Serve notices
                        time.sleep(0.05)
                    while cluster.running() < 2 and not stop.is_set():
                        time.sleep(0.1)
                    kills.append({"at": len(progress), "recovered_s": time.monotonic() - killed})
                    next_kill = len(progress) + args.kill_every
                time.sleep(0.1)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()

        done = asyncio.run(_load(cluster.url, list(range(args.requests)), args.clients,
                                 args.max_retries, progress))  # fmt: skip
    finally:
        stop.set()
        cluster.close()
    results = done["results"]
    indices = range(args.requests)
    answered = {i: [o for o in results.get(i, []) if o["status"] == 200] for i in indices}
    lost = [i for i in indices if not answered[i]]
    duplicated = [i for i in indices if len(answered[i]) > 1]
    unmarked = [i for i in indices for o in answered[i]
                if "esi" not in o["body"] or "decision" not in o["body"]["esi"]
                or not o["decision_header"]]  # fmt: skip
    recovered = [k["recovered_s"] for k in kills]
    statuses = ",".join(f"{k}:{v}" for k, v in sorted(done["statuses"].items())) or "-"
    print(f"ray: soak requests={args.requests} clients={args.clients} "
          f"n_variants={args.n_variants} max_new_tokens={args.max_new_tokens} kills={len(kills)} "
          f"lost={len(lost)} duplicated={len(duplicated)} unmarked={len(unmarked)} "
          f"retried_5xx={sum(done['statuses'].values())} ({statuses}) rps={done['rps']:.2f} "
          f"p50_ms={done['p50'] * 1000:.0f} p99_ms={done['p99'] * 1000:.0f} "
          f"recovery_s_median={statistics.median(recovered) if recovered else 0:.1f} "
          f"recovery_s_max={max(recovered, default=0):.1f}")  # fmt: skip
    return {"requests": args.requests, "kills": kills, "lost": lost, "duplicated": duplicated,
            "unmarked": unmarked, "statuses": done["statuses"], "rps": done["rps"],
            "p50": done["p50"], "p99": done["p99"]}  # fmt: skip


def _records(cache: Path) -> dict[int, dict[str, Any]]:
    lines = cache.read_text(encoding="utf-8").splitlines()[1:]
    return {r["index"]: r for r in map(json.loads, lines)}


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """One process (1 thread, every core), then ``--workers 2``; wall times, same file?"""
    cores = os.cpu_count() or 1
    arms = (("one process, 1 thread", ["--threads", "1"]),
            (f"one process, {cores} threads", ["--threads", str(cores)]),
            ("2 Ray workers", ["--workers", "2"]))  # fmt: skip
    out: dict[str, Any] = {}
    files: dict[str, dict[str, Any]] = {}
    records: dict[str, dict[int, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for n, (name, extra) in enumerate(arms):
            path, cache = folder / f"t{n}.json", folder / f"c{n}.jsonl"
            cache.unlink(missing_ok=True)
            command = [sys.executable, "-m", "esi_guard.cli", "calibrate", "--data", args.data,
                       "--limit", str(args.limit), "--select", "coverage", "--resamples", "200",
                       "--cache", str(cache), "--out", str(path), *extra]  # fmt: skip
            started = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            out[name] = time.perf_counter() - started
            files[name] = {k: v for k, v in json.loads(path.read_text()).items() if k != "created"}
            records[name] = _records(cache)
            print(f"{name}: {out[name]:.1f} s", flush=True)
    first = arms[0][0]
    differ = {name: sorted(i for i in records[first] if records[name][i] != records[first][i])
              for name, _ in arms[1:]}  # fmt: skip
    for name, indices in differ.items():
        print(f"{name}: {len(indices)} records differ from {first!r} {indices[:10]}")
    one, every, workers = (out[name] for name, _ in arms)
    same = {name: files[name] == files[first] for name, _ in arms[1:]}
    print(f"ray: calibrate questions={args.limit} one_1thread_s={one:.1f} "
          f"one_allcores_s={every:.1f} workers2_s={workers:.1f} "
          f"ratio_vs_1thread={one / workers:.2f} ratio_vs_allcores={every / workers:.2f} "
          f"same_file_allcores={same[arms[1][0]]} "
          f"same_file_workers={same[arms[2][0]]}")  # fmt: skip
    return {"seconds": out, "same_file": same, "records_differ": differ,
            "ratio_vs_1thread": one / workers, "ratio_vs_allcores": every / workers}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("what", choices=["throughput", "soak", "calibrate"])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--n-variants", type=int, default=10, help="L of the served guard")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="of the served guard")
    parser.add_argument("--kill-every", type=int, default=100, help="soak: answers per kill")
    parser.add_argument("--max-retries", type=int, default=5, help="soak: the SDK's retries")
    parser.add_argument("--data", default="../shared/data/sciq/test.jsonl")
    parser.add_argument("--limit", type=int, default=200, help="calibrate: questions")
    parser.add_argument("--keep", default=None, help="calibrate: keep files and caches here")


def measure(args: argparse.Namespace) -> dict[str, Any] | None:
    """The run ``what`` names; the soak exits 1 when a request was lost, doubled, unmarked."""
    if args.what == "throughput":
        return throughput(args)
    if args.what == "calibrate":
        return calibrate(args)
    record = soak(args)
    if record["lost"] or record["duplicated"] or record["unmarked"]:
        sys.exit(1)
    return record
