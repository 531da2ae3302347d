"""The chat model's answer as apply() gives it: a routed reasoning model's text, the finish."""

from __future__ import annotations

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda

from esi_guard import ESIGuard, FakeBackend

SHAKY = "Which river flows through the town of Tübingen?"


def test_a_fallback_answer_with_a_reasoning_block_is_routed_as_its_text() -> None:
    blocks = [{"type": "reasoning", "reasoning": "Tübingen is on the Neckar."},
              {"type": "text", "text": "The Neckar."}]  # fmt: skip
    fallback = RunnableLambda(lambda _: AIMessage(content=blocks))  # type: ignore[arg-type]
    backend = FakeBackend({SHAKY: "the Danube river"}, sensitivity={SHAKY: 1.5})
    guard = ESIGuard(backend=backend, threshold=0.3, n_variants=4, action="route",
                     fallback=fallback)  # fmt: skip
    message = guard.invoke(SHAKY)  # was an InputError about a 'reasoning' block
    assert message.content == "The Neckar."
    assert message.response_metadata["esi"]["decision"] == "route"


def test_the_chat_models_finish_reason_is_applys() -> None:
    backend = FakeBackend({SHAKY: "the Danube river"}, sensitivity={SHAKY: 1.5})
    guard = ESIGuard(backend=backend, threshold=0.3, n_variants=4, action="abstain")
    assert guard.invoke(SHAKY).response_metadata["finish_reason"] == "content_filter"
    assert guard.invoke("What is 2 + 2?").response_metadata["finish_reason"] == "stop"
