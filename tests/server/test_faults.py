"""The API backend under injected faults and a server killed mid-batch (real llama.cpp)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage

from esi_guard import APIError, ESIGuard, OpenAIBackend
from integrations.faultproxy import FaultProxy
from integrations.llamacpp.server import CHATML, LlamaServer

# Side by side (pytest -n), the session's llama.cpp servers on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.xdist_group("llama_server"),
]

TIMEOUT = 20.0


@pytest.fixture
def proxy(llama_server: LlamaServer) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(llama_server.base_url, hang_seconds=TIMEOUT + 2).start()
    yield fault_proxy
    fault_proxy.stop()


def guard_through(proxy: FaultProxy, model: str, **kwargs: Any) -> tuple[ESIGuard, OpenAIBackend]:
    backend = OpenAIBackend(
        model,
        base_url=proxy.base_url,
        mode="chat",
        chat_template=CHATML,
        timeout=TIMEOUT,
        retry_wait=0.05,
        retry_max_wait=0.2,
        **kwargs,
    )
    # on_error="raise": these tests check which error each fault becomes.
    guard = ESIGuard(
        backend=backend, threshold=0.5, n_variants=2, top_k=5, max_new_tokens=6, on_error="raise"
    )
    return guard, backend


@pytest.mark.parametrize(
    ("fault", "retried"),
    [("500", True), ("429", True), ("hang", True), ("drop", True), ("400", False),
     ("malformed", False)],
)  # fmt: skip
def test_each_fault_is_retried_or_mapped(
    proxy: FaultProxy, llama_server: LlamaServer, fault: str, retried: bool
) -> None:
    guard, backend = guard_through(proxy, llama_server.model, max_retries=2)
    proxy.faults.append(fault)  # the first request (the answer's generation) fails once
    if retried:
        question = "What is the capital of France?"
        message = guard.invoke(question)
        esi = message.response_metadata["esi"]
        assert esi["scored"]
        assert backend.stats.retries == 1
        # The fault, its retry, then each distinct changed variant once (two SOC variants of
        # a short question can coincide).
        forced = {variant for variant in esi["variants"] if variant != question}
        assert 1 <= len(forced) <= 2
        assert proxy.count("/chat/completions") == 1 + 1 + len(forced)
        return
    with pytest.raises(APIError) as caught:
        guard.invoke("What is the capital of France?")
    assert not caught.value.retryable
    assert backend.stats.retries == 0
    assert proxy.count("/chat/completions") == 1  # no retry, no variants


def test_a_server_killed_mid_batch_ends_every_request(fresh_server: LlamaServer) -> None:
    server = fresh_server
    killer = FaultProxy(server.base_url).start()
    try:
        guard, backend = guard_through(killer, server.model, max_retries=2, max_concurrency=2)
        prompts = [f"Name a famous {thing}." for thing in ("river", "city", "poet", "bird",
                                                         "tree", "song")]  # fmt: skip
        # 6 generations, then variants two at a time: the kill lands among the variants.
        killer.on_request = lambda index: server.process.kill() if index == 10 else None
        results = guard.batch(prompts, return_exceptions=True)
    finally:
        killer.stop()
    assert len(results) == len(prompts)  # none lost
    scored = [r for r in results if isinstance(r, AIMessage)]
    failed = [r for r in results if isinstance(r, APIError)]
    assert len(scored) + len(failed) == len(prompts)
    assert all(m.response_metadata["esi"]["scored"] for m in scored)
    assert scored and failed
    assert all(e.retryable for e in failed)  # connection errors, retried then given up
    assert backend.stats.retries >= 2 * len(failed)
