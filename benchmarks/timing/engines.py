r"""The embedded model on llama.cpp and on transformers (per dtype): time, answers, scores.

    OMP_NUM_THREADS=1 python -m benchmarks.timing engines --limit 30
    OMP_NUM_THREADS=1 python -m benchmarks.timing engines --engines transformers \\
        --dtype float32 bfloat16 --limit 30

The same GGUF, questions (the first ``--limit`` of ``--data``, in file order), prompt
(a one-or-few-words instruction as system message), ESI settings (L = 10, k = 100,
threshold 1.0) and ``--threads``, through each arm: llama.cpp (``LlamaCppBackend``,
forcing at ``--forcing-precision``) and transformers (``HFBackend``) at each ``--dtype``.
After one warm-up each, each question goes through every arm in turn: the plain greedy
answer (the backend's own ``generate``, top-k 100, no guard), then the guarded call
(``ESIGuard.invoke``). Reported per arm: seconds per question plain and guarded, their
ratio, ESI's time beyond the answer (guarded - plain), and each against the first arm's;
against the first arm, how many greedy answers are the same text and, where they are and
both are scored, the Spearman correlation and mean absolute difference of the ESI scores.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from benchmarks.common import Answering, data_file
from esi_guard import ESIGuard
from esi_guard.backends import Backend, HFBackend, LlamaCppBackend
from esi_guard.calibration.data import load_questions

__all__ = ["add_arguments", "compare", "measure"]

SYSTEM = "Please directly answer the following question with one or few words."
"""The system prompt the engines' figures were measured with."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--data", default="sciq/test.jsonl")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engines", nargs="+", default=["llamacpp", "transformers"],
                        choices=["llamacpp", "transformers"])  # fmt: skip
    parser.add_argument("--dtype", nargs="+", default=["float32"],
                        help="transformers' dtypes, an arm each")  # fmt: skip
    parser.add_argument("--forcing-precision", default="auto",
                        choices=["auto", "model", "f16", "f32"], help="llama.cpp's")  # fmt: skip


def load_arms(args: argparse.Namespace) -> dict[str, Backend]:
    """Each arm's backend, in ``--engines`` order, one transformers arm per ``--dtype``."""
    arms: dict[str, Backend] = {}
    for engine in args.engines:
        if engine == "llamacpp":
            arms[engine] = LlamaCppBackend.default(
                n_threads=args.threads, forcing_precision=args.forcing_precision
            )
            continue
        import torch

        torch.set_num_threads(args.threads)
        for dtype in args.dtype:
            arms[f"transformers-{dtype}"] = HFBackend.default(device="cpu", dtype=dtype)
    return arms


def compare(
    arms: dict[str, Backend], prompts: Sequence[Any], max_new_tokens: int
) -> dict[str, Any]:
    """Time every arm question by question; its figures, and its answers against the first's."""
    guards = {
        name: ESIGuard(backend=backend, threshold=1.0, n_variants=10, max_new_tokens=max_new_tokens)
        for name, backend in arms.items()
    }
    for name, guard in guards.items():  # warm-up outside the timings
        arms[name].generate(prompts[:1], max_new_tokens=max_new_tokens, top_k=100)
        guard.invoke(prompts[0])
    seconds: dict[str, dict[str, list[float]]] = {
        name: {"plain": [], "guarded": []} for name in arms
    }
    metas: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for prompt in prompts:
        for name, guard in guards.items():
            start = time.perf_counter()
            arms[name].generate([prompt], max_new_tokens=max_new_tokens, top_k=100)
            seconds[name]["plain"].append(time.perf_counter() - start)
            start = time.perf_counter()
            metas[name].append(guard.invoke(prompt).response_metadata["esi"])
            seconds[name]["guarded"].append(time.perf_counter() - start)
    first = next(iter(arms))
    out: dict[str, Any] = {"n": len(prompts), "first": first, "arms": {}}
    for name in arms:
        plain, guarded = (float(np.mean(seconds[name][k])) for k in ("plain", "guarded"))
        row = {"plain": plain, "guarded": guarded, "guarded_over_plain": guarded / plain,
               "beyond": guarded - plain}  # fmt: skip
        if name != first:
            for key in ("plain", "guarded", "beyond"):
                row[f"{key}_over_first"] = row[key] / out["arms"][first][key]
            row |= _agreement(metas[first], metas[name])
        out["arms"][name] = row
        print(f"{name}: plain {plain:.2f} s/q | guarded {guarded:.2f} s/q ({guarded / plain:.2f}x "
              f"plain) | ESI beyond the answer {guarded - plain:.2f} s/q")  # fmt: skip
    for name, row in list(out["arms"].items())[1:]:
        ratios = ", ".join(f"{key} {row[f'{key}_over_first']:.2f}x"
                           for key in ("plain", "guarded", "beyond"))  # fmt: skip
        print(f"{name} / {first}: {ratios}")
        print(f"{name} against {first}: same greedy answer {row['same_answers']}/{len(prompts)}; "
              f"where also scored ({row['scored_pairs']}): Spearman {_num(row['spearman'])}, "
              f"mean |ESI difference| {_num(row['score_diff_mean'])}")  # fmt: skip
    return out


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _agreement(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """Same greedy answers, and where both score them, the scores' agreement."""
    same = [(a, b) for a, b in zip(ours, theirs, strict=True) if a["answer"] == b["answer"]]
    pairs = np.array([(a["score"], b["score"]) for a, b in same if a["scored"] and b["scored"]])
    return {
        "same_answers": len(same),
        "scored_pairs": len(pairs),
        "spearman": float(spearmanr(*pairs.T).statistic) if len(pairs) >= 3 else None,
        "score_diff_mean": float(np.mean(np.abs(pairs[:, 0] - pairs[:, 1])))
        if len(pairs)
        else None,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Load the arms, time them on the same questions; print the figures and return them."""
    questions = load_questions(data_file(args.data), limit=args.limit)
    answering = Answering(args.max_new_tokens, SYSTEM)
    prompts = [answering.messages(q.question) for q in questions]
    out = compare(load_arms(args), prompts, args.max_new_tokens)
    return {"threads": args.threads, "max_new_tokens": args.max_new_tokens,
            "forcing_precision": args.forcing_precision, **out}  # fmt: skip
