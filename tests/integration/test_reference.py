"""The library's ESI equals a plain per-token reference implementation of the paper's formula.

The reference is written here, apart from the library: one full-vocabulary forward pass
per prompt (no batching, no padding, no KV cache), then top-k, union support with the
min/10 fill, softmax, Hellinger distance and entropy weights, in plain Python loops.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from esi_guard import ESIGuard, HFBackend

pytestmark = [pytest.mark.integration, pytest.mark.slow]

K = 100
SYSTEM = "Please directly answer the following question with one or few words."


def forward_logits(backend: HFBackend, messages: list[dict[str, str]], answer: list[int]) -> Any:
    """Full-vocabulary logits at each answer position for one prompt, computed alone."""
    import torch

    tokenizer = backend.tokenizer
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + answer])
    with torch.inference_mode():
        logits = backend.model(input_ids=ids).logits[0]
    start = len(prompt_ids) - 1
    return logits[start : start + len(answer)].double()


def top_k(row: Any, k: int) -> dict[int, float]:
    values, ids = row.topk(k)
    return dict(zip(ids.tolist(), values.tolist(), strict=True))


def fill(kept: dict[int, float]) -> float:
    low = min(kept.values())
    return low / 10 if low > 0 else low - math.log(10)


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def reference_esi(
    backend: HFBackend, messages: list[dict[str, str]], variants: list[str], answer: list[int]
) -> float:
    original = forward_logits(backend, messages, answer)
    per_variant = [
        forward_logits(backend, [*messages[:-1], {"role": "user", "content": v}], answer)
        for v in variants
    ]
    total = 0.0
    for t in range(len(answer)):
        p_top = top_k(original[t], K)
        alpha = -sum(p * math.log(p) for p in softmax(list(p_top.values())) if p > 0)
        for logits in per_variant:
            q_top = top_k(logits[t], K)
            support = sorted(set(p_top) | set(q_top))
            p = softmax([p_top.get(i, fill(p_top)) for i in support])
            q = softmax([q_top.get(i, fill(q_top)) for i in support])
            hellinger = math.sqrt(
                0.5 * sum((math.sqrt(a) - math.sqrt(b)) ** 2 for a, b in zip(p, q, strict=False))
            )
            total += alpha * hellinger
    return total / (len(variants) * len(answer))


def test_library_matches_reference_on_six_real_questions(
    hf_backend: HFBackend, sciq_questions: list[str]
) -> None:
    guard = ESIGuard(backend=hf_backend, threshold=0.5, max_new_tokens=12, top_k=K)
    questions = sciq_questions[10:16]  # each forced one variant at a time, unbatched
    inputs = [[("system", SYSTEM), ("human", q)] for q in questions]
    gaps = []
    for question, message in zip(questions, guard.batch(inputs), strict=True):
        esi = message.response_metadata["esi"]
        assert esi["scored"], esi["reason"]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        expected = reference_esi(hf_backend, messages, esi["variants"], esi["answer_token_ids"])
        gaps.append(abs(esi["score"] - expected))
        assert esi["score"] == pytest.approx(expected, abs=1e-4), question
    print(f"\nreference agreement on {len(gaps)} questions: max |diff| = {max(gaps):.2e}")
