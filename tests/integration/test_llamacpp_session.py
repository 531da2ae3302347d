"""LlamaCppBackend's incremental forcing session against one-shot forcing, on SciQ.

The session decodes each piece of the answer in every row, the rows' KV cells kept
between pieces; one-shot forcing decodes the whole answer at once. Only llama.cpp's
rounding differs (a decode's shape moves the last digits): the ESI scores agree within
the bound packing rows is held to (``test_llamacpp_packing.py``; measured on 4 SciQ
answers: 0.0005 at most).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from esi_guard import LlamaCppBackend
from esi_guard.backends import Forced, ForcingRequest
from esi_guard.scoring import TopK, esi_score

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("llama_cpp")

ESI_BOUND = 0.006
"""Most an ESI score may move (packing's bound)."""


def joined_rows(pieces: list[TopK]) -> TopK:
    """One row's pieces, one after the other."""
    return TopK(np.concatenate([t.ids for t in pieces]), np.concatenate([t.values for t in pieces]))


def test_a_session_forced_by_thirds_scores_as_one_shot_forcing(sciq_questions: list[str]) -> None:
    backend = LlamaCppBackend.default(n_threads=1)
    prompts = [[{"role": "user", "content": q}] for q in sciq_questions[:4]]
    gens = backend.generate(prompts, max_new_tokens=24, top_k=20)
    moved = []
    for prompt, gen in zip(prompts, gens, strict=True):
        assert not isinstance(gen, Exception)
        question = prompt[0]["content"]
        variants = [[{"role": "user", "content": question[:i] + question[i + 1 :]}]
                    for i in (1, 5, 9)]  # fmt: skip
        whole = ForcingRequest(prompt, variants, list(gen.token_ids), include_original=True)
        (once,) = backend.teacher_force([whole], top_k=20)
        ids = list(gen.token_ids)
        cuts = [0, len(ids) // 3, 2 * len(ids) // 3, len(ids)]
        empty = replace(whole, answer_ids=[])
        with backend.open_forcing(empty, top_k=20, max_answer_tokens=24) as session:
            assert session.incremental
            parts = [session.extend(ids[a:b]) for a, b in itertools.pairwise(cuts)]
        assert isinstance(once, Forced) and once.original is not None
        pieces = [part for part in parts if isinstance(part, Forced)]
        assert len(pieces) == len(parts) and all(p.original is not None for p in pieces)
        rows = [[p.original for p in pieces]] + [[p.variants[r] for p in pieces]
                                                 for r in range(len(variants))]  # fmt: skip
        joined = [joined_rows([t for t in row if t is not None]) for row in rows]
        for got, reference in zip(joined, [once.original, *once.variants], strict=True):
            assert got.values.shape == reference.values.shape
            assert (got.ids[:, 0] == reference.ids[:, 0]).mean() >= 0.9
        incremental = esi_score(joined[0], joined[1:]).score
        moved.append(abs(incremental - esi_score(once.original, once.variants).score))
    assert max(moved) <= ESI_BOUND, moved
