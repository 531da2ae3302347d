"""The embedded model through transformers and through llama.cpp in process, side by side.

    OMP_NUM_THREADS=1 python benchmarks/llamacpp_backend.py --limit 20 --threads 1

Same GGUF, same questions, prompt, ESI settings and thread count. For each backend: load
time; plain seconds per question (greedy answer, no guard: transformers ``generate`` and
llama.cpp ``create_chat_completion`` on the same loaded model) and guarded seconds per
question (``ESIGuard.invoke``), one question at a time and ``ESIGuard.batch`` over all;
llama.cpp's ``batch`` twice, its rows packed (``pack_rows``, the default) and each row in
a decode of its own, with the ratios to transformers' and the ESI scores' drift between
the two; then the agreement: how many greedy answers are the same text, and the Spearman
correlation of the ESI scores where they are.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from guard_overhead import SYSTEM, load_questions, plain_call

from esi_guard import ESIGuard, HFBackend, LlamaCppBackend
from esi_guard.backends import ChatMessage


def _llama_plain(backend: LlamaCppBackend, question: str, max_new_tokens: int) -> str:
    """llama-cpp-python's own greedy chat completion on the same loaded model."""
    out = backend.llama.create_chat_completion(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=max_new_tokens,
        temperature=0.0,
        top_k=1,
    )
    return str(out["choices"][0]["message"]["content"])


def _hf_plain(backend: HFBackend, question: str, max_new_tokens: int) -> str:
    messages = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content=question),
    ]
    return plain_call(backend, messages, max_new_tokens)


def _run(name: str, backend: Any, plain: Any, questions: list[str], args: Any) -> dict[str, Any]:
    guard = ESIGuard(
        backend=backend, threshold=1.0, max_new_tokens=args.max_new_tokens, n_variants=10, seed=0
    )
    prompts = [[("system", SYSTEM), ("human", q)] for q in questions]
    plain(backend, questions[0], args.max_new_tokens)  # warm-up outside the timings
    guard.invoke(prompts[0])
    start = time.perf_counter()
    for question in questions:
        plain(backend, question, args.max_new_tokens)
    plain_s = (time.perf_counter() - start) / len(questions)
    start = time.perf_counter()
    one = [guard.invoke(p).response_metadata["esi"] for p in prompts]
    guarded_s = (time.perf_counter() - start) / len(questions)
    start = time.perf_counter()
    guard.batch(prompts)
    batched_s = (time.perf_counter() - start) / len(questions)
    print(
        f"{name:12s} plain {plain_s:6.2f} s/q | guarded one at a time {guarded_s:6.2f} s/q "
        f"({guarded_s / plain_s:.2f}x) | guarded batched {batched_s:6.2f} s/q",
        flush=True,
    )
    return {"plain": plain_s, "guarded": guarded_s, "batched": batched_s, "esi": one}


def _packing(
    backend: LlamaCppBackend, questions: list[str], args: Any, hf: Any, packed: Any
) -> None:
    """llama.cpp's guarded ``batch`` with each row alone, against packed and transformers.

    The packed scores are those of one question at a time: a request's rows never share a
    decode with another's, so batching changes none of its bits.
    """
    guard = ESIGuard(
        backend=backend, threshold=1.0, max_new_tokens=args.max_new_tokens, n_variants=10, seed=0
    )
    prompts = [[("system", SYSTEM), ("human", q)] for q in questions]
    hf_s, packed_s = hf["batched"], packed["batched"]
    backend.pack_rows = False
    try:
        start = time.perf_counter()
        alone = [m.response_metadata["esi"] for m in guard.batch(prompts)]
        alone_s = (time.perf_counter() - start) / len(questions)
    finally:
        backend.pack_rows = True
    print(
        f"guarded batch: transformers {hf_s:.2f} s/q | llama.cpp packed {packed_s:.2f} s/q "
        f"({packed_s / hf_s:.2f}x) | llama.cpp rows alone {alone_s:.2f} s/q "
        f"({alone_s / hf_s:.2f}x) | packed / alone {packed_s / alone_s:.2f}x"
    )
    diffs = [abs(p["score"] - q["score"]) for p, q in zip(packed["esi"], alone, strict=True)
             if p["scored"] and q["scored"]]  # fmt: skip
    if diffs:
        print(f"ESI packed vs rows alone: max |difference| {max(diffs):.4f}, "
              f"mean {statistics.mean(diffs):.4f} over {len(diffs)} scored")  # fmt: skip


def main() -> None:
    """Load both backends, time them on the same questions, compare their answers and scores."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/sciq/test.jsonl"))
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch
    from scipy.stats import spearmanr

    torch.set_num_threads(args.threads)
    questions = load_questions(args.data, args.limit)

    start = time.perf_counter()
    hf = HFBackend.default(device="cpu")
    hf_load = time.perf_counter() - start
    start = time.perf_counter()
    lc = LlamaCppBackend.default(n_threads=args.threads)
    lc_load = time.perf_counter() - start
    print(f"questions={len(questions)} threads={args.threads} L=10 max_new_tokens=24")
    print(f"load: transformers {hf_load:.1f} s | llama.cpp {lc_load:.1f} s")

    a = _run("transformers", hf, _hf_plain, questions, args)
    b = _run("llama.cpp", lc, _llama_plain, questions, args)
    ratios = {key: b[key] / a[key] for key in ("plain", "guarded", "batched")}
    print(f"llama.cpp / transformers: plain {ratios['plain']:.2f}x, guarded one at a time "
          f"{ratios['guarded']:.2f}x, batched {ratios['batched']:.2f}x")  # fmt: skip
    _packing(lc, questions, args, a, b)

    same = [
        (x["score"], y["score"])
        for x, y in zip(a["esi"], b["esi"], strict=True)
        if x["scored"] and y["scored"] and x["answer"] == y["answer"]
    ]
    print(f"same greedy answer: {len(same)}/{len(questions)}")
    if len(same) >= 3:
        rho = spearmanr([s for s, _ in same], [t for _, t in same]).statistic
        diffs = [abs(s - t) for s, t in same]
        print(f"ESI Spearman where the answers match: {rho:.3f}; "
              f"mean |difference| {statistics.mean(diffs):.3f} (scores' mean "
              f"{statistics.mean(s for s, _ in same):.3f})")  # fmt: skip
    for x, y in zip(a["esi"], b["esi"], strict=True):
        if x["answer"] != y["answer"]:
            print(f"  differ: {x['answer'][:50]!r} | {y['answer'][:50]!r}")


if __name__ == "__main__":
    main()
