"""ESIGuard's behaviour on the in-package fake backend, through every Runnable entry point."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda

from esi_guard import (
    BackendError,
    ConfigurationError,
    ESIGuard,
    FakeBackend,
    ScoringError,
    SkipOneChar,
    esi_score,
)
from esi_guard.backends import ForcingRequest

SURE = "What is the capital city of France?"
UNSURE = "Which river flows through the ancient city of Timbuktu?"
ANSWERS = {SURE: "Paris", UNSURE: "The Nile river"}


def make_guard(**kwargs: Any) -> ESIGuard:
    backend = FakeBackend(ANSWERS, sensitivity={UNSURE: 2.0})
    defaults: dict[str, Any] = {"backend": backend, "threshold": 0.05}
    return ESIGuard(**{**defaults, **kwargs})


def run(guard: ESIGuard, mode: str, value: Any) -> AIMessage:
    """One input through one Runnable entry point."""
    if mode == "invoke":
        return guard.invoke(value)
    if mode == "batch":
        return guard.batch([value])[0]
    if mode == "stream":
        chunks = list(guard.stream(value))
        assert len(chunks) == 1
        return chunks[0]
    raise AssertionError(mode)


async def arun(guard: ESIGuard, mode: str, value: Any) -> AIMessage:
    if mode == "ainvoke":
        return await guard.ainvoke(value)
    if mode == "abatch":
        return (await guard.abatch([value]))[0]
    chunks = [chunk async for chunk in guard.astream(value)]
    assert len(chunks) == 1
    return chunks[0]


SYNC = ["invoke", "batch", "stream"]
ASYNC = ["ainvoke", "abatch", "astream"]
FALLBACK = RunnableLambda(
    lambda _: AIMessage(content="Ask a librarian.", response_metadata={"src": "fb"})
)


def check_action(message: AIMessage, action: str, question: str) -> None:
    esi = message.response_metadata["esi"]
    json.dumps(esi)  # JSON-serialisable
    assert esi["answer"] == ANSWERS[question]
    assert len(esi["variants"]) == 10
    assert (
        len(esi["token_scores"]) == len(esi["answer_token_ids"]) == len(ANSWERS[question].split())
    )
    if question == SURE:
        assert esi["score"] == 0.0 and esi["decision"] == "accept"
        assert message.content == ANSWERS[SURE]
        return
    assert esi["score"] > 0.05 and esi["decision"] == action
    expected = {"flag": ANSWERS[UNSURE], "abstain": "I do not know", "route": "Ask a librarian."}
    assert message.content == expected[action]
    if action == "route":
        assert esi["fallback_used"] is True
        assert message.response_metadata["src"] == "fb"


@pytest.mark.parametrize("mode", SYNC)
@pytest.mark.parametrize("action", ["flag", "abstain", "route"])
@pytest.mark.parametrize("question", [SURE, UNSURE])
def test_actions_sync(mode: str, action: str, question: str) -> None:
    guard = make_guard(action=action, fallback=FALLBACK, abstain_message="I do not know")
    check_action(run(guard, mode, question), action, question)


@pytest.mark.parametrize("mode", ASYNC)
@pytest.mark.parametrize("action", ["flag", "abstain", "route"])
@pytest.mark.parametrize("question", [SURE, UNSURE])
async def test_actions_async(mode: str, action: str, question: str) -> None:
    guard = make_guard(action=action, fallback=FALLBACK, abstain_message="I do not know")
    check_action(await arun(guard, mode, question), action, question)


def test_batch_goes_through_the_backend_once_per_step() -> None:
    guard = make_guard()
    backend = guard.backend
    assert isinstance(backend, FakeBackend)
    messages = guard.batch([SURE, UNSURE, SURE])
    assert backend.calls == [("generate", 3), ("teacher_force", 3)]
    assert [m.response_metadata["esi"]["decision"] for m in messages] == [
        "accept",
        "flag",
        "accept",
    ]


def test_batch_and_one_by_one_agree() -> None:
    guard = make_guard()
    together = [m.response_metadata["esi"]["score"] for m in guard.batch([UNSURE, SURE])]
    alone = [guard.invoke(q).response_metadata["esi"]["score"] for q in (UNSURE, SURE)]
    assert together == alone


def test_only_the_last_human_message_is_intervened_on() -> None:
    backend = FakeBackend(ANSWERS, sensitivity={UNSURE: 2.0})
    seen: list[Any] = []
    original = backend.teacher_force

    def spy(requests: Any, *, top_k: int) -> Any:
        seen.extend(requests)
        return original(requests, top_k=top_k)

    backend.teacher_force = spy  # type: ignore[method-assign]
    guard = ESIGuard(backend=backend, threshold=0.05)
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer with one or few words, please."),
            ("human", "Earlier question about history?"),
            ("ai", "Earlier answer here."),
            ("human", "{q}"),
        ]
    ).invoke({"q": UNSURE})
    message = guard.invoke(prompt)
    (request,) = seen
    for variant in request.variants:
        assert list(variant[:3]) == list(request.prompt[:3])
        assert variant[3]["role"] == "user"
    assert any(v[3]["content"] != UNSURE for v in request.variants)
    assert message.response_metadata["esi"]["decision"] == "flag"


def test_a_question_with_nothing_to_intervene_on_is_not_trusted() -> None:
    guard = make_guard(action="flag", abstain_message="I do not know")
    message = guard.invoke("Is 2+2 = 4?")
    esi = message.response_metadata["esi"]
    assert esi["scored"] is False and esi["score"] is None
    assert esi["reason"].startswith("no_effective_variant")
    assert esi["decision"] == "abstain" and message.content == "I do not know"
    assert esi["answer"] == "I do not know."  # the withheld answer is kept in metadata


class Broken(FakeBackend):
    """A backend whose whole teacher-forcing call raises, or returns too few results."""

    def __init__(self, mode: str) -> None:
        super().__init__(ANSWERS, sensitivity={UNSURE: 2.0})
        self.mode = mode

    def teacher_force(self, requests: Any, *, top_k: int) -> Any:
        if self.mode == "raises":
            raise RuntimeError("CUDA error: device-side assert")
        return super().teacher_force(requests, top_k=top_k)[:-1]


class FailingIntervention(SkipOneChar):
    def batch_variants(self, questions: Any, n: int, *, seed: int = 0) -> Any:
        raise TimeoutError("paraphraser timed out")


# Each way scoring can fail: (guard keyword arguments, question, reason code, answer kept).
FAILURES: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "empty answer": ({"backend": FakeBackend(default_answer="")}, SURE, "empty_answer", ""),
    "nothing to change": ({}, "Is 2+2 = 4?", "no_effective_variant", "I do not know."),
    "NaN distributions": (
        {"backend": FakeBackend(ANSWERS, failures={SURE: "nan"})}, SURE, "scoring_error", "Paris"
    ),
    "generate failed": (
        {"backend": FakeBackend(ANSWERS, failures={SURE: "generate"})}, SURE, "backend_error", ""
    ),
    "teacher forcing failed": (
        {"backend": FakeBackend(ANSWERS, failures={SURE: "teacher_force"})},
        SURE, "backend_error", "Paris",
    ),
    "whole call raised": ({"backend": Broken("raises")}, SURE, "backend_error", "Paris"),
    "results missing": ({"backend": Broken("short")}, SURE, "backend_error", "Paris"),
    "intervention failed": (
        {"intervention": FailingIntervention()}, SURE, "intervention_error", "Paris"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", FAILURES)
@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "batch", "abatch"])
async def test_unscored_answers_follow_the_failure_policy(case: str, mode: str) -> None:
    kwargs, question, code, answer = FAILURES[case]

    async def call(guard: ESIGuard) -> Any:
        if mode == "invoke":
            return guard.invoke(question)
        if mode == "ainvoke":
            return await guard.ainvoke(question)
        if mode == "batch":
            return guard.batch([SURE, question], return_exceptions=True)[1]
        return (await guard.abatch([SURE, question], return_exceptions=True))[1]

    base: dict[str, Any] = {"threshold": 4.0, "abstain_message": "I do not know", **kwargs}
    base.setdefault("backend", FakeBackend(ANSWERS))
    withheld = await call(ESIGuard(**base))  # the default policy: abstain
    esi = withheld.response_metadata["esi"]
    assert (esi["scored"], esi["score"], esi["decision"]) == (False, None, "abstain")
    assert esi["reason"].startswith(code + ": ") and withheld.content == "I do not know"
    assert (
        esi["answer"] == answer and esi["scoring"] == ESIGuard(**base).scoring_config.as_metadata()
    )

    flagged = await call(ESIGuard(**base, on_error="flag"))
    esi = flagged.response_metadata["esi"]
    assert (esi["scored"], esi["decision"], flagged.content) == (False, "flag", answer)
    assert esi["reason"].startswith(code + ": ")

    raising = ESIGuard(**base, on_error="raise")
    if mode in ("invoke", "ainvoke"):
        with pytest.raises((BackendError, ScoringError)) as info:
            await call(raising)
        error = info.value
    else:
        error = await call(raising)
    if code in ("backend_error", "intervention_error"):
        assert isinstance(error, BackendError)
    else:
        assert isinstance(error, ScoringError) and code in str(error)
        assert error.result is not None and error.result.answer == answer  # nothing lost


def test_the_other_prompts_of_a_batch_keep_their_answers_when_one_fails() -> None:
    backend = FakeBackend(ANSWERS, sensitivity={UNSURE: 2.0}, failures={UNSURE: "teacher_force"})
    results = ESIGuard(backend=backend, threshold=0.05).batch([SURE, UNSURE])
    assert results[0].content == "Paris"
    assert results[0].response_metadata["esi"]["decision"] == "accept"
    assert results[1].response_metadata["esi"]["decision"] == "abstain"
    with pytest.raises(BackendError, match="teacher_force"):
        ESIGuard(backend=backend, threshold=0.05, on_error="raise").invoke(UNSURE)


def test_score_follows_the_failure_policy() -> None:
    guard = make_guard(on_error="raise")
    with pytest.raises(ScoringError, match="no_effective_variant"):
        guard.score("Is 2+2 = 4?", "Yes")
    broken = ESIGuard(backend=Broken("raises"), threshold=1.0)
    result = broken.score(SURE, "Paris")
    assert not result.scored and result.reason and result.reason.startswith("backend_error")
    assert result.decision == "abstain" and result.answer == "Paris"
    with pytest.raises(BackendError, match="CUDA"):
        ESIGuard(backend=Broken("raises"), threshold=1.0, on_error="raise").score(SURE, "Paris")


def test_score_an_existing_answer_without_generating() -> None:
    guard = make_guard()
    backend = guard.backend
    assert isinstance(backend, FakeBackend)
    result = guard.score(UNSURE, "The Nile river")
    assert result.scored and result.score is not None and result.score > 0.05
    assert result.decision == "flag"
    assert [call[0] for call in backend.calls] == ["teacher_force"]
    generated = guard.invoke(UNSURE).response_metadata["esi"]["score"]
    assert result.score == pytest.approx(generated, abs=1e-12)


def test_configuration_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="fallback"):
        make_guard(action="route")
    with pytest.raises(ConfigurationError, match="threshold"):
        make_guard(threshold=float("nan"))
    with pytest.raises(ValueError, match="n_variants"):
        make_guard(n_variants=0)


def test_metadata_records_the_scoring_configuration() -> None:
    guard = make_guard(intervention=SkipOneChar(p=0.5), n_variants=4, top_k=7, distance="kl")
    esi = guard.invoke(UNSURE).response_metadata["esi"]
    assert esi["scoring"]["intervention"] == {
        "name": "skip_one_char", "p": 0.5, "min_chars": 3, "words": "random", "distinct": True,
    }  # fmt: skip
    assert (esi["scoring"]["n_variants"], esi["scoring"]["top_k"], esi["scoring"]["distance"]) == (
        4,
        7,
        "kl",
    )
    assert esi["model"] == "fake" and len(esi["variants"]) == 4


def test_guard_composes_in_a_chain() -> None:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer with one or few words."), ("human", "{question}")]
    )
    chain = prompt | make_guard() | RunnableLambda(lambda m: m.response_metadata["esi"]["decision"])
    assert chain.batch([{"question": SURE}, {"question": UNSURE}]) == ["accept", "flag"]


class Scripted(SkipOneChar):
    """Returns the given variants, repeats and unchanged copies included."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__()
        self.texts = texts

    def variants(self, question: str, n: int, *, seed: int = 0) -> list[str]:
        return self.texts[:n]


