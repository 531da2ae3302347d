"""A ``create_agent`` agent's structured final answer (``ToolStrategy``) is scored, never passed.

Its final answer is a tool call to the response format's tool, and the agent ends with
its ``structured_response``: a turn the middleware must treat as the answer, not as a
tool turn (found by an audit of fail-open paths: it passed with ``decision: "pass"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.structured_output import ToolStrategy
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import BaseModel

from esi_guard import FakeBackend
from esi_guard.agents import ESIMiddleware

QUESTION = "How many people live in Paris?"


class Population(BaseModel):
    """The population of a city."""

    city: str
    people: str


class Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Scripted:  # type: ignore[override]
        return self


def structured(middleware: ESIMiddleware) -> dict[str, Any]:
    call = {"name": "Population", "args": {"city": "Paris", "people": "about 2.1 million"},
            "id": "call-1"}  # fmt: skip
    model = Scripted(messages=iter([AIMessage("", tool_calls=[call])]), disable_streaming=True)
    agent = create_agent(model, [], middleware=[middleware],
                         response_format=ToolStrategy(Population))  # fmt: skip
    return agent.invoke({"messages": [HumanMessage(QUESTION)]})  # type: ignore[no-any-return]


@pytest.mark.parametrize(("sensitivity", "failures"), [(2.0, None), (0.0, "teacher_force")])
def test_an_untrusted_or_unscored_structured_answer_is_withheld(
    sensitivity: float, failures: str | None
) -> None:
    backend = FakeBackend(default_sensitivity=sensitivity,
                          failures={QUESTION: failures} if failures else None)  # fmt: skip
    middleware = ESIMiddleware(threshold=0.3, backend=backend, action="abstain")
    out = structured(middleware)
    assert out.get("structured_response") is None
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert final.content == middleware._options["abstain_message"]
    assert final.response_metadata["esi"]["decision"] == "abstain"


def test_a_trusted_structured_answer_is_scored_and_kept() -> None:
    middleware = ESIMiddleware(threshold=0.3, backend=FakeBackend(), action="abstain")
    out = structured(middleware)
    assert out["structured_response"] == Population(city="Paris", people="about 2.1 million")
    calling = next(m for m in out["messages"] if isinstance(m, AIMessage))
    assert calling.response_metadata["esi"]["scored"]
    assert calling.response_metadata["esi"]["decision"] == "accept"
