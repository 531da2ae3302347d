"""The API backend on the local llama.cpp server: AUROC at several k, and time per mode.

    python -m benchmarks.timing api --limit 200 --n-variants 5 --timing 10 --json out.json

Starts two llama.cpp servers with the embedded GGUF
(``integrations.llamacpp.server.LlamaServer``, one per core) and, in ONE run on the same
SciQ questions:

* **AUROC** of echo-mode ESI for wrong-vs-right answers at k = 5, 10 and 20. One echo pass
  at k=20 gives all three: a top-5 row is the first five entries of the top-20 row.
  Correctness: the gold answer's normalised text (SQuAD normalisation) is contained in the
  normalised answer.
* **time per question** of a guarded call in echo mode, chat mode and with the transformers
  backend on the same model, questions and settings (``--timing`` questions, one at a time).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import string
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.shared_data import shared_data
from esi_guard import ESIGuard, HFBackend, OpenAIBackend, SkipOneChar, esi_score
from esi_guard.backends import Forced, ForcingRequest, Generation
from integrations.llamacpp.server import LlamaServer

__all__ = ["add_arguments", "measure"]

SYSTEM = "Answer in a few words."
KS = (5, 10, 20)


def normalise(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def load_sciq(path: Path, limit: int) -> list[tuple[str, list[str]]]:
    """The first ``limit`` (question, gold answers) pairs of the shared SciQ file."""
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line, _ in zip(handle, range(limit), strict=False):
            record = json.loads(line)
            rows.append((record["query"], list(record["truthful answer"])))
    return rows


def auroc_run(
    backends: list[OpenAIBackend],
    data: list[tuple[str, list[str]]],
    n_variants: int,
    max_new_tokens: int,
) -> list[dict[str, Any]]:
    """Echo-mode ESI at every k of KS for each question, the servers sharing the work."""
    soc = SkipOneChar()
    records: dict[int, dict[str, Any]] = {}

    def worker(index: int) -> None:
        backend = backends[index]
        for i in range(index, len(data), len(backends)):
            question, gold = data[i]
            prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            gen = backend.generate([prompt], max_new_tokens=max_new_tokens, top_k=max(KS))[0]
            if not isinstance(gen, Generation) or not gen.token_ids:
                records[i] = {"question": question, "error": str(gen)}
                continue
            variants = [
                [prompt[0], {"role": "user", "content": v}]
                for v in soc.variants(question, n_variants, seed=0)
            ]
            request = ForcingRequest(prompt, variants, gen.token_ids, gen.text)
            forced = backend.teacher_force([request], top_k=max(KS))[0]
            if not isinstance(forced, Forced):
                records[i] = {"question": question, "error": str(forced)}
                continue
            scores = {
                k: esi_score(
                    gen.topk.head(k), [v.head(k) for v in forced.variants],
                    kind="logprobs",
                ).score
                for k in KS
            }  # fmt: skip
            correct = any(normalise(g) in normalise(gen.text) for g in gold)
            records[i] = {"question": question, "answer": gen.text, "correct": correct,
                          "scores": scores}  # fmt: skip
            print(f"[{len(records)}/{len(data)}] {correct!s:5} {scores[20]:.3f} {gen.text!r}",
                  flush=True)  # fmt: skip

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(len(backends))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [records[i] for i in range(len(data))]


def timing_run(guards: dict[str, ESIGuard], questions: list[str]) -> dict[str, float]:
    """Mean seconds per guarded question for each guard, questions interleaved."""
    per_mode: dict[str, list[float]] = {name: [] for name in guards}
    for question in questions:
        for name, guard in guards.items():  # interleaved: same load for every mode
            start = time.perf_counter()
            message = guard.invoke([("system", SYSTEM), ("human", question)])
            per_mode[name].append(time.perf_counter() - start)
            assert message.response_metadata["esi"]["scored"], message.response_metadata
    return {name: statistics.mean(times) for name, times in per_mode.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument(
        "--data", type=Path, default=None, help="default: sciq/test.jsonl of the shared data"
    )
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--n-variants", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--timing", type=int, default=10, help="questions timed per mode")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the AUROC and timing measurements; print them and return the record."""
    from sklearn.metrics import roc_auc_score

    servers = [LlamaServer.start(n_threads=1), LlamaServer.start(n_threads=1)]
    try:
        backends = [server.backend(mode="echo") for server in servers]
        data = load_sciq(args.data or shared_data() / "sciq" / "test.jsonl", args.limit)
        out: dict[str, Any] = {"n_variants": args.n_variants, "system": SYSTEM}
        if args.timing:
            hf = HFBackend.default(device="cpu")
            chat = servers[0].backend(mode="chat")
            settings = {"threshold": 1.0, "n_variants": args.n_variants, "top_k": 20,
                        "max_new_tokens": args.max_new_tokens}  # fmt: skip
            guards = {
                "echo": ESIGuard(backend=backends[0], **settings),
                "chat": ESIGuard(backend=chat, **settings),
                "transformers": ESIGuard(backend=hf, **settings),
            }
            timing = timing_run(guards, [q for q, _ in data[: args.timing]])
            out["seconds_per_question"] = timing
            print("seconds per guarded question:", {k: round(v, 2) for k, v in timing.items()})
        if args.limit:
            records = auroc_run(backends, data, args.n_variants, args.max_new_tokens)
            scored = [r for r in records if "scores" in r]
            labels = [not r["correct"] for r in scored]  # positive class: a wrong answer
            out["n"] = len(scored)
            out["accuracy"] = 1 - sum(labels) / len(labels)
            out["auroc"] = {k: roc_auc_score(labels, [r["scores"][k] for r in scored]) for k in KS}
            out["errors"] = [r for r in records if "error" in r]
            print(f"n={out['n']} accuracy={out['accuracy']:.3f} "
                  + " ".join(f"AUROC@k={k}: {v:.3f}" for k, v in out["auroc"].items()))  # fmt: skip
            out["records"] = records
    finally:
        for server in servers:
            server.stop()
    return out
