"""``ESIGuard.assess``: the results of ``batch``, without chat messages.

The same steps and decisions as the message path (checked against ``batch`` on the same
prompts), an error in place of what ``invoke`` would raise, each step run once for all the
inputs, and ``failures="return"`` giving a backend failure back whatever ``on_error``.
"""

from __future__ import annotations

import pytest

from esi_guard import ESIGuard, ESIResult, FakeBackend
from esi_guard.exceptions import APIError, InputError, ScoringError

QUESTIONS = ["Where is the Eiffel Tower?", "Who wrote Hamlet?", "What is the boiling point?"]


def guard(**kwargs: object) -> ESIGuard:
    backend = kwargs.pop("backend", None) or FakeBackend(
        answers={QUESTIONS[0]: "Paris", QUESTIONS[1]: "Shakespeare"},
        sensitivity={QUESTIONS[0]: 0.0, QUESTIONS[1]: 0.9},
    )
    return ESIGuard(backend=backend, threshold=0.1, n_variants=4, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("action", ["flag", "abstain", "route"])
async def test_assess_gives_batchs_results_and_decisions(action: str) -> None:
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableLambda

    fallback = RunnableLambda(lambda _: AIMessage(content="elsewhere"))
    g = guard(action=action, fallback=fallback if action == "route" else None)
    messages = g.batch(QUESTIONS)
    for results in (g.assess(QUESTIONS), await g.aassess(QUESTIONS)):
        assert all(isinstance(r, ESIResult) for r in results)
        assert [r.as_dict() for r in results] == [  # type: ignore[union-attr]
            {k: v for k, v in m.response_metadata["esi"].items() if k != "fallback_used"}
            for m in messages
        ]
        decisions = [r.decision for r in results]  # type: ignore[union-attr]
        assert "accept" in decisions and action in decisions  # both sides of the threshold
        assert all(r.prompt_tokens for r in results)  # type: ignore[union-attr]


def test_each_step_runs_once_for_all_inputs_and_errors_take_their_place() -> None:
    g = guard()
    g.backend.calls.clear()  # type: ignore[attr-defined]
    results = g.assess([QUESTIONS[0], 42, QUESTIONS[1]])  # type: ignore[list-item]
    assert isinstance(results[1], InputError) and "int" in str(results[1])
    assert isinstance(results[0], ESIResult) and isinstance(results[2], ESIResult)
    methods = [method for method, _ in g.backend.calls]  # type: ignore[attr-defined]
    assert methods.count("generate") == 1 and methods.count("teacher_force") == 1


def test_failures_follow_on_error_unless_returned() -> None:
    down = FakeBackend(error=APIError("upstream down", status_code=500, retryable=True))
    (withheld,) = guard(backend=down).assess(QUESTIONS[:1])
    assert isinstance(withheld, ESIResult) and not withheld.scored
    assert withheld.decision == "abstain" and "upstream down" in (withheld.reason or "")
    (returned,) = guard(backend=down).assess(QUESTIONS[:1], failures="return")
    assert isinstance(returned, APIError)
    (raised,) = guard(backend=down, on_error="raise").assess(QUESTIONS[:1])
    assert isinstance(raised, APIError)


def test_an_unscored_answer_is_decided_by_on_error_or_returned_as_its_error() -> None:
    empty = FakeBackend(default_answer="")
    (flagged,) = guard(backend=empty, on_error="flag").assess(QUESTIONS[:1], failures="return")
    assert isinstance(flagged, ESIResult) and (flagged.scored, flagged.decision) == (False, "flag")
    (raised,) = guard(backend=empty, on_error="raise").assess(QUESTIONS[:1])
    assert isinstance(raised, ScoringError) and isinstance(raised.result, ESIResult)
    assert raised.result.answer == ""


async def test_astream_assess_gives_the_text_then_the_result() -> None:
    g = guard()
    pieces = [piece async for piece in g.astream_assess(QUESTIONS[0])]
    *text, result = pieces
    assert isinstance(result, ESIResult) and "".join(text) == result.answer == "Paris"  # type: ignore[arg-type]
    assert result.as_dict() == g.invoke(QUESTIONS[0]).response_metadata["esi"]
