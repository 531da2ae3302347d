r"""llama.cpp's forcing on the file's weights or on a float copy: speed and score drift.

    OMP_NUM_THREADS=1 python -m benchmarks.timing forcing --data sciq/test.jsonl \\
        --limit 40 --json forcing.json

The embedded model (Q4_1) on llama.cpp, one thread (``--threads``; 0: each engine's own
defaults, llama.cpp's half the cores for generation and every core for forcing, torch's
every core), side by side in one run: ``plain`` (the greedy answer and its top-k, no
guard) and one ``ESIGuard`` (L=10, k=100, SOC) per ``--precisions`` entry: ``model``
(forcing on the Q4_1 weights), ``f32`` and ``f16`` (``forcing_precision``: the same
generation, forcing on a float32 / float16 copy; ``f16`` is the default). The guards
generate on the same Q4_1 weights, so they score the same answers and a score difference
is the forcing's alone. One at a time, each question goes through all in turn; then each
runs ``batch`` over all of them (batches of 8). Reported: mean seconds per question,
guarded/plain ratios and, for each guard against ``--reference``, the scores' mean and
largest absolute difference, their Spearman correlation, and how often the two decide
alike at ``--threshold`` (the embedded model's shipped one by default). ``--transformers``
adds the same guard on transformers (``HFBackend``, its own greedy answers: timed only),
the engine the issue compares llama.cpp's batch with.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from benchmarks.common import Answering, data_file, side_by_side
from esi_guard import ESIGuard
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.calibration.data import load_examples

__all__ = ["add_arguments", "measure"]

BATCH = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--data", default="sciq/test.jsonl")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--skip", type=int, default=0, help="questions to leave out first")
    parser.add_argument("--threshold", type=float, default=None,
                        help="default: the embedded model's shipped threshold")  # fmt: skip
    parser.add_argument("--precisions", nargs="+", default=["model", "f32", "f16"],
                        choices=["model", "f32", "f16"])  # fmt: skip
    parser.add_argument("--reference", default="f32", choices=["model", "f32", "f16"])
    parser.add_argument("--transformers", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads per engine; 0: each engine's own defaults")  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time the guards side by side; print the figures and return them."""
    path = data_file(args.data)
    examples = load_examples(path, seed=7)[args.skip : args.skip + args.limit]
    answering = Answering()
    prompts = [answering.messages(e.question) for e in examples]
    settings = {"n_variants": 10, "top_k": 100, "max_new_tokens": answering.max_new_tokens,
                "threshold": args.threshold, "action": "flag"}  # fmt: skip
    threads = args.threads or None
    plain = LlamaCppBackend.default(n_threads=threads)
    if args.threshold is None:
        from esi_guard.backends.embedded import embedded_threshold

        shipped = json.loads(embedded_threshold().read_text())
        args.threshold = float(shipped["threshold"])
        settings["threshold"] = args.threshold
    guards = {
        key: ESIGuard(
            backend=LlamaCppBackend.default(n_threads=threads, forcing_precision=key),
            **settings,
        )
        for key in args.precisions
    }
    if args.transformers:
        import torch

        from esi_guard.backends.hf import HFBackend

        if threads:
            torch.set_num_threads(threads)
        guards["transformers"] = ESIGuard(backend=HFBackend.default(), **settings)
    timed = side_by_side(plain, guards, prompts, max_new_tokens=answering.max_new_tokens,
                         batch=BATCH)  # fmt: skip
    one, batched, metas = timed
    out = {"n": len(prompts), "threshold": args.threshold, "reference": args.reference,
           "one_at_a_time": one, "batched": batched, **timed.ratios(),
           "drift": {}}  # fmt: skip
    for key in guards.keys() - {args.reference, "transformers"}:
        if args.reference not in metas:
            break
        ours, theirs = metas[key], metas[args.reference]
        pairs = [(a["score"], b["score"]) for a, b in zip(ours, theirs, strict=True)
                 if a["score"] is not None and b["score"] is not None]  # fmt: skip
        mine, ref = (np.array(side) for side in zip(*pairs, strict=True))
        same = [a["decision"] == b["decision"] for a, b in zip(ours, theirs, strict=True)]
        out["drift"][key] = {
            "scored": len(pairs),
            "speedup_one": one[args.reference] / one[key],
            "speedup_batched": batched[args.reference] / batched[key],
            "score_diff_mean": float(np.mean(np.abs(mine - ref))),
            "score_diff_max": float(np.max(np.abs(mine - ref))),
            "spearman": float(spearmanr(mine, ref).statistic),
            "decision_agreement": float(np.mean(same)),
        }
    print(json.dumps(out, indent=1))
    return out
