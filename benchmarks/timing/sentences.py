"""Scored streaming by sentence: time to the first sentence and to the whole answer.

    python -m benchmarks.timing sentences --data <sciq test.jsonl> --limit 6

On the embedded model (one thread), per prompt of ``--questions`` SciQ questions asking
one sentence each, side by side in one run: the non-streamed guarded call (``invoke``),
the sentence stream (``stream_mode="sentences"``: time to the first sentence shown and
to the last chunk), and the same stream with the backend's forcing session replaced by
the base class's default, which re-forces the answer so far at every sentence (correct,
not incremental). The threshold is set high so that every sentence is shown (the timing
of the mechanism, not of a decision). Goals (issue 52): for a ``k``-sentence answer, the
first sentence within ``1.3/k`` of the non-streamed call, the whole answer within 1.1x;
scores per sentence adding at most 2% to a guarded call (``sentence_work_over_call``: the
per-sentence steps timed on each answer, over the call's own time).
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from esi_guard import ESIGuard, LlamaCppBackend, TopK
from esi_guard.backends import Backend
from esi_guard.calibration.data import load_examples
from esi_guard.combined import token_logprobs
from esi_guard.sentences import score_sentences

__all__ = ["add_arguments", "measure"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=6, help="prompts")
    parser.add_argument("--questions", type=int, default=3, help="questions per prompt")
    parser.add_argument("--threshold", type=float, default=1.0)


def prompts(path: Path, limit: int, k: int) -> list[str]:
    """``limit`` prompts of ``k`` questions each, asking one sentence per question."""
    questions = [e.question for e in load_examples(path, limit=limit * k)]
    return [
        f"Answer these {k} questions, one sentence each, numbered: "
        + " ".join(f"{j + 1}. {q}" for j, q in enumerate(questions[i * k : (i + 1) * k]))
        for i in range(limit)
    ]


def streamed(guard: ESIGuard, prompt: str) -> tuple[float | None, float, int]:
    """Seconds to the first sentence shown (None: none), to the last chunk; sentences."""
    start = time.perf_counter()
    first = None
    last: Any = None
    for chunk in guard.stream(prompt):
        if first is None and chunk.response_metadata.get("esi", {}).get("shown"):
            first = time.perf_counter() - start
        last = chunk
    return first, time.perf_counter() - start, len(last.response_metadata["esi"]["sentences"])


def sentence_work(backend: Backend, esi: dict[str, Any], repeats: int = 20) -> float:
    """Seconds the scores per sentence add to a guarded call (the mean of ``repeats``).

    What the guard does beyond the whole answer's score: the tokens' offsets in the
    answer's text, the tokens' log-probabilities on their top-100 rows, the split and each
    sentence's means (:func:`~esi_guard.sentences.score_sentences`).
    """
    ids, answer = esi["answer_token_ids"], esi["answer"]
    rng = np.random.default_rng(0)
    top = TopK(rng.integers(0, 50000, (len(ids), 100)), rng.normal(size=(len(ids), 100)))
    scores = np.asarray(esi["token_scores"])
    start = time.perf_counter()
    for _ in range(repeats):
        ends = backend.token_offsets(ids, answer)
        logprobs = token_logprobs(top, ids, "logits")
        if ends is not None:
            score_sentences(answer, ends, scores, logprobs, np.ones(len(ids)))
    return (time.perf_counter() - start) / repeats


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Print the timings and return them."""
    backend = LlamaCppBackend.default(n_threads=1)
    plain = ESIGuard(backend=backend, threshold=args.threshold)
    stream = ESIGuard(backend=backend, threshold=args.threshold, stream_mode="sentences")
    rows = []
    asked = prompts(args.data, args.limit + 1, args.questions)
    for number, prompt in enumerate(asked):
        start = time.perf_counter()
        message = plain.invoke(prompt)
        whole = time.perf_counter() - start
        first, total, k = streamed(stream, prompt)
        vars(backend)["open_forcing"] = partial(Backend.open_forcing, backend)
        try:
            first_default, total_default, _ = streamed(stream, prompt)
        finally:
            del vars(backend)["open_forcing"]
        if number == 0:  # warm-up: contexts made, caches filled
            continue
        esi = message.response_metadata["esi"]
        tokens = len(esi["answer_token_ids"])
        rows.append({"k": k, "call": whole, "first": first, "total": total, "tokens": tokens,
                     "first_default": first_default, "total_default": total_default,
                     "sentence_work": sentence_work(backend, esi)})  # fmt: skip
    mean = statistics.mean
    several = [r for r in rows if r["k"] >= 2 and r["first"] is not None]
    print(f"prompts={len(rows)} ({len(several)} with 2+ sentences shown), questions per prompt="
          f"{args.questions}, embedded model, n_threads=1")  # fmt: skip
    print(f"answer tokens, mean                    : {mean(r['tokens'] for r in rows):6.1f}")
    print(f"sentences per answer, mean             : {mean(r['k'] for r in rows):6.2f}")
    print(f"non-streamed call, mean                : {mean(r['call'] for r in rows):6.2f} s")
    print(f"sentence stream, first sentence, mean  : {mean(r['first'] for r in several):6.2f} s")
    print(f"sentence stream, whole answer, mean    : {mean(r['total'] for r in rows):6.2f} s")
    print(f"default session, first sentence, mean  : "
          f"{mean(r['first_default'] for r in several):6.2f} s")  # fmt: skip
    print(
        f"default session, whole answer, mean    : {mean(r['total_default'] for r in rows):6.2f} s"
    )
    print(f"scores per sentence, mean              : "
          f"{1000 * mean(r['sentence_work'] for r in rows):6.2f} ms")  # fmt: skip
    ratios = {
        "sentence_work_over_call": mean(r["sentence_work"] / r["call"] for r in rows),
        "first_over_call": mean(r["first"] / r["call"] for r in several),
        "goal_first_over_call": mean(1.3 / r["k"] for r in several),
        "total_over_call": mean(r["total"] / r["call"] for r in rows),
        "default_first_over_call": mean(r["first_default"] / r["call"] for r in several),
        "default_total_over_call": mean(r["total_default"] / r["call"] for r in rows),
    }
    for name, value in ratios.items():
        print(f"{name:<40}: {value:6.3f}")
    return {"rows": rows, "ratios": ratios, "questions": args.questions}
