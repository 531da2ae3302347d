"""Sequential ESI's bookkeeping across rounds (``_pipeline/rounds.py``)."""

from __future__ import annotations

import numpy as np

from esi_guard._pipeline.items import GuardedPrompt, Item
from esi_guard._pipeline.rounds import Rounds
from esi_guard.backends import ChatMessage, Forced, ForcingRequest
from esi_guard.scoring import TopK


def test_merged_rounds_keep_an_approximate_backends_zero_exact_positions() -> None:
    prompt = GuardedPrompt((ChatMessage(role="user", content="Name a lake."),), 0)
    item = Item(prompt, answer="Lake Geneva", answer_ids=(5, 6))
    item.variants = ["Nme a lake.", "Name a lke."]
    rounds = Rounds([item])
    live = rounds.start(2, last=True)
    topk = TopK(np.zeros((2, 1), dtype=np.int64), np.zeros((2, 1)))
    request = ForcingRequest(prompt.messages, [[], []], [5, 6])
    rounds.record([(item, request)], [Forced(variants=[topk, topk], observed=[0, 2])])
    assert live == [item] and rounds.merged(item).observed == [0, 2]
    assert rounds.work(item) == {"forced_variants": 2, "forced_tokens": 4}
