"""``esi-guard serve`` on the embedded model in process (llama.cpp), from real clients."""

from __future__ import annotations

import math

import openai
import pytest
from langchain_openai import ChatOpenAI

from esi_guard import ESIGuard, LlamaCppBackend
from tests.unit.serve.servers import served, user

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What gas do plants absorb from the air?",
    "Which planet is known as the Red Planet?",
]


def test_the_embedded_model_served_to_the_openai_sdk_and_chat_openai() -> None:
    backend = LlamaCppBackend.default(n_threads=1)
    guard = ESIGuard(backend=backend, threshold=0.5, n_variants=3, max_new_tokens=12)
    direct = guard.invoke(QUESTIONS[0])
    with served(guard, batch_window_ms=50) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        name = client.models.list().data[0].id
        completion = client.chat.completions.create(model=name, messages=user(QUESTIONS[0]))
        esi = completion.model_extra["esi"]  # type: ignore[index]
        assert esi["scored"] and math.isfinite(esi["score"])
        assert esi["decision"] == ("accept" if esi["score"] <= 0.5 else "flag")
        assert completion.choices[0].message.content == direct.content  # the same greedy answer
        assert esi["score"] == pytest.approx(direct.response_metadata["esi"]["score"], abs=1e-6)
        model = ChatOpenAI(base_url=base_url, api_key="none", model=name, max_retries=0)  # type: ignore[arg-type]
        streamed = "".join(str(c.content) for c in model.stream(QUESTIONS[0]))
        assert streamed == completion.choices[0].message.content
        answers = model.batch(QUESTIONS, config={"max_concurrency": 4})
        assert answers[0].content == completion.choices[0].message.content
        assert all(a.content for a in answers)
        metrics = client.with_options(base_url=base_url.removesuffix("/v1")).get(
            "/metrics", cast_to=str
        )
    assert "esi_guard_batch_size_count" in metrics
