"""LlamaCppBackend answers several prompts together: the same answers as one at a time.

``generate`` decodes each prompt alone in an empty KV cache, then steps every answer's
next token in one decode. The greedy tokens, every step's top-k logits and the hidden
states read along the way must equal, bit for bit, those of each prompt alone: the
guard's scores and a threshold file's numbers must not depend on what a request is
batched with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from esi_guard import LlamaCppBackend
from esi_guard.backends import Generation
from esi_guard.backends.hidden import HiddenSpec
from esi_guard.calibration.data import load_examples

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("llama_cpp")

SYSTEM = "Please directly answer the following question with one or few words."


def chat(question: str) -> list[dict[str, str]]:
    """The messages of one question."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def passage_prompts(shared_data: Path, n: int) -> list[list[dict[str, str]]]:
    """RAG prompts on SQuAD 2.0: long passages, so a group's cells pass one 256-cell pad."""
    examples = load_examples(shared_data / "squad2" / "dev.json", seed=0)[:n]
    return [chat(f"{e.context}\n\n{e.question}") for e in examples]


def test_prompts_answered_together_get_their_answers_alone_to_the_bit(
    sciq_questions: list[str], shared_data: Path
) -> None:
    """8 SciQ questions and 4 SQuAD passages in one call (several groups) against each
    prompt alone: tokens, top-k ids and logits, hidden states equal; one prompt too long
    for the context gets its error in place, the others their answers."""
    backend = LlamaCppBackend.default(n_ctx=1024)
    hidden = HiddenSpec(layers=(15, -1), positions=("prompt_last", "answer_mean"))
    prompts = [chat(q) for q in sciq_questions[:8]]
    prompts += passage_prompts(shared_data, 4)
    prompts.insert(5, chat("word " * 1100))
    together = backend.generate(prompts, max_new_tokens=16, top_k=20, hidden=hidden)
    alone = [backend.generate([p], max_new_tokens=16, top_k=20, hidden=hidden)[0] for p in prompts]
    backend.close()
    assert len(together) == len(prompts)
    assert type(together[5]).__name__ == type(alone[5]).__name__ == "ContextLengthError"
    for index, (a, b) in enumerate(zip(together, alone, strict=True)):
        if index == 5:
            continue
        assert isinstance(a, Generation) and isinstance(b, Generation), index
        assert a.token_ids == b.token_ids, index
        assert np.array_equal(a.topk.ids, b.topk.ids), index
        assert np.array_equal(a.topk.values, b.topk.values), index
        assert a.hidden is not None and b.hidden is not None
        assert np.array_equal(a.hidden.values, b.hidden.values), index
