r"""ESI's cost against a plain answer, with and without the template-prefix cache, side by side.

    OMP_NUM_THREADS=1 python -m benchmarks.timing prefix --model qwen2.5-coder-1.5b \\
        --limit 10 --json prefix-1.5b.json
    OMP_NUM_THREADS=1 python -m benchmarks.timing prefix --model default --limit 10

One model on llama.cpp, one thread, SciQ test questions asked as the CLI asks them (its
short-answer system prompt, 24 tokens). The arms, each on a backend of its own:

* ``llama``: llama-cpp-python's own ``Llama.create_chat_completion`` (temperature 0): what
  a user without the guard runs; it keeps the previous prompt's KV cells and decodes only
  what differs, so the system prompt is computed once for all questions;
* ``plain_before`` / ``plain``: the backend's greedy answer with its top-100, without
  (``prefix_cache=0``: the prompt decoded whole, as before the cache) and with the
  template-prefix cache (:meth:`esi_guard.backends.llamacpp.LlamaCppBackend`);
* ``esi_before`` / ``esi``: ``ESIGuard`` with full ESI (L=10 SOC variants, k=100) on those
  two backends;
* ``free``: the guard deciding on a combined score of the free signals alone (``nll``,
  ``entropy``, ``max_nll``; fitted on random numbers: only its cost is measured here).

One at a time, each question goes through every arm in turn (after a warm-up call each);
then each arm but ``llama`` answers all questions in batches of 8 (``generate`` for the
plain ones, ``batch`` for the guards). Reported: mean seconds a question, each arm over
``llama`` and over ``plain``, the ESI scores' largest difference before/after, and the
forcing stage (``esi`` minus ``plain``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from benchmarks.common import Answering, data_file, llamacpp_backend
from esi_guard import ESIGuard
from esi_guard.calibration.combined_fit import fit_combined
from esi_guard.calibration.data import load_examples

__all__ = ["add_arguments", "measure"]

BATCH = 8
FREE = ("nll", "entropy", "max_nll")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--model", default="default",
                        help="'default' (embedded), a known model's name or a .gguf")  # fmt: skip
    parser.add_argument("--data", default="sciq/test.jsonl")
    parser.add_argument("--limit", type=int, default=10)


def _free_score() -> Any:
    """A free-signals combined score fitted on random numbers (its cost is what counts)."""
    rng = np.random.default_rng(0)
    signals = [{name: float(rng.uniform(0, 3)) for name in FREE} for _ in range(40)]
    return fit_combined(signals, [i % 2 for i in range(40)], features=FREE, seed=0)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time the arms side by side; print the figures and return them."""
    answering = Answering()
    examples = load_examples(data_file(args.data), seed=7)[-args.limit :]
    prompts = [answering.messages(e.question) for e in examples]
    tokens = answering.max_new_tokens
    plains = {
        "plain_before": llamacpp_backend(args.model, prefix_cache=0),
        "plain": llamacpp_backend(args.model),
    }
    settings = {"n_variants": 10, "top_k": 100, "max_new_tokens": tokens, "threshold": 0.5,
                "action": "flag"}  # fmt: skip
    guards = {
        "esi_before": ESIGuard(backend=llamacpp_backend(args.model, prefix_cache=0), **settings),
        "esi": ESIGuard(backend=llamacpp_backend(args.model), **settings),
        "free": ESIGuard(backend=llamacpp_backend(args.model), combined=_free_score(), **settings),
    }
    llama = plains["plain"].llama  # its own context, which the backend never touches

    def user(prompt: Any) -> Any:
        return llama.create_chat_completion(messages=prompt, max_tokens=tokens, temperature=0)

    calls: dict[str, Any] = {"llama": user}
    calls |= {k: (lambda p, b=b: b.generate([p], max_new_tokens=tokens, top_k=100))
              for k, b in plains.items()}  # fmt: skip
    calls |= {k: g.invoke for k, g in guards.items()}
    for call in calls.values():
        call(prompts[0])
    seconds: dict[str, list[float]] = {k: [] for k in calls}
    scores: dict[str, list[float]] = {"esi_before": [], "esi": []}
    for prompt in prompts:
        for key, call in calls.items():
            start = time.perf_counter()
            out = call(prompt)
            seconds[key].append(time.perf_counter() - start)
            if key in scores:
                scores[key].append(out.response_metadata["esi"]["score"])
    batched: dict[str, float] = {}
    for key in [k for k in calls if k != "llama"]:
        start = time.perf_counter()
        for i in range(0, len(prompts), BATCH):
            chunk = prompts[i : i + BATCH]
            if key in plains:
                plains[key].generate(chunk, max_new_tokens=tokens, top_k=100)
            else:
                guards[key].batch(chunk)
        batched[key] = (time.perf_counter() - start) / len(prompts)
    one = {k: float(np.mean(v)) for k, v in seconds.items()}
    diff = np.abs(np.array(scores["esi"]) - np.array(scores["esi_before"]))
    out = {
        "model": plains["plain"].model_id, "n": len(prompts), "one_at_a_time": one,
        "batched": batched,
        "over_llama": {k: v / one["llama"] for k, v in one.items()},
        "over_plain": {k: v / one["plain"] for k, v in one.items()},
        "batched_over_plain": {k: v / batched["plain"] for k, v in batched.items()},
        "forcing": {"before": one["esi_before"] - one["plain_before"],
                    "after": one["esi"] - one["plain"]},
        "score_difference": {"max": float(diff.max()), "mean": float(diff.mean())},
    }  # fmt: skip
    for key in calls:
        line = f"{key:>12}: {one[key]:6.2f} s one at a time ({one[key] / one['llama']:.2f}x llama"
        line += f", {one[key] / one['plain']:.2f}x plain)"
        if key in batched:
            line += f", {batched[key]:6.2f} s batched ({batched[key] / batched['plain']:.2f}x)"
        print(line, flush=True)
    print(f"ESI before/after: max |difference| {diff.max():.4f}, mean {diff.mean():.4f}")
    return out