def test_repeated_and_unchanged_variants_are_not_forced_and_score_the_same() -> None:
    changed = ["Which rivr flows through the ancient city of Timbuktu?",
               "Which river flows through the ancient cty of Timbuktu?"]  # fmt: skip
    texts = [UNSURE, changed[0], changed[0], changed[1], UNSURE]
    backend = FakeBackend(ANSWERS, sensitivity={UNSURE: 2.0})
    guard = ESIGuard(backend=backend, threshold=0.05, intervention=Scripted(texts), n_variants=5)
    esi = guard.invoke(UNSURE).response_metadata["esi"]
    assert esi["variants"] == texts and backend.calls[-1] == ("teacher_force", 1)
    # The score is the mean over all five variants, each forced in full by hand.
    gen = backend.generate([[{"role": "user", "content": UNSURE}]], max_new_tokens=64,
                           top_k=100)[0]  # fmt: skip
    assert not isinstance(gen, BackendError)
    request = ForcingRequest(prompt=[{"role": "user", "content": UNSURE}],
                             variants=[[{"role": "user", "content": t}] for t in texts],
                             answer_ids=gen.token_ids)  # fmt: skip
    forced = backend.teacher_force([request], top_k=100)[0]
    assert not isinstance(forced, BackendError)
    assert esi["score"] == pytest.approx(esi_score(gen.topk, forced.variants).score, rel=1e-12)


