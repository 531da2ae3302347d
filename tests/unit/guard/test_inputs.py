"""Reading guard inputs: every shape LangChain hands a model, and named errors for the rest."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate

from esi_guard import ESIGuard, FakeBackend, InputError
from esi_guard.guard._inputs import message_text, parse_input

SURE = "What is the capital city of France?"
UNSURE = "Which river flows through the ancient city of Timbuktu?"


def make_guard(**kwargs: Any) -> ESIGuard:
    backend = FakeBackend({SURE: "Paris", UNSURE: "The Nile river"}, sensitivity={UNSURE: 2.0})
    return ESIGuard(**{"backend": backend, "threshold": 0.05, **kwargs})


def test_a_string_is_one_user_message_and_the_whole_question() -> None:
    prompt = parse_input(SURE)
    assert prompt.messages == ({"role": "user", "content": SURE},)
    assert prompt.question == SURE


def test_the_question_is_the_last_human_message_and_nothing_else_changes() -> None:
    value = ChatPromptTemplate.from_messages(
        [("system", "Be brief."), ("human", "{q}"), ("ai", "Paris."), ("human", "And Spain?")]
    ).invoke({"q": SURE})
    prompt = parse_input(value)
    assert [m["role"] for m in prompt.messages] == ["system", "user", "assistant", "user"]
    assert prompt.question_index == 3 and prompt.question == "And Spain?"
    changed = prompt.with_question("And Spian?")
    assert changed[:3] == list(prompt.messages[:3])
    assert changed[3] == {"role": "user", "content": "And Spian?"}


def test_message_text_joins_text_blocks_and_refuses_or_skips_the_rest() -> None:
    blocks = [{"type": "text", "text": "a"}, "b", {"type": "image_url", "image_url": {}}]
    with pytest.raises(InputError, match="image_url"):
        message_text(HumanMessage(content=blocks))
    assert message_text(HumanMessage(content=blocks), skip_other_blocks=True) == "ab"


@pytest.mark.parametrize(
    "value",
    [
        [SystemMessage("Be brief in every answer."), HumanMessage(UNSURE)],
        [("system", "Be brief in every answer."), ("human", UNSURE)],
        [{"role": "user", "content": UNSURE}],
        [HumanMessage(content=[{"type": "text", "text": UNSURE}])],
    ],
)
def test_message_lists_of_every_shape(value: Any) -> None:
    assert make_guard().invoke(value).response_metadata["esi"]["decision"] == "flag"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (42, "got int"),
        ("   ", "empty"),
        ([SystemMessage("Only a system message here.")], "no human message"),
        ([HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}])], "image_url"),
        ("\u3000\n\t ", "empty"),
        ("Who wrote \ud800 this?", "lone surrogate"),
        ([("system", "Be \udfff brief."), ("human", SURE)], "lone surrogate"),
        ([("tool", "42")], "tool"),
        ([("human", SURE), ("narrator", "x")], "narrator"),
        ([{"content": SURE}], "chat messages"),
        (None, "got NoneType"),
        (b"What is the capital of France?", "got bytes"),
    ],
)
@pytest.mark.parametrize("on_error", ["abstain", "flag", "raise"])
def test_bad_inputs_raise_a_named_input_error(value: Any, message: str, on_error: str) -> None:
    with pytest.raises(InputError, match=message):
        make_guard(on_error=on_error).invoke(value)


def test_batch_keeps_good_inputs_when_one_is_bad() -> None:
    results = make_guard().batch([SURE, 42, UNSURE], return_exceptions=True)  # type: ignore[list-item]
    assert isinstance(results[1], InputError)
    assert results[0].response_metadata["esi"]["decision"] == "accept"
    assert results[2].response_metadata["esi"]["decision"] == "flag"
