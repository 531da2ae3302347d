"""Per-question time of a guarded call against a plain greedy call, side by side in one run.

    python benchmarks/guard_overhead.py --data ../shared/data/sciq/test.jsonl --limit 20

Both use the same model, questions, prompt and max_new_tokens. The plain call is
transformers' greedy ``generate`` with no guard; the guarded call is ``ESIGuard.invoke``
(generation with top-k kept, L variants, one teacher-forcing pass, scoring), timed with
the shared prompt prefix's KV cache reused across the variants (the default) and without.
Prints the per-question times, their ratio, and the score distribution seen.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from esi_guard import ESIGuard, HFBackend
from esi_guard.backends import ChatMessage

SYSTEM = "Please directly answer the following question with one or few words."


def load_questions(path: Path, limit: int) -> list[str]:
    """The first ``limit`` questions of a shared QA file (SciQ, NQ-open or TriviaQA)."""
    questions = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            text = record.get("query") or record.get("question") or record.get("context", "")
            questions.append(text.removeprefix("Question: ").removesuffix("\nAnswer:"))
            if len(questions) == limit:
                break
    return questions


def plain_call(backend: HFBackend, messages: list[ChatMessage], max_new_tokens: int) -> str:
    """A plain greedy transformers call on the same model, no guard."""
    import torch

    ids = torch.tensor([backend.render(messages)])
    with torch.inference_mode():
        out = backend.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=backend.tokenizer.eos_token_id,
        )
    return str(backend.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def _messages(question: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=question)]


def main() -> None:
    """Time both calls on the same questions and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/sciq/test.jsonl"))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--n-variants", type=int, default=10)
    args = parser.parse_args()

    backend = HFBackend.default(device="cpu")
    guard = ESIGuard(
        backend=backend,
        threshold=1.0,
        max_new_tokens=args.max_new_tokens,
        n_variants=args.n_variants,
    )
    questions = load_questions(args.data, args.limit)
    # Warm-up outside the timings.
    plain_call(backend, _messages(questions[0]), args.max_new_tokens)
    guard.invoke([("system", SYSTEM), ("human", questions[0])])

    plain, guarded, no_reuse, scores = [], [], [], []
    for question in questions:
        prompt = [("system", SYSTEM), ("human", question)]
        start = time.perf_counter()
        plain_call(backend, _messages(question), args.max_new_tokens)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        message = guard.invoke(prompt)
        guarded.append(time.perf_counter() - start)
        backend.reuse_prefix = False  # the same call, every variant row run in full
        start = time.perf_counter()
        guard.invoke(prompt)
        no_reuse.append(time.perf_counter() - start)
        backend.reuse_prefix = True
        esi = message.response_metadata["esi"]
        if esi["scored"]:
            scores.append(esi["score"])

    p, g, n = statistics.mean(plain), statistics.mean(guarded), statistics.mean(no_reuse)
    print(f"questions={len(questions)} L={args.n_variants} max_new_tokens={args.max_new_tokens}")
    print(f"plain greedy call              : {p * 1000:8.1f} ms/question")
    print(f"guarded call                   : {g * 1000:8.1f} ms/question")
    print(f"guarded call, no prefix reuse  : {n * 1000:8.1f} ms/question")
    print(f"guarded / plain                : {g / p:8.2f}x")
    print(f"guarded, no prefix reuse / plain: {n / p:7.2f}x")
    print(f"ESI overhead (guarded - plain) : {(g - p) * 1000:8.1f} ms/question "
          f"({(n - p) / max(g - p, 1e-9):.2f}x that without prefix reuse)")  # fmt: skip
    if scores:
        quartiles = statistics.quantiles(scores, n=4)
        print(
            f"ESI scores: min={min(scores):.3f} q1={quartiles[0]:.3f} median={quartiles[1]:.3f} "
            f"q3={quartiles[2]:.3f} max={max(scores):.3f}"
        )


if __name__ == "__main__":
    main()