def test_only_distinct_changed_variants_reach_the_backend() -> None:
    seen: list[int] = []

    class Counting(FakeBackend):
        def teacher_force(self, requests: Any, *, top_k: int) -> Any:
            seen.extend(len(r.variants) for r in requests)
            return super().teacher_force(requests, top_k=top_k)

    texts = [UNSURE, "Which rivr flows?", "Which rivr flows?", "Whch river flows?"]
    guard = ESIGuard(backend=Counting(ANSWERS), threshold=0.05, intervention=Scripted(texts),
                     n_variants=4)  # fmt: skip
    guard.invoke(UNSURE)
    assert seen == [2]


# -- the chat-model contract beyond LangChain's standard suites ----------------------------

LONG = "Who painted the ceiling of the Sistine Chapel?"


def test_stop_ends_the_answer_and_the_stopped_answer_is_the_one_scored() -> None:
    backend = FakeBackend({LONG: "Michelangelo painted it you know"}, sensitivity={LONG: 1.0})
    for guard, kwargs in (
        (ESIGuard(backend=backend, threshold=4.0), {"stop": ["you"]}),
        (ESIGuard(backend=backend, threshold=4.0, stop=["you"]), {}),
    ):
        message = guard.invoke(LONG, **kwargs)
        esi = message.response_metadata["esi"]
        assert message.content == esi["answer"] == "Michelangelo painted it"
        assert len(esi["answer_token_ids"]) == len(esi["token_scores"]) == 3
        assert esi["finish_reason"] == "stop" and esi["scored"]
    assert guard._get_ls_params()["ls_stop"] == ["you"]


