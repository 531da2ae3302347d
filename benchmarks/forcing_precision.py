r"""llama.cpp's forcing on the file's weights or on a float32 copy: speed and score drift.

    OMP_NUM_THREADS=1 python benchmarks/forcing_precision.py --data sciq/test.jsonl \\
        --limit 40 --json forcing.json

The embedded model (Q4_1) on llama.cpp, one thread (``--threads``; 0: each engine's own
defaults, llama.cpp's half the cores for generation and every core for forcing, torch's
every core), three backends side by side in one
run: ``plain`` (the greedy answer and its top-k, no guard), ``model`` (``ESIGuard``,
L=10, k=100, SOC, forcing on the Q4_1 weights, the default) and ``f32``
(``forcing_precision="f32"``: the same generation, forcing on a float32 copy). Both
guards generate on the same Q4_1 weights, so they score the same answers and the score
difference is the forcing's alone. One at a time, each question goes through the three
in turn; then each runs ``batch`` over all of them (batches of 8). Reported: mean seconds
per question, guarded/plain ratios, the scores' mean and largest absolute difference,
their Spearman correlation, and how often the two guards decide alike at ``--threshold``
(the embedded model's shipped one by default). ``--transformers`` adds a fourth column,
the same guard on transformers (``HFBackend``, its own greedy answers: timed only), the
engine the issue compares llama.cpp's batch with.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from esi_guard import ESIGuard
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.calibration.data import load_examples

if not __package__:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import Answering
from tests.shared_data import shared_data

__all__ = ["main"]

BATCH = 8


def main(argv: Sequence[str] | None = None) -> None:
    """Time the three side by side; print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="sciq/test.jsonl")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--skip", type=int, default=0, help="questions to leave out first")
    parser.add_argument("--threshold", type=float, default=0.345)
    parser.add_argument("--transformers", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads per engine; 0: each engine's own defaults")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    path = Path(args.data) if Path(args.data).is_file() else shared_data() / args.data
    examples = load_examples(path, seed=7)[args.skip : args.skip + args.limit]
    answering = Answering()
    prompts = [answering.messages(e.question) for e in examples]
    settings = {"n_variants": 10, "top_k": 100, "max_new_tokens": answering.max_new_tokens,
                "threshold": args.threshold, "action": "flag"}  # fmt: skip
    threads = args.threads or None
    plain = LlamaCppBackend.default(n_threads=threads)
    guards = {
        "model": ESIGuard(
            backend=LlamaCppBackend.default(n_threads=threads, forcing_precision="model"),
            **settings,
        ),
        "f32": ESIGuard(
            backend=LlamaCppBackend.default(n_threads=threads, forcing_precision="f32"),
            **settings,
        ),
    }
    if args.transformers:
        import torch

        from esi_guard.backends.hf import HFBackend

        if threads:
            torch.set_num_threads(threads)
        guards["transformers"] = ESIGuard(backend=HFBackend.default(), **settings)
    args_plain = {"max_new_tokens": answering.max_new_tokens, "top_k": 100}
    plain.generate(prompts[:1], **args_plain)
    for guard in guards.values():
        guard.invoke(prompts[0])
    seconds: dict[str, list[float]] = {"plain": []} | {key: [] for key in guards}
    metas: dict[str, list[dict[str, Any]]] = {key: [] for key in guards}
    for prompt in prompts:
        start = time.perf_counter()
        plain.generate([prompt], **args_plain)
        seconds["plain"].append(time.perf_counter() - start)
        for key, guard in guards.items():
            start = time.perf_counter()
            message = guard.invoke(prompt)
            seconds[key].append(time.perf_counter() - start)
            metas[key].append(message.response_metadata["esi"])
    batched = {}
    calls = {"plain": lambda chunk: plain.generate(chunk, **args_plain)}
    calls |= {key: guard.batch for key, guard in guards.items()}
    for key, call in calls.items():
        start = time.perf_counter()
        for i in range(0, len(prompts), BATCH):
            call(prompts[i : i + BATCH])
        batched[key] = (time.perf_counter() - start) / len(prompts)
    one = {key: float(np.mean(values)) for key, values in seconds.items()}
    pairs = [(a["score"], b["score"]) for a, b in zip(metas["model"], metas["f32"], strict=True)
             if a["score"] is not None and b["score"] is not None]  # fmt: skip
    model, f32 = (np.array(side) for side in zip(*pairs, strict=True))
    same = [a["decision"] == b["decision"] for a, b in zip(metas["model"], metas["f32"],
                                                          strict=True)]  # fmt: skip
    out = {"n": len(prompts), "scored": len(pairs), "threshold": args.threshold,
           "one_at_a_time": one, "batched": batched,
           "ratio_one": {k: one[k] / one["plain"] for k in guards},
           "ratio_batched": {k: batched[k] / batched["plain"] for k in guards},
           "f32_speedup_one": one["model"] / one["f32"],
           "f32_speedup_batched": batched["model"] / batched["f32"],
           "score_diff_mean": float(np.mean(np.abs(model - f32))),
           "score_diff_max": float(np.max(np.abs(model - f32))),
           "spearman": float(spearmanr(model, f32).statistic),
           "decision_agreement": float(np.mean(same))}  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
