"""``esi-guard serve`` in proxy mode: in front of the real llama.cpp server, through faults."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from langchain_openai import ChatOpenAI

from esi_guard import ESIGuard, OpenAIBackend
from integrations.faultproxy import FaultProxy
from integrations.llamacpp.server import CHATML, LlamaServer
from tests.unit.server.servers import served, user

# Side by side (pytest -n), the session's llama.cpp servers on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.xdist_group("llama_server"),
]

QUESTION = "What is the capital of France?"


@pytest.fixture
def proxy(llama_server: LlamaServer) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(llama_server.base_url).start()
    yield fault_proxy
    fault_proxy.stop()


def test_proxy_mode_scores_upstream_answers_and_maps_its_failures(
    proxy: FaultProxy, llama_server: LlamaServer
) -> None:
    backend = OpenAIBackend(llama_server.model, base_url=proxy.base_url, mode="chat",
                            chat_template=CHATML, timeout=60, max_retries=1, retry_wait=0.05,
                            retry_max_wait=0.2)  # fmt: skip
    guard = ESIGuard(backend=backend, threshold=0.5, n_variants=2, top_k=5, max_new_tokens=8)
    with served(guard, slots=4) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        name = client.models.list().data[0].id
        completion = client.chat.completions.create(model=name, messages=user(QUESTION))
        esi = completion.model_extra["esi"]  # type: ignore[index]
        assert esi["scored"] and esi["decision"] in ("accept", "flag")
        assert completion.choices[0].message.content
        proxy.faults.extend(["500", "500"])  # generation fails on both attempts
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model=name, messages=user(QUESTION))
        assert failed.value.status_code == 502 and failed.value.code == "upstream_error"
        proxy.faults.append("drop")  # once: retried by the API backend
        retried = client.chat.completions.create(model=name, messages=user(QUESTION))
        assert retried.model_extra["esi"]["scored"]  # type: ignore[index]
        model = ChatOpenAI(base_url=base_url, api_key="none", model=name, max_retries=0)  # type: ignore[arg-type]
        text = "".join(str(c.content) for c in model.stream(QUESTION))
        assert text == completion.choices[0].message.content