def test_usage_is_the_answers_own_and_esis_work_is_reported_apart() -> None:
    message = make_guard().invoke([("system", "Be brief."), ("human", UNSURE)])
    assert message.usage_metadata == {
        "input_tokens": 2 + len(UNSURE.split()), "output_tokens": 3,
        "total_tokens": 2 + len(UNSURE.split()) + 3,
    }  # fmt: skip
    work = message.response_metadata["esi"]["work"]
    assert 1 <= work["forced_variants"] <= 10
    assert work["forced_tokens"] == 3 * work["forced_variants"]
    assert message.response_metadata["model_name"] == "fake"


@pytest.mark.parametrize("mode", ["stream", "astream"])
async def test_a_stream_is_one_last_chunk_once_scored(mode: str) -> None:
    guard = make_guard(action="abstain", abstain_message="I do not know")
    if mode == "stream":
        chunks = list(guard.stream(UNSURE))
    else:
        chunks = [chunk async for chunk in guard.astream(UNSURE)]
    assert len(chunks) == 1 and isinstance(chunks[0], AIMessageChunk)
    (chunk,) = chunks
    assert chunk.chunk_position == "last" and chunk.content == "I do not know"
    assert chunk.response_metadata["esi"]["decision"] == "abstain"
    assert chunk.usage_metadata is not None and chunk.usage_metadata["output_tokens"] == 3


