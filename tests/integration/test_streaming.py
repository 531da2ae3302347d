"""Live streaming on the real embedded model: pieces while generating, then the score."""

from __future__ import annotations

import time
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler

from esi_guard import ESIGuard, HFBackend

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTION = [
    ("system", "Please directly answer the following question with one or few words."),
    ("human", "Which gas do plants absorb from the air?"),
]


@pytest.fixture(scope="module")
def guard(hf_backend: HFBackend) -> ESIGuard:
    return ESIGuard(backend=hf_backend, threshold=0.3, max_new_tokens=24, stream_mode="live",
                    action="flag", on_error="flag")  # fmt: skip


def test_pieces_come_before_the_score_and_join_to_the_invoked_answer(guard: ESIGuard) -> None:
    chunks = list(guard.stream(QUESTION))
    assert len(chunks) > 2 and chunks[-1].chunk_position == "last"
    assert all(not c.response_metadata.get("esi") for c in chunks[:-1])
    message = guard.invoke(QUESTION)
    assert "".join(str(c.content) for c in chunks) == message.content
    esi = chunks[-1].response_metadata["esi"]
    assert esi["score"] == pytest.approx(message.response_metadata["esi"]["score"], abs=1e-9)


async def test_astream_events_show_the_answer_tokens_and_the_steps(guard: ESIGuard) -> None:
    events = [event async for event in guard.astream_events(QUESTION, version="v2")]
    kinds = [(event["event"], event["name"]) for event in events]
    tokens = [i for i, (kind, _) in enumerate(kinds) if kind == "on_chat_model_stream"]
    assert len(tokens) > 2
    steps = [name for kind, name in kinds if kind == "on_chain_start"]
    assert steps == ["esi_generate", "esi_intervene", "esi_score"]
    # the answer's tokens stream while the generate step runs, before any scoring
    assert kinds.index(("on_chain_start", "esi_generate")) < tokens[0]
    assert tokens[1] < kinds.index(("on_chain_start", "esi_intervene"))


class Tokens(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.events: list[str] = []

    async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.events.append("token")

    async def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.events.append(str(kwargs.get("name")))


async def test_a_live_invoke_reports_tokens_while_generating_then_the_steps(
    guard: ESIGuard,
) -> None:
    seen = Tokens()
    await guard.ainvoke(QUESTION, {"callbacks": [seen]})
    events = seen.events
    assert events[0] == "esi_generate" and events.count("token") > 2
    assert events.index("esi_intervene") > max(i for i, e in enumerate(events) if e == "token")
    assert events[-1] == "esi_score"


def test_a_stream_closed_midway_leaves_the_backend_usable(guard: ESIGuard) -> None:
    stream: Any = guard.stream(QUESTION)
    next(stream)
    stream.close()
    started = time.perf_counter()
    assert guard.invoke(QUESTION).response_metadata["esi"]["scored"]
    assert time.perf_counter() - started < 60
