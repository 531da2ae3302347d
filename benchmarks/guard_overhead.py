"""Per-question time of a guarded call against a plain greedy call, side by side in one run.

    python benchmarks/guard_overhead.py --data ../shared/data/sciq/test.jsonl --limit 20

Both use the same model, questions, prompt and max_new_tokens. The plain call is
transformers' greedy ``generate`` with no guard; the guarded call is ``ESIGuard.invoke``
(generation with top-k kept, L variants, one teacher-forcing pass, scoring), timed with
the shared prompt prefix's KV cache reused across the variants (the default) and without.
Prints the per-question times, their ratio, and the score distribution seen.

``--dtype float32 bfloat16`` runs the same calls on both, interleaved question by
question, and adds each dtype's time against float32's and how often the two give the
same answer (a CPU with AVX512-BF16 or AMX runs bfloat16 matrix products natively).
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
    parser.add_argument(
        "--dtype",
        nargs="+",
        default=["float32"],
        help="the model's dtype; several: each one's calls side by side",
    )
    args = parser.parse_args()

    questions = load_questions(args.data, args.limit)
    runs = [_Run(dtype, args.max_new_tokens, args.n_variants) for dtype in args.dtype]
    for run in runs:  # warm-up outside the timings
        run.time(questions[0])
        run.reset()
    for question in questions:
        for run in runs:
            run.time(question)

    print(f"questions={len(questions)} L={args.n_variants} max_new_tokens={args.max_new_tokens}")
    for run in runs:
        run.report(len(args.dtype) > 1)
    first = runs[0]
    for run in runs[1:]:
        same = sum(a == b for a, b in zip(first.answers, run.answers, strict=True))
        print(f"{run.dtype} / {first.dtype}: plain {run.mean('plain') / first.mean('plain'):.2f}x, "
              f"guarded {run.mean('guarded') / first.mean('guarded'):.2f}x; "
              f"same greedy answer {same}/{len(questions)}")  # fmt: skip


class _Run:
    """One dtype's backend, guard and timings."""

    def __init__(self, dtype: str, max_new_tokens: int, n_variants: int) -> None:
        self.dtype = dtype
        self.max_new_tokens = max_new_tokens
        self.backend = HFBackend.default(device="cpu", dtype=dtype)
        self.guard = ESIGuard(backend=self.backend, threshold=1.0,
                              max_new_tokens=max_new_tokens, n_variants=n_variants)  # fmt: skip
        self.reset()

    def reset(self) -> None:
        """Forget every call timed so far (the warm-up)."""
        self.times: dict[str, list[float]] = {"plain": [], "guarded": [], "no_reuse": []}
        self.answers: list[str] = []
        self.scores: list[float] = []

    def time(self, question: str) -> None:
        """The plain call, the guarded call, and the guarded call without prefix reuse."""
        prompt = [("system", SYSTEM), ("human", question)]
        start = time.perf_counter()
        plain_call(self.backend, _messages(question), self.max_new_tokens)
        self.times["plain"].append(time.perf_counter() - start)
        start = time.perf_counter()
        message = self.guard.invoke(prompt)
        self.times["guarded"].append(time.perf_counter() - start)
        self.backend.reuse_prefix = False  # the same call, every variant row run in full
        start = time.perf_counter()
        self.guard.invoke(prompt)
        self.times["no_reuse"].append(time.perf_counter() - start)
        self.backend.reuse_prefix = True
        self.answers.append(str(message.content))
        esi = message.response_metadata["esi"]
        if esi["scored"]:
            self.scores.append(esi["score"])

    def mean(self, kind: str) -> float:
        return statistics.mean(self.times[kind])

    def report(self, named: bool) -> None:
        p, g, n = self.mean("plain"), self.mean("guarded"), self.mean("no_reuse")
        tag = f"[{self.dtype}] " if named else ""
        print(f"{tag}plain greedy call              : {p * 1000:8.1f} ms/question")
        print(f"{tag}guarded call                   : {g * 1000:8.1f} ms/question")
        print(f"{tag}guarded call, no prefix reuse  : {n * 1000:8.1f} ms/question")
        print(f"{tag}guarded / plain                : {g / p:8.2f}x")
        print(f"{tag}guarded, no prefix reuse / plain: {n / p:7.2f}x")
        print(f"{tag}ESI overhead (guarded - plain) : {(g - p) * 1000:8.1f} ms/question "
              f"({(n - p) / max(g - p, 1e-9):.2f}x that without prefix reuse)")  # fmt: skip
        if self.scores:
            q = statistics.quantiles(self.scores, n=4)
            print(f"{tag}ESI scores: min={min(self.scores):.3f} q1={q[0]:.3f} median={q[1]:.3f} "
                  f"q3={q[2]:.3f} max={max(self.scores):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
