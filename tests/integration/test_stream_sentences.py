"""Scored streaming by sentence on the real embedded model: the streamed answer's
sentences are the non-streamed answer's.

Three SciQ questions per prompt, one sentence each. The stream forces each sentence
through the llama.cpp forcing session as soon as the next one starts; the whole call
forces the answer once. Texts, spans and token ranges are the same; scores differ by
llama.cpp's rounding of a different decode shape only.
"""

from __future__ import annotations

import pytest

from esi_guard import ESIGuard, LlamaCppBackend

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("llama_cpp")

SCORE_BOUND = 0.006
"""Most a sentence's score may move (the session's forcing against one-shot forcing)."""


def prompts(questions: list[str], k: int = 3, n: int = 3) -> list[str]:
    groups = [questions[i * k : (i + 1) * k] for i in range(n)]
    return [
        f"Answer these {k} questions, one sentence each, numbered: "
        + " ".join(f"{j + 1}. {q}" for j, q in enumerate(group))
        for group in groups
    ]


def test_streamed_sentences_are_the_non_streamed_answers(sciq_questions: list[str]) -> None:
    backend = LlamaCppBackend.default(n_threads=1)
    plain = ESIGuard(backend=backend, action="redact")
    streaming = ESIGuard(backend=backend, action="redact", stream_mode="sentences")
    several = 0
    for prompt in prompts(sciq_questions):
        message = plain.invoke(prompt)
        chunks = list(streaming.stream(prompt))
        last = chunks[-1]
        expected = message.response_metadata["esi"]["sentences"]
        got = last.response_metadata["esi"]["sentences"]
        several += len(expected) >= 3
        key = ("text", "start", "end", "first_token", "end_token")
        assert [[s[k] for k in key] for s in got] == [[s[k] for k in key] for s in expected]
        for mine, theirs in zip(got, expected, strict=True):
            assert mine["score"] == pytest.approx(theirs["score"], abs=SCORE_BOUND)
        # What was shown: the accepted sentences, each with the score the end gives it.
        shown = [s for c in chunks[:-1] for s in c.response_metadata["esi"]["shown"]]
        assert [c.content for c in chunks[:-1]] == [s["text"] for s in shown]
        assert shown == [s for s in got if s["decision"] == "accept"]
        threshold = last.response_metadata["esi"]["threshold"]
        close = [abs(s["score"] - threshold) < SCORE_BOUND for s in expected]
        decisions = [(s["decision"], t["decision"]) for s, t in zip(got, expected, strict=True)]
        assert all(a == b for (a, b), near in zip(decisions, close, strict=True) if not near)
        if not any(close):
            assert "".join(s["text"] for s in shown).rstrip() == message.content or (
                message.response_metadata["esi"]["decision"] == "abstain" and not shown
            )
    assert several >= 2  # the prompts did give answers of several sentences
