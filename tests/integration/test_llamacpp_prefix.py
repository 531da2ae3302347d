"""The template-prefix cache: what the chat template writes before the question is computed
once and kept, and a prompt's numbers are the same bits whether it came from there or not.

On the embedded model (llama.cpp, one thread): generation and teacher forcing through a
backend that keeps prefixes, one that keeps none (``prefix_cache=1``: every prefix
computed anew, in the same decodes) and one without the template prefix at all
(``prefix_cache=0``: prompts decoded whole, as before the cache).
"""

from __future__ import annotations

import numpy as np
import pytest

from esi_guard import LlamaCppBackend, SkipOneChar, esi_score
from esi_guard.backends import Forced, ForcingRequest, Generation

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("llama_cpp")

SYSTEM = "Please directly answer the following question with one or few words."


def chat(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def answers(backend: LlamaCppBackend, prompts: list[list[dict[str, str]]]) -> list[Generation]:
    out = backend.generate(prompts, max_new_tokens=12, top_k=20)  # type: ignore[arg-type]
    assert all(isinstance(g, Generation) for g in out)
    return out  # type: ignore[return-value]


def forced(backend: LlamaCppBackend, question: str, answer: Generation) -> Forced:
    variants = [chat(v) for v in SkipOneChar().variants(question, 6, seed=0)]
    request = ForcingRequest(prompt=chat(question), variants=variants,  # type: ignore[arg-type]
                             answer_ids=answer.token_ids, include_original=True)  # fmt: skip
    (out,) = backend.teacher_force([request], top_k=20)
    assert isinstance(out, Forced)
    return out


def same(a: Generation, b: Generation) -> bool:
    return (a.token_ids == b.token_ids and np.array_equal(a.topk.ids, b.topk.ids)
            and np.array_equal(a.topk.values, b.topk.values))  # fmt: skip


def test_a_kept_prefix_gives_the_bits_of_one_computed_anew(sciq_questions: list[str]) -> None:
    """Three questions under one system prompt: the 2nd and 3rd find its prefix kept; their
    answers, every step's top-k and the forced rows equal a backend that keeps nothing,
    bit for bit, one at a time and batched."""
    kept = LlamaCppBackend.default(n_threads=1)
    anew = LlamaCppBackend.default(n_threads=1, prefix_cache=1)  # too small to keep one
    prompts = [chat(q) for q in sciq_questions[:3]]
    first = [answers(kept, [p])[0] for p in prompts]
    assert kept._engine.prefix_hits == 2
    for a, b in zip(first, answers(anew, prompts), strict=True):
        assert same(a, b)
    for a, b in zip(first, answers(kept, prompts), strict=True):  # batched, all kept
        assert same(a, b)
    assert anew._engine.prefix_hits == 0
    mine = forced(kept, sciq_questions[0], first[0])
    theirs = forced(anew, sciq_questions[0], first[0])
    assert mine.original is not None and theirs.original is not None
    pairs = zip([mine.original, *mine.variants], [theirs.original, *theirs.variants], strict=True)
    for x, y in pairs:
        assert np.array_equal(x.ids, y.ids) and np.array_equal(x.values, y.values)
    kept.close()
    anew.close()


def test_scores_with_the_cache_are_within_rounding_of_prompts_decoded_whole(
    sciq_questions: list[str],
) -> None:
    """Against ``prefix_cache=0`` (the prompt in one decode, the shared prefix in the
    forcing decode): the same answers, and ESI within llama.cpp's rounding (0.0012 at most
    on 20 SciQ questions when measured; the bound here leaves room for other CPUs)."""
    cached = LlamaCppBackend.default(n_threads=1)
    whole = LlamaCppBackend.default(n_threads=1, prefix_cache=0)
    for question in sciq_questions[:4]:
        (a,), (b,) = answers(cached, [chat(question)]), answers(whole, [chat(question)])
        assert a.token_ids == b.token_ids
        x, y = forced(cached, question, a), forced(whole, question, b)
        assert x.original is not None and y.original is not None
        assert esi_score(x.original, x.variants).score == pytest.approx(
            esi_score(y.original, y.variants).score, abs=0.01
        )
    assert whole._engine.prefix_hits == 0
    cached.close()
    whole.close()


def test_the_cache_keeps_what_its_budget_holds_and_drops_the_oldest(
    sciq_questions: list[str],
) -> None:
    """Two system prompts in turn: a budget of one prefix's cells keeps only the last, so
    going back misses; the default budget keeps both."""
    other = "Answer in as few words as you can."
    prompts = [chat(sciq_questions[0]), chat(sciq_questions[0], other), chat(sciq_questions[0])]
    small = LlamaCppBackend.default(n_threads=1)
    answers(small, prompts[:1])
    size = sum(len(kept) for kept in small._engine._prefixes.values())
    small.close()
    for budget, hits in ((size, 0), (64 * 2**20, 1)):
        backend = LlamaCppBackend.default(n_threads=1, prefix_cache=budget)
        for prompt in prompts:
            answers(backend, [prompt])
        assert backend._engine.prefix_hits == hits, budget
        backend.close()
