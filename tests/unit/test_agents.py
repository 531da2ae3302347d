"""ESIMiddleware in real create_agent graphs (langchain + langgraph), on the fake backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelFallbackMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from esi_guard import (
    BackendError,
    ConfigurationError,
    ESIGuard,
    FakeBackend,
    UncertainAnswerError,
)
from esi_guard.agents import ESIMiddleware
from esi_guard.backends import Forced, ForcingRequest
from esi_guard.calibration.file import ThresholdFile
from esi_guard.guard._inputs import fold_tools, parse_input

QUESTION = "How many people live in Paris?"
ANSWER = "About 2.1 million people live in Paris."
CALL = {"name": "population", "args": {"city": "Paris"}, "id": "call-1"}


@tool
def population(city: str) -> str:
    """The population of a city."""
    return f"{city}: 2.1 million"


class Scripted(GenericFakeChatModel):
    """langchain-core's fake chat model, with tools accepted (its replies are scripted)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Scripted:  # type: ignore[override]
        return self


def scripted(*replies: AIMessage) -> Scripted:
    # disable_streaming: the fake model's own stream drops tool calls
    return Scripted(messages=iter(replies), disable_streaming=True)


def tool_then_answer(answer: str = ANSWER) -> Scripted:
    return scripted(AIMessage("Let me look that up.", tool_calls=[CALL]), AIMessage(answer))


