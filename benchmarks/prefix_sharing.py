"""What a prefix tree over the variant rows would save in teacher forcing (token counts only).

    python benchmarks/prefix_sharing.py --limit 200

A variant shares the original prompt up to its first edited character. The backends run
once the prefix ALL rows of a request share (chat template, system prompt, the question's
unedited start), then each row from there, the answer included. A prefix tree on the
original prompt's KV cache (kept from generation) would start each row at its own first
difference instead. This counts the forced tokens both ways, with the embedded model's
tokenizer, the CLI's system prompt, SOC L=10 and 24-token answers; no model is run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from esi_guard import SkipOneChar
from esi_guard.backends import ChatMessage
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.calibration.data import load_examples
from esi_guard.calibration.prompts import DEFAULT_SYSTEM

SETS = ("sciq/test.jsonl", "triviaqa/subset.jsonl", "nq_open/dev.jsonl")


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    """Count forced tokens with the shared-prefix pass and with a prefix tree, per data set."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--answer-tokens", type=int, default=24)
    args = parser.parse_args()
    tokenizer = LlamaCppBackend.default(n_threads=1, n_ctx=512)
    soc = SkipOneChar()

    def render(question: str) -> list[int]:
        return tokenizer.render([ChatMessage(role="system", content=DEFAULT_SYSTEM),
                                 ChatMessage(role="user", content=question)])  # fmt: skip

    for name in SETS:
        now = tree = 0
        for example in load_examples(args.data_dir / name, limit=args.limit, seed=0):
            original = render(example.question)
            texts = dict.fromkeys(soc.variants(example.question, 10, seed=0))
            rows = [render(text) for text in texts if text != example.question]
            if not rows:
                continue
            shared = min(_common(row, rows[0]) for row in rows)
            now += shared + sum(len(row) - shared + args.answer_tokens for row in rows)
            tree += sum(len(row) - _common(row, original) + args.answer_tokens for row in rows)
        print(f"{name}: forced tokens {now} now, {tree} with a prefix tree: "
              f"{1 - tree / now:.1%} fewer")  # fmt: skip


if __name__ == "__main__":
    main()