def test_langchain_settings_mean_what_they_say() -> None:
    assert make_guard(max_tokens=7).max_new_tokens == 7
    assert make_guard(temperature=0).invoke(SURE).content == "Paris"
    with pytest.raises(ConfigurationError, match="temperature must be 0"):
        make_guard(temperature=0.7)
    with pytest.raises(ConfigurationError, match="one setting"):
        make_guard(max_tokens=7, max_new_tokens=8)
    with pytest.raises(ConfigurationError, match="unknown keyword 'top_p'"):
        make_guard().invoke(SURE, top_p=0.9)
    params = make_guard()._get_ls_params()
    assert (params["ls_provider"], params["ls_model_name"], params["ls_model_type"]) == (
        "fake", "fake", "chat",
    )  # fmt: skip


def live(**kwargs: Any) -> ESIGuard:
    return make_guard(stream_mode="live", action="flag", on_error="flag", **kwargs)


@pytest.mark.parametrize("mode", ["stream", "astream"])
async def test_a_live_stream_joins_to_the_invoked_message_and_ends_with_the_score(
    mode: str,
) -> None:
    guard = live()
    if mode == "stream":
        chunks = list(guard.stream(UNSURE))
    else:
        chunks = [chunk async for chunk in guard.astream(UNSURE)]
    assert [c.chunk_position for c in chunks][-1] == "last"
    assert all("esi" not in c.response_metadata for c in chunks[:-1])
    assert "".join(str(c.content) for c in chunks) == guard.invoke(UNSURE).content
    assert chunks[-1].response_metadata["esi"]["decision"] == "flag"


@pytest.mark.parametrize(
    "settings", [{"action": "abstain"}, {"action": "flag", "on_error": "abstain"}]
)
def test_a_live_stream_is_refused_where_a_shown_answer_could_be_withheld(
    settings: dict[str, Any],
) -> None:
    with pytest.raises(ConfigurationError, match="cannot be withheld"):
        make_guard(stream_mode="live", **settings)


def test_support_all_reaches_the_score_and_is_recorded() -> None:
    pair = make_guard().invoke(UNSURE).response_metadata["esi"]
    every = make_guard(support="all").invoke(UNSURE).response_metadata["esi"]
    assert (pair["scoring"]["support"], every["scoring"]["support"]) == ("pair", "all")
    assert every["variants"] == pair["variants"] and every["score"] != pair["score"]
    with pytest.raises(ConfigurationError):
        make_guard(support="some")