class Recording(FakeBackend):
    """The fake backend, keeping every forcing request it is handed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.forced: list[ForcingRequest] = []

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        self.forced.extend(requests)
        return super().teacher_force(requests, top_k=top_k)


def run(model: Any, *middleware: Any, system: str | None = None) -> list[Any]:
    agent = create_agent(model, [population], middleware=list(middleware), system_prompt=system)
    return agent.invoke({"messages": [HumanMessage(QUESTION)]})["messages"]  # type: ignore[no-any-return]


def esi(message: Any) -> dict[str, Any]:
    return message.response_metadata["esi"]  # type: ignore[no-any-return]


def test_a_tool_turn_passes_unscored_and_the_answer_is_scored_as_the_guard_scores_it() -> None:
    backend = Recording(default_sensitivity=0.5)
    middleware = ESIMiddleware(threshold=1.0, backend=backend)
    messages = run(tool_then_answer(), middleware, system="Answer briefly.")
    calling, result, final = messages[1], messages[2], messages[3]
    assert calling.tool_calls and esi(calling)["decision"] == "pass"
    assert not esi(calling)["scored"] and esi(calling)["reason"].startswith("tool_calls")
    assert isinstance(result, ToolMessage) and "esi" not in result.response_metadata
    assert final.content == ANSWER and esi(final)["scored"] and esi(final)["decision"] == "accept"
    seen = [SystemMessage("Answer briefly."), *messages[:3]]
    expected = ESIGuard(backend=FakeBackend(default_sensitivity=0.5), threshold=1.0).score(
        seen, ANSWER
    )
    assert esi(final)["score"] == pytest.approx(expected.score)
    assert esi(final)["variants"] == expected.variants


def test_only_the_question_is_intervened_on_and_the_tool_result_is_in_the_scored_prompt() -> None:
    backend = Recording(default_sensitivity=0.5)
    run(tool_then_answer(), ESIMiddleware(threshold=1.0, backend=backend), system="Be brief.")
    (request,) = backend.forced
    roles = [m["role"] for m in request.prompt]
    assert roles == ["system", "user", "assistant", "user"]
    assert request.prompt[1]["content"] == QUESTION
    assert request.prompt[2]["content"] == (
        'Let me look that up.\nTool call: population({"city": "Paris"})'
    )
    assert request.prompt[3]["content"] == "Tool result (population): Paris: 2.1 million"
    for variant in request.variants:
        changed = [i for i, m in enumerate(variant) if m != request.prompt[i]]
        assert changed == [1]  # the question, nothing else


def test_tool_calls_and_results_fold_into_text_and_the_question_stays_the_human_message() -> None:
    calls = [CALL, {"name": "weather", "args": {"city": "Paris"}, "id": "call-2"}]
    messages = [
        HumanMessage(QUESTION),
        AIMessage("", tool_calls=calls),
        ToolMessage("2.1 million", tool_call_id="call-1"),
        ToolMessage("rain", tool_call_id="call-2", name="weather"),
    ]
    chat, question = fold_tools(messages)
    assert question == 0 and len(chat) == 3
    assert chat[1]["content"].splitlines() == [
        'Tool call: population({"city": "Paris"})',
        'Tool call: weather({"city": "Paris"})',
    ]
    assert chat[2] == {
        "role": "user",
        "content": "Tool result (population): 2.1 million\n\nTool result (weather): rain",
    }
    assert parse_input(messages).question == QUESTION


@pytest.mark.parametrize("sensitivity", [0.0, 0.5])
def test_abstain_withholds_only_untrusted_answers_and_ends_the_loop(sensitivity: float) -> None:
    middleware = ESIMiddleware(
        threshold=0.1, action="abstain", backend=FakeBackend(default_sensitivity=sensitivity)
    )
    messages = run(tool_then_answer(), middleware)
    final = messages[-1]
    assert len(messages) == 4 and not final.tool_calls
    if sensitivity:
        assert final.content == middleware._options["abstain_message"]
        assert esi(final)["decision"] == "abstain" and esi(final)["answer"] == ANSWER
    else:
        assert final.content == ANSWER and esi(final)["decision"] == "accept"


def test_route_answers_with_the_fallback_model() -> None:
    fallback = scripted(AIMessage("The fallback says 2.1 million."))
    middleware = ESIMiddleware(
        threshold=0.1, action="route", fallback=fallback, backend=FakeBackend(default_sensitivity=1)
    )
    final = run(tool_then_answer(), middleware)[-1]
    assert final.content == "The fallback says 2.1 million."
    assert esi(final)["decision"] == "route" and esi(final)["fallback_used"]
    assert esi(final)["answer"] == ANSWER and esi(final)["score"] > 0.1


def test_raise_lets_langchains_fallback_middleware_take_over() -> None:
    fallback = scripted(AIMessage("The fallback says 2.1 million."))
    guard = ESIMiddleware(threshold=0.1, action="raise", backend=FakeBackend(default_sensitivity=1))
    final = run(tool_then_answer(), ModelFallbackMiddleware(fallback), guard)[-1]
    assert final.content == "The fallback says 2.1 million."
    assert esi(final)["decision"] == "raise" and esi(final)["fallback_used"]
    assert esi(final)["answer"] == ANSWER


def test_raise_without_a_fallback_raises_the_uncertain_answer_with_its_result() -> None:
    guard = ESIMiddleware(threshold=0.1, action="raise", backend=FakeBackend(default_sensitivity=1))
    with pytest.raises(UncertainAnswerError) as caught:
        run(tool_then_answer(), guard)
    assert caught.value.result.decision == "raise"  # type: ignore[attr-defined]
    assert caught.value.answer.content == ANSWER  # type: ignore[attr-defined]


def test_an_unscorable_answer_is_withheld_flagged_or_raised_never_trusted() -> None:
    broken = FakeBackend(failures={QUESTION: "teacher_force"})
    final = run(tool_then_answer(), ESIMiddleware(threshold=4.0, backend=broken))[-1]
    assert final.content != ANSWER and esi(final)["decision"] == "abstain"
    assert not esi(final)["scored"] and esi(final)["reason"].startswith("backend_error")
    flagging = ESIMiddleware(threshold=4.0, on_error="flag", backend=broken)
    flagged = run(tool_then_answer(), flagging)
    assert flagged[-1].content == ANSWER and esi(flagged[-1])["decision"] == "flag"
    with pytest.raises(BackendError):
        run(tool_then_answer(), ESIMiddleware(threshold=4.0, on_error="raise", backend=broken))
    empty = run(tool_then_answer(""), ESIMiddleware(threshold=4.0, backend=FakeBackend()))[-1]
    assert esi(empty)["reason"].startswith("empty_answer")


def test_async_agents_and_message_streams_give_the_same_decisions() -> None:
    middleware = ESIMiddleware(
        threshold=0.1, action="abstain", backend=FakeBackend(default_sensitivity=1)
    )
    agent = create_agent(tool_then_answer(), [population], middleware=[middleware])
    state = asyncio.run(agent.ainvoke({"messages": [HumanMessage(QUESTION)]}))
    assert esi(state["messages"][-1])["decision"] == "abstain"
    agent = create_agent(tool_then_answer(), [population], middleware=[middleware])
    streamed = [m for m, _ in agent.stream({"messages": [HumanMessage(QUESTION)]},
                                           stream_mode="messages")]  # fmt: skip
    texts = [m.content for m in streamed]
    assert ANSWER not in texts  # the withheld answer is never shown
    assert texts[-1] == middleware._options["abstain_message"]
    assert esi(streamed[0])["decision"] == "pass"


def test_a_model_it_cannot_score_is_a_configuration_error_naming_its_type() -> None:
    with pytest.raises(ConfigurationError, match="Scripted"):
        run(tool_then_answer(), ESIMiddleware(threshold=0.1))


def test_the_guard_is_built_once_per_model_object() -> None:
    middleware = ESIMiddleware(threshold=0.1)
    first, second = FakeBackend(), FakeBackend()
    assert middleware.guard_for(first) is middleware.guard_for(first)
    assert middleware.guard_for(first) is not middleware.guard_for(second)
    assert middleware.guard_for(second).backend is second


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs a threshold"),
        ({"threshold": 0.1, "action": "route"}, "fallback chat model"),
        ({"threshold": 0.1, "action": "shout"}, "action must be"),
        ({"threshold": 0.1, "n_variant": 3}, "n_variants"),
        ({"threshold": 0.1, "max_new_tokens": 3}, "max_new_tokens"),
        ({"threshold": float("nan")}, "finite"),
        ({"threshold": 0.1, "on_error": "ignore"}, "on_error"),
        ({"threshold": 0.1, "backend": FakeBackend(), "llm": "gpt2"}, "not both"),
    ],
)
def test_bad_settings_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ESIMiddleware(**kwargs)


def test_from_calibration_takes_the_files_threshold_and_checks_the_model_at_the_first_call(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "threshold.json"
    threshold_file(threshold=0.05).write(path)
    middleware = ESIMiddleware.from_calibration(path, action="abstain", backend=FakeBackend(
        default_sensitivity=1))  # fmt: skip
    final = run(tool_then_answer(), middleware)[-1]
    assert esi(final)["threshold"] == 0.05 and esi(final)["decision"] == "abstain"
    threshold_file(model="another-model").write(path)
    mismatched = ESIMiddleware.from_calibration(path, backend=FakeBackend())
    with pytest.raises(ConfigurationError, match="another-model"):
        run(tool_then_answer(), mismatched)
