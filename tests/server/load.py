"""Guarded requests under faults and load: none lost, none duplicated, every one accounted for.

    python -m tests.server.load --requests 1000 [--batch 10] [--clients 4] [--timeout 20]
        [--in-flight 4] [--variants 2] [--max-new-tokens 4] [--seed 0]

Starts the real llama.cpp server (llama-cpp-python) on the embedded SmolLM2 GGUF and the
fault-injecting proxy of ``integrations/faultproxy.py`` in front of it on loopback. ``--clients``
concurrent callers send real questions from ../shared/data through ``ESIGuard.abatch``
(``--batch`` questions per call) on an ``OpenAIBackend`` with timeouts, retries and bounded
concurrency. The proxy answers ``--fault-rate`` of the HTTP requests with a 500, a 429, a
400, a malformed body, a hang past the client's timeout or a dropped connection; halfway
through, the server is killed and a new one started (one restart).

Every request must end exactly once as a scored answer, or as the policy's explicit
outcome (``on_error="abstain"``: withheld, ``scored: false``, a reason). A result that
belongs to another request (its variants are not its own question's) counts as
duplicated. Ends with ``load: requests=N lost=N duplicated=N retries=N p50_ms=N
p99_ms=N`` and exits 1 when anything was lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from collections import Counter
from typing import Any
from uuid import UUID

import numpy as np
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage

from benchmarks.shared_data import SharedDataMissing, shared_data
from esi_guard import ESIGuard, ESIGuardError, OpenAIBackend
from esi_guard.calibration.data import load_examples
from integrations.faultproxy import FaultProxy
from integrations.llamacpp.server import CHATML, LlamaServer

ABSTAIN = "I cannot answer that reliably."
FAULTS = ["500", "429", "400", "malformed", "hang", "drop"]


def questions(count: int) -> list[str]:
    """``count`` distinct real questions (TriviaQA, then NQ-open, then SciQ)."""
    out: list[str] = []
    try:
        data = shared_data()
    except SharedDataMissing as exc:
        sys.exit(str(exc))
    for name in ("triviaqa/subset.jsonl", "nq_open/dev.jsonl", "sciq/test.jsonl"):
        if (data / name).is_file():
            for example in load_examples(data / name):
                if example.question not in out:
                    out.append(example.question)
            if len(out) >= count:
                return out[:count]
    sys.exit(f"need {count} distinct questions under {data}; found {len(out)}")


class Ends(BaseCallbackHandler):
    """How many times each request's top-level run ended (output or error)."""

    def __init__(self) -> None:
        self.index: dict[UUID, int] = {}
        self.ends: Counter[int] = Counter()
        self._lock = threading.Lock()

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, metadata: Any = None,
                       **kwargs: Any) -> None:  # fmt: skip
        if parent_run_id is None and metadata and "load_index" in metadata:
            with self._lock:
                self.index[run_id] = int(metadata["load_index"])

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID,
                            parent_run_id: UUID | None = None, metadata: Any = None,
                            **kwargs: Any) -> None:  # fmt: skip
        """The guard is a chat model: its top-level run is a chat-model run."""
        self.on_chain_start(serialized, messages, run_id=run_id, parent_run_id=parent_run_id,
                            metadata=metadata)  # fmt: skip

    def _end(self, run_id: UUID) -> None:
        with self._lock:
            if run_id in self.index:
                self.ends[self.index[run_id]] += 1

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)


def verdict(result: Any, question: str, guard: ESIGuard) -> str:
    """``scored``, ``withheld`` (the policy's outcome), ``refused``, ``crossed`` or ``lost``."""
    if isinstance(result, ESIGuardError):
        return "refused"
    if not isinstance(result, AIMessage):
        return "lost"
    esi = result.response_metadata.get("esi") or {}
    own = guard.intervention.variants(question, guard.n_variants, seed=guard.seed)
    if esi.get("variants") not in (own, []):
        return "crossed"  # another request's result
    if esi.get("scored") is True and esi.get("score") is not None:
        return "scored"
    if esi.get("scored") is False and esi.get("reason") and result.content == ABSTAIN:
        return "withheld"
    return "lost"


class Restarter:
    """Kills the server once, when the proxy sees request number ``at``, and starts another."""

    def __init__(self, server: LlamaServer, proxy: FaultProxy, at: int) -> None:
        self.server, self.proxy, self.at = server, proxy, at
        self.done = threading.Event()
        self.seconds = 0.0

    def __call__(self, index: int) -> None:
        if index == self.at:
            threading.Thread(target=self._restart, daemon=True).start()

    def _restart(self) -> None:
        start = time.perf_counter()
        self.server.process.kill()  # a crash, not a clean shutdown
        self.server.stop()
        self.server = LlamaServer.start(n_threads=2)
        host, port = self.server.base_url.split("//")[1].split("/")[0].split(":")
        self.proxy.upstream = (host, int(port))
        self.seconds = time.perf_counter() - start
        self.done.set()


