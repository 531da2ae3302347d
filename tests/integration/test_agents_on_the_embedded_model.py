"""ESIMiddleware in a real create_agent graph whose answers come from the embedded model.

The answering model is langchain-community's ``ChatLlamaCpp`` on the embedded GGUF (in
process; it takes tool messages, which ``ChatHuggingFace`` over a local pipeline does not);
the scores come from the transformers backend on the same file (``backend=``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from esi_guard import ESIGuard, HFBackend
from esi_guard.agents import ESIMiddleware
from esi_guard.backends import embedded_gguf

# Side by side (pytest -n), the module's loaded ChatLlamaCpp on one worker.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("agents")]

SYSTEM = "Please directly answer the following question with one or few words."
QUESTION = "Which planet is known as the red planet?"


@tool
def lookup(topic: str) -> str:
    """Look a topic up in the encyclopedia."""
    return "Mars is called the red planet because of the iron oxide on its surface."


class Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Scripted:  # type: ignore[override]
        return self


class ToolTurnFirst(AgentMiddleware[Any, Any, Any]):
    """The first turn calls the tool (scripted); the answer comes from the real model."""

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            call = {"name": "lookup", "args": {"topic": "red planet"}, "id": "call-1"}
            reply = AIMessage("", tool_calls=[call])
            fake = Scripted(messages=iter([reply]), disable_streaming=True)
            return handler(request.override(model=fake))
        return handler(request.override(tools=[]))


@pytest.fixture(scope="module")
def llama() -> Iterator[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community's notice
        from langchain_community.chat_models.llamacpp import ChatLlamaCpp

        model = ChatLlamaCpp(
            model_path=str(embedded_gguf()), temperature=0, max_tokens=24, n_ctx=2048,
            n_threads=2, seed=0, verbose=False,
            model_kwargs={"chat_format": "chatml-function-calling"},
        )  # fmt: skip
    yield model


def test_the_answer_after_a_tool_turn_is_scored_with_the_tool_result_as_context(
    hf_backend: HFBackend, llama: Any
) -> None:
    middleware = ESIMiddleware(threshold=4.0, backend=hf_backend)
    agent = create_agent(llama, [lookup], system_prompt=SYSTEM,
                         middleware=[middleware, ToolTurnFirst()])  # fmt: skip
    messages = agent.invoke({"messages": [HumanMessage(QUESTION)]})["messages"]
    calling, result, final = messages[1], messages[2], messages[3]
    assert calling.response_metadata["esi"]["decision"] == "pass"
    assert "iron oxide" in result.content
    esi = final.response_metadata["esi"]
    assert esi["scored"] and esi["decision"] == "accept" and final.content.strip()
    reference = ESIGuard(backend=hf_backend, threshold=4.0)
    expected = reference.score([("system", SYSTEM), *messages[:3]], final.content)
    assert esi["score"] == pytest.approx(expected.score, rel=1e-6)
    without_tool = reference.score([("system", SYSTEM), ("human", QUESTION)], final.content)
    assert esi["score"] != pytest.approx(without_tool.score, rel=1e-3)  # the context counts


def test_abstain_on_the_embedded_model_ends_with_the_abstain_message(
    hf_backend: HFBackend, llama: Any
) -> None:
    middleware = ESIMiddleware(threshold=0.0, action="abstain", backend=hf_backend)
    agent = create_agent(llama, [], system_prompt=SYSTEM, middleware=[middleware])
    final = agent.invoke({"messages": [HumanMessage(QUESTION)]})["messages"][-1]
    esi = final.response_metadata["esi"]
    assert esi["scored"] and esi["score"] > 0.0 and esi["decision"] == "abstain"
    assert final.content == middleware._options["abstain_message"] and esi["answer"]


def test_a_chat_huggingface_model_is_scored_on_its_own_weights(hf_backend: HFBackend) -> None:
    from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline
    from transformers import pipeline

    pipe = pipeline("text-generation", model=hf_backend.model, tokenizer=hf_backend.tokenizer)
    chat = ChatHuggingFace(llm=HuggingFacePipeline(pipeline=pipe), tokenizer=hf_backend.tokenizer)
    middleware = ESIMiddleware(threshold=0.3)
    guard = middleware.guard_for(chat)
    assert isinstance(guard.backend, HFBackend) and guard.backend.model is hf_backend.model
    assert middleware.guard_for(chat) is guard
