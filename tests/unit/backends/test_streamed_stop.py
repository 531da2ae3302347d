"""Streamed text never runs ahead of the final answer when a stop sequence starts inside
a token that also holds text before it (Llama 3 / Qwen vocabularies: ".\n", ".\n\n")."""

from __future__ import annotations

import numpy as np

from esi_guard.backends._engine_helpers import StreamedText, finish_greedy, text_pieces
from esi_guard.backends._types import AnswerPiece, Generation
from esi_guard.scoring import TopK

VOCAB = {1: "Paris", 2: ".\n", 3: "\n", 4: "Question", 5: ":"}


def decode(ids: object) -> str:
    return "".join(VOCAB[i] for i in ids)  # type: ignore[attr-defined]


def one(token: int) -> AnswerPiece:
    return AnswerPiece((token,), TopK(np.zeros((1, 1), np.int64), np.zeros((1, 1))))


def test_streamed_pieces_join_to_the_stopped_answer() -> None:
    tokens = [1, 2, 3, 4, 5]
    gen = finish_greedy(
        tokens, TopK(np.zeros((5, 1), np.int64), np.zeros((5, 1))), is_end=lambda _: False,
        decode=decode, stop=["\n\n"], prompt_tokens=3, model_id="m",
    )  # fmt: skip
    assert isinstance(gen, Generation) and gen.text == "Paris" and gen.token_ids == (1,)
    # the backends stream each token but the last, then the Generation
    items = [one(t) for t in tokens[:-1]] + [gen]
    pieces = [p for p in text_pieces(items, decode, ["\n\n"]) if isinstance(p, str)]
    assert "".join(pieces) == gen.text


def test_sent_text_is_never_ahead_of_the_answer() -> None:
    for strip in (True, False):
        text = StreamedText(decode, ["\n\n"], strip=strip)
        for token in [1, 2, 3, 4]:
            text.add([token])
            assert "Paris".startswith(text.sent), (strip, text.sent)
