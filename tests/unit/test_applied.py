"""``apply``: a decided answer's content, finish reason, usage and metadata, per decision."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage

from esi_guard.applied import ABSTAIN_FINISH_REASON, apply
from esi_guard.result import Decision, ESIResult
from esi_guard.sentences import SentenceScore

ANSWER = "Paris is the capital. It has two moons."


def result(decision: Decision, **changes: Any) -> ESIResult:
    fields: dict[str, Any] = {
        "score": 0.4, "threshold": 0.3, "decision": decision, "scored": True, "reason": None,
        "answer": ANSWER, "variants": ["Whta is it?"], "answer_token_ids": [1, 2, 3, 4],
        "token_scores": [0.1, 0.2, 0.3, 0.4], "model": "m", "scoring": {},
        "finish_reason": "length", "prompt_tokens": 7,
    }  # fmt: skip
    return ESIResult(**(fields | changes))


@pytest.mark.parametrize("decision", ["accept", "flag"])
def test_an_accepted_or_flagged_answer_is_sent_as_it_is(decision: Decision) -> None:
    applied = apply(result(decision), abstain_message="no")
    assert (applied.content, applied.finish_reason) == (ANSWER, "length")
    assert (applied.input_tokens, applied.output_tokens, applied.total_tokens) == (7, 4, 11)
    assert applied.esi == result(decision).as_dict() and applied.fallback_metadata == {}


def test_an_abstention_sends_the_message_with_the_filter_s_finish_reason() -> None:
    applied = apply(result("abstain"), abstain_message="I cannot say.")
    assert (applied.content, applied.finish_reason) == ("I cannot say.", ABSTAIN_FINISH_REASON)
    assert applied.esi["answer"] == ANSWER  # what was withheld stays in the metadata


def test_a_redaction_sends_the_answer_less_its_untrusted_sentences() -> None:
    sentences = [
        SentenceScore("Paris is the capital. ", 0, 22, 0, 2, 0.1),
        SentenceScore("It has two moons.", 22, 39, 2, 4, 0.9, decision="redact"),
    ]
    applied = apply(result("redact", sentences=sentences), abstain_message="no")
    assert applied.content == "Paris is the capital."
    assert applied.finish_reason == "length" and applied.output_tokens == 4


def test_a_route_sends_the_fallback_s_answer_its_usage_added() -> None:
    fallback = AIMessage(
        "Paris.",
        response_metadata={"model_name": "big", "finish_reason": "stop"},
        usage_metadata={"input_tokens": 20, "output_tokens": 2, "total_tokens": 22},
    )
    applied = apply(result("route"), fallback, abstain_message="no")
    assert (applied.content, applied.finish_reason) == ("Paris.", "stop")
    assert (applied.input_tokens, applied.output_tokens) == (27, 6)
    assert applied.esi["fallback_used"] is True and applied.esi["answer"] == ANSWER
    assert applied.fallback_metadata == {"model_name": "big", "finish_reason": "stop"}


def test_a_route_whose_fallback_says_nothing_of_itself_finishes_with_stop() -> None:
    applied = apply(result("route"), "Paris.", abstain_message="no")
    assert (applied.content, applied.finish_reason, applied.total_tokens) == ("Paris.", "stop", 11)
    assert applied.fallback_metadata == {}
