"""LlamaCppBackend's rows packed into one decode against each row alone, on SciQ.

Packing changes only llama.cpp's rounding (a token's numbers depend on the size of the
decode it falls in): the greedy answers are the same, the ESI scores and the forced
top-k logits move by a bounded amount.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from esi_guard import ESIGuard, LlamaCppBackend
from esi_guard.backends import Forced, ForcingRequest
from esi_guard.exceptions import BackendError

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("llama_cpp")

SYSTEM = "Please directly answer the following question with one or few words."
ESI_BOUND = 0.009
"""Most an ESI score may move (measured: 0.0068; 0.0043 before the template prefix was
computed in a decode of its own, the mean the same, 0.0017 and 0.0016)."""
LOGIT_BOUND = 2.5
"""Most a forced top-k logit may move (measured: 1.14; 2.13 before the template prefix)."""


def test_packed_rows_move_scores_and_logits_by_llama_cpps_rounding_only(
    sciq_questions: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """6 SciQ questions, L = 10, 24 answer tokens, the embedded model, one thread.

    Measured on 20, packed against rows alone (llama-cpp-python 0.3.36, AVX-512 CPU): the
    ESI scores differ by 0.0068 at most (0.0017 on average), a forced top-k logit (a row's
    k-th largest against the k-th largest) by 1.14 at most. The greedy answers are the
    same (generation is not packed). The bounds are maxima, so 6 questions (66 rows each
    way, 30% of the time; the model tier's third-slowest test at 10) check them as well.
    """
    backend = LlamaCppBackend.default(n_threads=1, forcing_precision="model")
    forced: dict[bool, list[Forced | BackendError]] = {True: [], False: []}
    force = backend.teacher_force

    def spy(requests: Sequence[ForcingRequest], *, top_k: int) -> list[Forced | BackendError]:
        results = force(requests, top_k=top_k)
        forced[backend.pack_rows] += results
        return results

    monkeypatch.setattr(backend, "teacher_force", spy)
    guard = ESIGuard(backend=backend, threshold=1.0, max_new_tokens=24, n_variants=10, seed=0)
    prompts = [[("system", SYSTEM), ("human", q)] for q in sciq_questions[:6]]
    esi = {}
    for pack in (True, False):
        backend.pack_rows = pack
        esi[pack] = [m.response_metadata["esi"] for m in guard.batch(prompts)]
    backend.close()
    assert [e["answer"] for e in esi[True]] == [e["answer"] for e in esi[False]]
    assert all(e["scored"] for e in esi[True] + esi[False])
    scores = np.array([[e["score"] for e in esi[pack]] for pack in (True, False)])
    logits = 0.0
    for packed, alone in zip(forced[True], forced[False], strict=True):
        assert isinstance(packed, Forced) and isinstance(alone, Forced)
        for a, b in zip(packed.variants, alone.variants, strict=True):
            logits = max(logits, float(np.abs(a.values - b.values).max()))
    assert np.abs(scores[0] - scores[1]).max() <= ESI_BOUND
    assert logits <= LOGIT_BOUND
