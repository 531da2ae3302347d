"""ESIMiddleware's abstained and routed answers, as apply() gives them."""

from __future__ import annotations

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage

from esi_guard import FakeBackend
from esi_guard.agents import ESIMiddleware
from esi_guard.applied import ABSTAIN_FINISH_REASON
from tests.unit.test_agents import ANSWER, QUESTION, population, scripted


def usage(i: int, o: int) -> dict[str, int]:
    return {"input_tokens": i, "output_tokens": o, "total_tokens": i + o}


def final(middleware: ESIMiddleware) -> AIMessage:
    model = scripted(AIMessage(ANSWER, usage_metadata=usage(5, 8),  # type: ignore[arg-type]
                               response_metadata={"finish_reason": "stop"}))  # fmt: skip
    agent = create_agent(model, [population], middleware=[middleware])
    return agent.invoke({"messages": [HumanMessage(QUESTION)]})["messages"][-1]  # type: ignore[no-any-return]


def test_an_abstained_agent_answer_has_the_filters_finish_reason() -> None:
    message = final(ESIMiddleware(threshold=0.1, action="abstain",
                                  backend=FakeBackend(default_sensitivity=1)))  # fmt: skip
    assert message.response_metadata["esi"]["decision"] == "abstain"
    assert message.response_metadata["finish_reason"] == ABSTAIN_FINISH_REASON  # was "stop"


def test_a_routed_agent_answer_counts_the_answer_it_replaced() -> None:
    fallback = scripted(AIMessage("Fallback.", usage_metadata=usage(10, 3)))  # type: ignore[arg-type]
    message = final(ESIMiddleware(threshold=0.1, action="route", fallback=fallback,
                                  backend=FakeBackend(default_sensitivity=1)))  # fmt: skip
    assert message.content == "Fallback." and message.response_metadata["esi"]["fallback_used"]
    assert message.usage_metadata is not None  # was the fallback's 10 and 3 alone
    assert (message.usage_metadata["input_tokens"], message.usage_metadata["output_tokens"]) == (
        15, 11)  # fmt: skip
