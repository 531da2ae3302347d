"""What a user of the default guard waits for: first call, later calls, first streamed chunk.

    python -m benchmarks.timing streaming --data <questions.jsonl> --limit 10

In one fresh process, on the embedded model: the first guarded call of
``ESIGuard(threshold=...)`` (it loads the model), the later calls, and, with
``stream_mode="live"``, the time to the first streamed chunk against the time to the full
scored answer (the last chunk), per question, side by side.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from esi_guard import ESIGuard
from esi_guard.calibration.data import load_examples

__all__ = ["add_arguments", "measure"]

SYSTEM = "Please directly answer the following question with one or few words."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=24)


def measure(args: argparse.Namespace) -> None:
    """Print the timings."""
    prompts = [
        [("system", SYSTEM), ("human", e.question)]
        for e in load_examples(args.data, limit=args.limit + 1)
    ]
    guard = ESIGuard(threshold=0.3, max_new_tokens=args.max_new_tokens)
    start = time.perf_counter()
    guard.invoke(prompts[0])
    first = time.perf_counter() - start
    later = []
    for prompt in prompts[1:]:
        start = time.perf_counter()
        guard.invoke(prompt)
        later.append(time.perf_counter() - start)
    live = ESIGuard(threshold=0.3, max_new_tokens=args.max_new_tokens, stream_mode="live",
                    action="flag", on_error="flag")  # fmt: skip
    to_first, to_last = [], []
    for prompt in prompts[1:]:
        start = time.perf_counter()
        for index, _ in enumerate(live.stream(prompt)):
            if index == 0:
                to_first.append(time.perf_counter() - start)
        to_last.append(time.perf_counter() - start)
    mean = statistics.mean
    print(f"questions={len(later)} max_new_tokens={args.max_new_tokens}")
    print(f"first guarded call (loads the model): {first:6.2f} s")
    print(f"later guarded calls, mean           : {mean(later):6.2f} s")
    print(f"live stream, first chunk, mean      : {mean(to_first):6.2f} s")
    print(f"live stream, scored last chunk, mean: {mean(to_last):6.2f} s")
    print(f"first chunk / full scored answer    : {mean(to_first) / mean(to_last):6.2f}x")