async def drive(guard: ESIGuard, texts: list[str], batch: int, clients: int, ends: Ends
                ) -> tuple[list[Any], list[float]]:  # fmt: skip
    """All requests, ``clients`` batches in flight; each request's latency is its call's."""
    results: list[Any] = [None] * len(texts)
    latency: list[float] = [float("nan")] * len(texts)
    gate = asyncio.Semaphore(clients)

    async def call(indices: list[int]) -> None:
        async with gate:
            configs: list[Any] = [{"metadata": {"load_index": i}, "callbacks": [ends]}
                                  for i in indices]  # fmt: skip
            start = time.perf_counter()
            out = await guard.abatch([texts[i] for i in indices], configs, return_exceptions=True)
            elapsed = time.perf_counter() - start
            for i, result in zip(indices, out, strict=True):
                results[i] = result
                latency[i] = elapsed
            done = sum(r is not None for r in results)
            if done % 100 < len(indices):  # a line every 100 requests or so
                print(f"{done}/{len(texts)} requests done", flush=True)

    chunks = [list(range(s, min(s + batch, len(texts)))) for s in range(0, len(texts), batch)]
    await asyncio.gather(*(call(chunk) for chunk in chunks))
    return results, latency


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=10, help="questions per abatch call")
    parser.add_argument("--clients", type=int, default=4, help="abatch calls in flight")
    parser.add_argument("--fault-rate", type=float, default=0.08, help="of HTTP requests")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per HTTP attempt")
    parser.add_argument("--in-flight", type=int, default=4, help="HTTP requests in flight")
    parser.add_argument("--variants", type=int, default=2, help="ESI variants per question")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    texts = questions(args.requests)
    rng = random.Random(args.seed)
    server = LlamaServer.start(n_threads=2)
    proxy = FaultProxy(server.base_url, hang_seconds=args.timeout + 1).start()
    proxy.choose = lambda _: rng.choice(FAULTS) if rng.random() < args.fault_rate else None
    # Each request makes 1 + variants HTTP calls: restart about halfway.
    restarter = Restarter(server, proxy, at=(1 + args.variants) * args.requests // 2)
    proxy.on_request = restarter
    backend = OpenAIBackend(
        server.model, base_url=proxy.base_url, mode="chat", chat_template=CHATML,
        timeout=args.timeout, max_retries=8, retry_wait=0.2, retry_max_wait=4.0,
        max_concurrency=args.in_flight,
    )  # fmt: skip
    guard = ESIGuard(backend=backend, threshold=0.3, n_variants=args.variants, top_k=10,
                     max_new_tokens=args.max_new_tokens, action="abstain",
                     abstain_message=ABSTAIN)  # fmt: skip
    ends = Ends()
    start = time.perf_counter()
    try:
        results, latency = asyncio.run(drive(guard, texts, args.batch, args.clients, ends))
    finally:
        proxy.stop()
        restarter.server.stop()
        backend.close()
    wall = time.perf_counter() - start

    kinds = Counter(verdict(r, q, guard) for r, q in zip(results, texts, strict=True))
    reasons = Counter(
        str(r.response_metadata["esi"]["reason"]).split(":")[0]
        for r in results
        if isinstance(r, AIMessage) and not r.response_metadata["esi"].get("scored")
    )
    lost = kinds["lost"] + sum(1 for i in range(len(texts)) if ends.ends[i] == 0)
    duplicated = kinds["crossed"] + sum(1 for i in range(len(texts)) if ends.ends[i] > 1)
    faults = Counter(fault for _, fault in proxy.log if fault)
    p50, p99 = (float(np.percentile(latency, q)) * 1000 for q in (50, 99))
    for r in results:
        if isinstance(r, AIMessage) and not r.response_metadata["esi"].get("scored"):
            print("first unscored:", r.response_metadata["esi"]["reason"][:300])
            break
    print(f"{len(texts)} requests in {wall:.0f} s; outcomes {dict(kinds)}")
    print(f"unscored, by reason: {dict(reasons)}")
    print(f"HTTP requests {len(proxy.log)}, faults injected {dict(faults)}; server restarted: "
          f"{restarter.done.is_set()} ({restarter.seconds:.1f} s down)")  # fmt: skip
    print(
        f"load: requests={len(texts)} lost={lost} duplicated={duplicated} "
        f"retries={backend.stats.retries} p50_ms={p50:.0f} p99_ms={p99:.0f}"
    )
    return 1 if lost or duplicated or not restarter.done.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
