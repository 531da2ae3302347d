"""Real clients on loopback: the openai SDK and LangChain's ChatOpenAI against the server."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from esi_guard import FakeBackend
from esi_guard.guard import DEFAULT_ABSTAIN_MESSAGE
from tests.unit.server.servers import ANSWERS, QUESTION, SHAKY, fake_guard, served, user


def test_the_openai_sdk_creates_streams_and_sees_errors() -> None:
    with served(fake_guard(action="abstain"), api_key="k") as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model="fake", messages=user(SHAKY))
        completion = raw.parse()
        assert raw.headers["X-ESI-Decision"] == "abstain"
        assert completion.choices[0].message.content == DEFAULT_ABSTAIN_MESSAGE
        assert completion.choices[0].finish_reason == "content_filter"
        assert completion.model_extra is not None
        assert completion.model_extra["esi"]["decision"] == "abstain"
        chunks = list(client.chat.completions.create(
            model="fake", messages=user(QUESTION), stream=True,
            stream_options={"include_usage": True},
        ))  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Paris"
        assert chunks[-1].usage is not None and chunks[-1].model_extra["esi"]["scored"]
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="fake", messages=user(QUESTION), seed=3)
        assert bad.value.code == "unknown_parameter" and bad.value.param == "seed"
        wrong = openai.OpenAI(base_url=base_url, api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="fake", messages=user(QUESTION))
        assert [m.id for m in client.models.list()] == ["fake"]


def test_chat_openai_invokes_streams_and_batches_through_one_batched_call() -> None:
    backend = FakeBackend(ANSWERS, sensitivity={SHAKY: 1.5})
    with served(fake_guard(backend=backend, action="abstain"), batch_window_ms=50) as base_url:
        model = ChatOpenAI(base_url=base_url, api_key="none", model="fake",  # type: ignore[arg-type]
                           include_response_headers=True, max_retries=0)  # fmt: skip
        message = model.invoke(QUESTION)
        assert message.content == "Paris"
        headers = {k.lower(): v for k, v in message.response_metadata["headers"].items()}
        assert headers["x-esi-decision"] == "accept"
        streamed = list(model.stream(SHAKY))
        assert "".join(str(c.content) for c in streamed) == DEFAULT_ABSTAIN_MESSAGE
        assert any(c.response_metadata.get("finish_reason") == "content_filter" for c in streamed)
        calls = len(backend.calls)
        answers = model.batch([QUESTION, SHAKY] * 4, config={"max_concurrency": 8})
        assert [a.content for a in answers] == ["Paris", DEFAULT_ABSTAIN_MESSAGE] * 4
        sizes = [size for method, size in backend.calls[calls:] if method == "generate"]
        assert max(sizes) > 1 and sum(sizes) == 8


class GatedBackend(FakeBackend):
    """A fake whose ``generate`` waits for ``gate``: the engine is busy until the test says."""

    def __init__(self) -> None:
        super().__init__(ANSWERS)
        self.gate = threading.Event()

    def generate(self, prompts: Any, **kwargs: Any) -> Any:
        self.gate.wait(10)
        return super().generate(prompts, **kwargs)


async def test_a_client_that_leaves_is_taken_out_of_the_queue() -> None:
    backend = GatedBackend()
    with served(fake_guard(backend=backend), warm_up=False, max_batch=1) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as c:
            busy = asyncio.ensure_future(c.post("/chat/completions", json=body(QUESTION)))
            await asyncio.sleep(0.3)  # its batch holds the engine
            with pytest.raises(httpx.ReadTimeout):
                await c.post("/chat/completions", json=body(SHAKY), timeout=0.5)
            await asyncio.sleep(0.3)  # the server notices the client left
            backend.gate.set()
            assert (await busy).status_code == 200
            metrics = (await c.get(base_url.removesuffix("/v1") + "/metrics")).text
    assert [size for method, size in backend.calls if method == "generate"] == [1]
    assert 'endpoint="/v1/chat/completions",status="499"} 1.0' in metrics


def body(text: str) -> dict[str, Any]:
    return {"model": "fake", "messages": user(text)}
