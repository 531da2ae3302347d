r"""One guarded question's forcing on each engine's kernels: what the forcing pass costs.

    python -m benchmarks.timing kernels --repeats 6

The forcing the guard runs for one question on the embedded SmolLM2 (``--question``, the
QA instruction as system message, L = ``--variants`` Skip-One-Char variants, the original
row forced too, the same ``--answer`` after each, top-k 100), through each backend's
``teacher_force``. Timed side by side in one run, each engine's own threads (every core):
llama.cpp on the file's Q4_1 weights (``forcing_precision="model"``), on the backend's
float32 and float16 copies of them (``"f32"``, ``"f16"``: the default guard forces on
the float16 one), and transformers' torch forward on its float32 dequantization of the
same file (what ``HFBackend`` forces on). Same weights, same rows: the ratios are the
kernels'. Rounds alternate between the arms; the first is a warm-up. Also reported: each
llama.cpp arm's largest difference from the float32 copy in the original row's top-k
logits.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from benchmarks.common import Answering
from esi_guard import SkipOneChar
from esi_guard.backends import Backend, ForcingRequest, HFBackend, LlamaCppBackend

__all__ = ["add_arguments", "measure"]

QUESTION = (
    "What type of organism is commonly used in preparation of foods such as cheese and "
    "yogurt, and which process converts the milk sugar lactose into lactic acid?"
)
ANSWER = "Bacteria, through lactic acid fermentation of the milk sugar lactose by microbes."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--answer", default=ANSWER)
    parser.add_argument("--variants", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=6)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time every arm, alternating; print median seconds a question, ratios and drift."""
    import torch

    backends: dict[str, Backend] = {
        f"llama.cpp {precision}": LlamaCppBackend.default(forcing_precision=precision)
        for precision in ("model", "f32", "f16")
    }
    backends["torch f32"] = HFBackend.default()
    answering = Answering()
    prompt = answering.messages(args.question)
    variants = [
        answering.messages(text)
        for text in SkipOneChar().variants(args.question, args.variants, seed=0)
    ]
    requests = {
        name: ForcingRequest(
            prompt, variants, backend.encode_answer(prompt, args.answer), include_original=True
        )
        for name, backend in backends.items()
    }
    top: dict[str, np.ndarray] = {}
    seconds: dict[str, list[float]] = {name: [] for name in backends}
    for step in range(args.repeats + 1):  # the first round warms up, untimed
        for name, backend in backends.items():
            start = time.perf_counter()
            (forced,) = backend.teacher_force([requests[name]], top_k=100)
            if step:
                seconds[name].append(time.perf_counter() - start)
            if isinstance(forced, Exception):
                raise forced
            if forced.original is not None:
                top.setdefault(name, np.asarray(forced.original.values))
    median = {name: float(np.median(values)) for name, values in seconds.items()}
    reference = top["llama.cpp f32"]
    tokens = {name: len(request.answer_ids) for name, request in requests.items()}
    out = {"variants": args.variants, "answer_tokens": tokens, "repeats": args.repeats,
           "torch_threads": torch.get_num_threads(), "seconds": median,
           "over_torch": {name: median[name] / median["torch f32"] for name in backends},
           "max_topk_logit_diff_vs_f32": {
               name: float(np.abs(values - reference).max())
               for name, values in top.items() if name.startswith("llama.cpp")}}  # fmt: skip
    print(json.dumps(out, indent=1))
    return out
