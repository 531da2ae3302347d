r"""Two llama-cpp-python builds side by side: the default guard's speed and answers on each.

    python -m benchmarks.timing llamacpp-build --python .venv/bin/python \\
        --python /tmp/native/bin/python --limit 16 --rounds 3

Each ``--python`` is an interpreter with esi_guard and its own llama-cpp-python build (the
project's CPU-keyed build from ``make demo``, a native ``pip install llama-cpp-python``...).
Run it from the checkout's root, as a module. It runs itself under each in turn (as a
module, from the same folder), ``--rounds`` times, interleaved, so both see
the same machine load: a child loads the default guard (the embedded model, L=10, k=100,
SOC, float16 forcing, ``--threads`` threads), answers ``--limit`` SciQ questions one at a
time and then in batches of 8, and prints its timings, answers and scores. Reported per
build: llama.cpp's system info, the median over rounds of the guarded seconds per
question (one at a time, batched), their ratio to the first build, and whether its
answers and scores equal the first build's (how many answers alike, the largest score
difference where they are).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "child", "measure"]

BATCH = 8
ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root, where the children run ``-m benchmarks.timing llamacpp-build``."""


def child(limit: int, threads: int) -> dict[str, Any]:
    """Time the default guard on this interpreter's llama-cpp-python build."""
    import llama_cpp

    from benchmarks.common import Answering
    from benchmarks.shared_data import shared_data
    from esi_guard import ESIGuard
    from esi_guard.backends.llamacpp import LlamaCppBackend
    from esi_guard.calibration.data import load_examples

    examples = load_examples(shared_data() / "sciq" / "test.jsonl", seed=7)[:limit]
    answering = Answering()
    prompts = [answering.messages(e.question) for e in examples]
    guard = ESIGuard(
        backend=LlamaCppBackend.default(n_threads=threads), threshold=0.5, n_variants=10,
        top_k=100, max_new_tokens=answering.max_new_tokens, action="flag",
    )  # fmt: skip
    guard.invoke(prompts[0])  # warm: the forcing copy loaded, caches touched
    started = time.perf_counter()
    alone = [guard.invoke(p) for p in prompts]
    one = (time.perf_counter() - started) / len(prompts)
    started = time.perf_counter()
    batched = guard.batch(prompts, config={"max_concurrency": BATCH})
    many = (time.perf_counter() - started) / len(prompts)
    return {
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace"),
        "one_at_a_time_s": one,
        "batched_s": many,
        "answers": [m.content for m in alone],
        "scores": [m.response_metadata["esi"]["score"] for m in alone],
        "batch_scores": [m.response_metadata["esi"]["score"] for m in batched],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--python", action="append", default=[], dest="pythons")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def measure(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Run the children interleaved; print the comparison and return it (a child: its own)."""
    if args.child:
        print(json.dumps(child(args.limit, args.threads)))
        return None
    if not args.pythons:
        sys.exit("give at least one --python")
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in args.pythons}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for round_ in range(args.rounds):
        for python in args.pythons:
            command = [python, "-m", "benchmarks.timing", "llamacpp-build", "--child",
                       "--limit", str(args.limit), "--threads", str(args.threads)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, env=env,
                                  cwd=ROOT, check=False)  # fmt: skip
            if done.returncode != 0:
                sys.exit(f"{python} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
            runs[python].append(json.loads(done.stdout.strip().splitlines()[-1]))
            last = runs[python][-1]
            print(f"round {round_ + 1} {python}: {last['one_at_a_time_s']:.3f} s one at a time, "
                  f"{last['batched_s']:.3f} s batched")  # fmt: skip
    first = args.pythons[0]
    reference = runs[first][0]
    one0 = statistics.median(r["one_at_a_time_s"] for r in runs[first])
    many0 = statistics.median(r["batched_s"] for r in runs[first])
    report = []
    for python in args.pythons:
        mine = runs[python][0]
        one = statistics.median(r["one_at_a_time_s"] for r in runs[python])
        many = statistics.median(r["batched_s"] for r in runs[python])
        alike = [a == b for a, b in zip(mine["answers"], reference["answers"], strict=True)]
        gaps = [abs(a - b) for a, b, same in
                zip(mine["scores"], reference["scores"], alike, strict=True) if same]  # fmt: skip
        row = {
            "python": python,
            "system_info": mine["system_info"],
            "one_at_a_time_s": one,
            "batched_s": many,
            "ratio_one": one / one0,
            "ratio_batched": many / many0,
            "answers_alike": f"{sum(alike)}/{len(alike)}",
            "max_score_difference": max(gaps, default=0.0),
        }
        report.append(row)
        print(f"\n{python}\n  {mine['system_info']}\n"
              f"  guarded s/question: one at a time {one:.3f} ({one / one0:.3f}x the first), "
              f"batched {many:.3f} ({many / many0:.3f}x)\n"
              f"  answers alike the first build's: {row['answers_alike']}; largest score "
              f"difference where alike: {row['max_score_difference']:.2e}")  # fmt: skip
    return report
