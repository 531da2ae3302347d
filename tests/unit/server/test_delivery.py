"""What a decided answer becomes on the server, where it disagreed with apply()."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda

from esi_guard import FakeBackend
from tests.unit.server.servers import QUESTION, SHAKY, client, fake_guard, user

CHAT = "/v1/chat/completions"


def events(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_live_stream_refuses_a_prompt_with_the_status_a_plain_request_gets(
    stream: bool,
) -> None:
    system_only = [{"role": "system", "content": "Be brief."}]
    async with client(fake_guard(action="flag", on_error="flag")) as c:
        r = await c.post(CHAT, json={"model": "fake", "messages": system_only, "stream": stream})
    assert r.status_code == 400  # the stream was a 200 whose only event was the error
    assert r.json()["error"]["code"] == "invalid_prompt"
    assert r.headers["X-ESI-Decision"] == "error"


async def test_a_live_stream_whose_engine_fails_before_its_first_token_is_an_http_error() -> None:
    backend = FakeBackend({QUESTION: "Paris"}, failures={QUESTION: "generate"})
    async with client(fake_guard(backend=backend, action="flag", on_error="flag")) as c:
        plain = await c.post(CHAT, json={"model": "fake", "messages": user(QUESTION)})
        live = await c.post(CHAT, json={"model": "fake", "messages": user(QUESTION),
                                        "stream": True})  # fmt: skip
    assert live.status_code == plain.status_code == 500
    assert live.json()["error"]["code"] == plain.json()["error"]["code"]


async def test_a_live_stream_still_streams_its_tokens_and_scored_ending() -> None:
    backend = FakeBackend({QUESTION: "Paris is the capital"})
    async with client(fake_guard(backend=backend, action="flag", on_error="flag")) as c:
        r = await c.post(CHAT, json={"model": "fake", "messages": user(QUESTION), "stream": True,
                                     "stream_options": {"include_usage": True}})  # fmt: skip
    assert r.status_code == 200 and r.headers["X-ESI-Decision"] == "pending"
    lines = events(r)
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Paris is the capital"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 4 and chunks[-1]["esi"]["decision"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_routed_answer_with_a_reasoning_block_is_served_as_its_text(stream: bool) -> None:
    blocks: list[Any] = [{"type": "reasoning", "reasoning": "Tübingen is on the Neckar."},
                         {"type": "text", "text": "The Neckar."}]  # fmt: skip
    fallback = RunnableLambda(lambda _: AIMessage(content=blocks))
    async with client(fake_guard(action="route", fallback=fallback)) as c:
        r = await c.post(CHAT, json={"model": "fake", "messages": user(SHAKY), "stream": stream})
    assert r.status_code == 200 and r.headers["X-ESI-Decision"] == "route"
    assert "The Neckar." in r.text and "Tübingen is on" not in r.text


async def test_a_too_deeply_nested_body_is_a_400_not_a_500() -> None:
    async with client(fake_guard()) as c:
        r = await c.post(CHAT, content=b"[" * 100_000 + b"]" * 100_000,
                         headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
