"""The server's answers on the fake backend, in memory (httpx's ASGI transport).

Every answer carries ``esi`` and the ``X-ESI-*`` headers; what the guard withholds never
reaches the client; every failure is an OpenAI-shaped error with its documented status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda

from esi_guard import FakeBackend
from esi_guard.exceptions import (
    APIContextLengthError,
    APIError,
    BackendError,
    ConfigurationError,
    WholeMessageWarning,
)
from esi_guard.guard import DEFAULT_ABSTAIN_MESSAGE
from esi_guard.server import ABSTAIN_FINISH_REASON, ServeSettings, create_app
from tests.unit.server.servers import ANSWERS, QUESTION, SHAKY, client, fake_guard, user, wait_ready

CHAT = "/v1/chat/completions"


def body(text: str = QUESTION, **extra: Any) -> dict[str, Any]:
    return {"model": "fake", "messages": user(text), **extra}


def events(response: httpx.Response) -> list[Any]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


async def test_a_trusted_answer_comes_back_accepted_with_its_score() -> None:
    async with client(fake_guard(action="abstain")) as c:
        r = await c.post(CHAT, json=body())
    assert r.status_code == 200
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == "fake"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Paris"}
    assert out["choices"][0]["finish_reason"] == "stop"
    esi = out["esi"]
    assert esi["decision"] == "accept" and esi["scored"] and esi["reason"] is None
    assert esi["score"] == pytest.approx(0.0) and esi["threshold"] == 0.3
    assert esi["variants_used"] == 4
    assert r.headers["X-ESI-Decision"] == "accept"
    assert float(r.headers["X-ESI-Score"]) == pytest.approx(esi["score"], abs=1e-6)
    assert out["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_an_abstained_answer_is_the_abstention_text_and_never_leaks(stream: bool) -> None:
    async with client(fake_guard(action="abstain")) as c:
        r = await c.post(CHAT, json=body(SHAKY, stream=stream))
    assert r.status_code == 200
    assert r.headers["X-ESI-Decision"] == "abstain"
    assert ANSWERS[SHAKY] not in r.text
    if stream:
        chunks = events(r)
        assert streamed_text(chunks) == DEFAULT_ABSTAIN_MESSAGE
        assert chunks[-1]["choices"][0]["finish_reason"] == ABSTAIN_FINISH_REASON
        esi = chunks[-1]["esi"]
    else:
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == DEFAULT_ABSTAIN_MESSAGE
        assert choice["finish_reason"] == ABSTAIN_FINISH_REASON == "content_filter"
        esi = r.json()["esi"]
    assert esi["decision"] == "abstain" and esi["scored"] and esi["score"] > 0.3


async def test_flag_returns_the_answer_marked_and_route_the_fallbacks() -> None:
    async with client(fake_guard(action="flag")) as c:
        flagged = (await c.post(CHAT, json=body(SHAKY))).json()
    assert flagged["choices"][0]["message"]["content"] == ANSWERS[SHAKY]
    assert flagged["esi"]["decision"] == "flag"
    fallback = RunnableLambda(lambda _: AIMessage("The Neckar."))
    async with client(fake_guard(action="route", fallback=fallback)) as c:
        routed = (await c.post(CHAT, json=body(SHAKY))).json()
        kept = (await c.post(CHAT, json=body())).json()
    assert routed["choices"][0]["message"]["content"] == "The Neckar."
    assert routed["esi"]["decision"] == "route" and routed["esi"]["fallback_used"] is True
    assert kept["choices"][0]["message"]["content"] == "Paris"
    assert "fallback_used" not in kept["esi"]


@pytest.mark.parametrize("on_error", ["abstain", "flag"])
@pytest.mark.parametrize(("answers", "failures", "code"), [
    ({QUESTION: "Paris"}, {QUESTION: "nan"}, "scoring_error"),
    ({QUESTION: ""}, {}, "empty_answer"),
])  # fmt: skip
async def test_an_unscored_answer_is_never_accepted(
    on_error: str, answers: dict[str, str], failures: dict[str, str], code: str
) -> None:
    backend = FakeBackend(answers, failures=failures)  # type: ignore[arg-type]
    async with client(fake_guard(backend=backend, on_error=on_error)) as c:
        r = await c.post(CHAT, json=body())
    assert r.status_code == 200
    esi = r.json()["esi"]
    assert esi["scored"] is False and esi["score"] is None
    assert esi["reason"].startswith(f"{code}:")
    assert esi["decision"] == on_error
    assert r.headers["X-ESI-Score"] == "none" and r.headers["X-ESI-Decision"] == on_error
    content = r.json()["choices"][0]["message"]["content"]
    assert content == (DEFAULT_ABSTAIN_MESSAGE if on_error == "abstain" else answers[QUESTION])


@pytest.mark.parametrize(("error", "status", "code"), [
    (APIError("upstream down", status_code=500, retryable=True), 502, "upstream_error"),
    (APIContextLengthError("prompt too long", status_code=400), 400, "context_length_exceeded"),
])  # fmt: skip
async def test_backend_failures_are_openai_errors(error: Exception, status: int, code: str) -> None:
    async with client(fake_guard(backend=FakeBackend(error=error))) as c:
        r = await c.post(CHAT, json=body())
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    assert r.headers["X-ESI-Decision"] == "error"
    if code == "context_length_exceeded":
        assert r.json()["error"]["message"].startswith("context_overflow:")
        assert r.json()["error"]["param"] == "messages"


async def test_an_engine_failure_for_one_prompt_is_a_500_with_its_reason_code() -> None:
    backend = FakeBackend(ANSWERS, failures={QUESTION: "generate"})
    async with client(fake_guard(backend=backend)) as c:
        r = await c.post(CHAT, json=body())
    assert r.status_code == 500
    assert r.json()["error"] == {"message": r.json()["error"]["message"], "type": "server_error",
                                 "param": None, "code": "backend_error"}  # fmt: skip


class _AtAPath(FakeBackend):
    """A fake whose model id is a GGUF's path on the server, as a local file's is."""

    @property
    def model_id(self) -> str:
        return "/srv/weights/my-model.gguf"


async def test_an_error_names_the_model_by_its_served_name_never_its_path() -> None:
    broken = _AtAPath(error=BackendError("model '/srv/weights/my-model.gguf' produced NaN"))
    async with client(fake_guard(backend=broken), model_name="my-model") as c:
        r = await c.post(CHAT, json=body() | {"model": "my-model"})
    assert r.status_code == 500
    message = r.json()["error"]["message"]
    assert message.endswith("model 'my-model' produced NaN") and "/srv" not in message


@pytest.mark.parametrize(("request_body", "status", "code", "param"), [
    (b"{not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_json", None),
    (body(logit_bias={"1": 2}), 400, "unknown_parameter", "logit_bias"),
    ({"model": "fake", "messages": [{"role": "user", "content": "hi", "colour": 1}]}, 400,
     "unknown_parameter", "messages[0].colour"),
    (body(text=QUESTION) | {"messages": []}, 400, "invalid_value", "messages"),
    ({"messages": user(QUESTION)}, 400, "missing_required_parameter", "model"),
    (body(temperature=0.7), 400, "invalid_value", "temperature"),
    (body(n=2), 400, "invalid_value", "n"),
    ({"model": "fake", "messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_value",
     "messages[0].role"),
    ({"model": "fake", "messages": [{"role": "system", "content": "Be brief."}]}, 400,
     "invalid_prompt", "messages"),
    (body(text="   "), 400, "invalid_prompt", "messages"),
    (body(text="x" * 5000), 413, "request_too_large", None),
    (body() | {"model": "gpt-4o"}, 404, "model_not_found", "model"),
])  # fmt: skip
async def test_bad_requests_get_the_documented_status_and_body(
    request_body: Any, status: int, code: str, param: str | None
) -> None:
    async with client(fake_guard(), max_body_bytes=4096) as c:
        if isinstance(request_body, bytes):
            r = await c.post(CHAT, content=request_body)
        else:
            r = await c.post(CHAT, json=request_body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["param"] == param
    assert set(error) == {"message", "type", "param", "code"} and error["message"]


async def test_the_api_key_is_required_and_compared() -> None:
    async with client(fake_guard(), api_key="s3cret") as c:
        missing = await c.post(CHAT, json=body())
        wrong = await c.post(CHAT, json=body(), headers={"Authorization": "Bearer nope"})
        right = await c.post(CHAT, json=body(), headers={"Authorization": "Bearer s3cret"})
        models = await c.get("/v1/models")
        health = await c.get("/health")
    for refused in (missing, wrong, models):
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert "s3cret" not in refused.text
    assert right.status_code == 200 and health.status_code == 200


async def test_a_full_queue_is_a_503_with_retry_after() -> None:
    async with client(fake_guard(), max_queue=1, retry_after=3) as c:
        service = c.app.state.service  # type: ignore[attr-defined]
        async with service.batcher.slot():  # the engine is busy
            waiting = [asyncio.ensure_future(c.post(CHAT, json=body()))]
            await asyncio.sleep(0.2)  # taken by the collector, which waits for the slot
            waiting.append(asyncio.ensure_future(c.post(CHAT, json=body())))
            while service.batcher.depth < 1:  # in the queue
                await asyncio.sleep(0.01)
            refused = await c.post(CHAT, json=body())
        assert [(await w).status_code for w in waiting] == [200, 200]
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "3"
    assert refused.json()["error"]["code"] == "server_overloaded"


async def test_token_limit_and_stop_sequences_are_honoured() -> None:
    async with client(fake_guard(action="flag")) as c:
        short = (await c.post(CHAT, json=body(SHAKY, max_tokens=1))).json()
        stopped = (await c.post(CHAT, json=body(SHAKY, stop=["river"]))).json()
        capped = (await c.post(CHAT, json=body(SHAKY, max_completion_tokens=10_000))).json()
    assert short["choices"][0]["message"]["content"] == "the"
    assert short["choices"][0]["finish_reason"] == "length"
    assert stopped["choices"][0]["message"]["content"] == "the Danube"
    assert capped["choices"][0]["message"]["content"] == ANSWERS[SHAKY]


async def test_concurrent_requests_are_answered_in_one_batched_call() -> None:
    backend = FakeBackend(ANSWERS, sensitivity={SHAKY: 1.5})
    async with client(fake_guard(backend=backend), batch_window_ms=100) as c:
        texts = [QUESTION, SHAKY] * 4
        replies = await asyncio.gather(*(c.post(CHAT, json=body(t)) for t in texts))
        metrics = (await c.get("/metrics")).text
    decisions = [r.json()["esi"]["decision"] for r in replies]
    assert decisions == ["accept", "flag"] * 4
    assert ("generate", 8) in backend.calls and ("teacher_force", 8) in backend.calls
    assert 'esi_guard_batch_size_bucket{le="8.0"} 1.0' in metrics


async def test_streams_hold_until_scored_or_go_live_when_only_flagging() -> None:
    async with client(fake_guard(action="flag")) as c:  # on_error abstain: held
        held = await c.post(CHAT, json=body(SHAKY, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    assert held.headers["X-ESI-Decision"] == "flag"
    chunks = events(held)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert streamed_text(chunks) == ANSWERS[SHAKY]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-1]["esi"]["decision"] == chunks[-2]["esi"]["decision"] == "flag"
    async with client(fake_guard(action="flag", on_error="flag")) as c:
        live = await c.post(CHAT, json=body(SHAKY, stream=True))
    assert live.headers["X-ESI-Decision"] == "pending"
    chunks = events(live)
    assert streamed_text(chunks) == ANSWERS[SHAKY]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["esi"]["decision"] == "flag" and chunks[-1]["esi"]["scored"]


async def test_a_live_stream_flags_an_answer_it_could_not_score() -> None:
    backend = FakeBackend(ANSWERS, failures={SHAKY: "nan"})
    async with client(fake_guard(backend=backend, action="flag", on_error="flag")) as c:
        live = await c.post(CHAT, json=body(SHAKY, stream=True))
    chunks = events(live)
    assert streamed_text(chunks) == ANSWERS[SHAKY]
    assert chunks[-1]["esi"]["scored"] is False and chunks[-1]["esi"]["decision"] == "flag"


async def test_models_health_metrics_and_unknown_paths() -> None:
    async with client(fake_guard(), warm_up=True, model_name="guarded") as c:
        await wait_ready(c)
        models = (await c.get("/v1/models")).json()
        await c.post(CHAT, json=body() | {"model": "guarded"})
        await c.post(CHAT, json=body(SHAKY) | {"model": "guarded", "foo": 1})
        metrics = (await c.get("/metrics")).text
        missing = await c.get("/v1/embeddings")
        live = await c.get("/health/live")
    assert [m["id"] for m in models["data"]] == ["guarded"]
    assert 'esi_guard_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in metrics
    assert 'esi_guard_requests_total{endpoint="/v1/chat/completions",status="400"} 1.0' in metrics
    assert 'esi_guard_decisions_total{decision="accept",reason="scored"} 1.0' in metrics
    for name in ("esi_guard_score_bucket", 'esi_guard_step_seconds_count{step="generate"}',
                 'step="force"', 'step="queue"', 'step="request"', "esi_guard_queue_depth 0.0",
                 "esi_guard_ready 1.0", "esi_guard_in_flight"):  # fmt: skip
        assert name in metrics
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert live.json() == {"live": True}


async def test_not_ready_until_the_model_answers() -> None:
    broken = FakeBackend(error=APIError("upstream down", retryable=True))
    app = create_app(fake_guard(backend=broken), ServeSettings())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://guard") as c:
            await asyncio.sleep(0.1)
            health = await c.get("/health")
    assert health.status_code == 503 and health.json()["ready"] is False


def test_a_guard_that_raises_cannot_be_served() -> None:
    with pytest.raises(ConfigurationError, match="on_error='abstain' or 'flag'"):
        create_app(fake_guard(on_error="raise"))


async def test_the_served_id_and_the_name_the_server_was_started_with_are_accepted() -> None:
    async with client(fake_guard(), model_aliases=("default",)) as c:
        by_id = await c.post(CHAT, json=body() | {"model": "fake"})
        by_flag = await c.post(CHAT, json=body() | {"model": "default"})
        other = await c.post(CHAT, json=body() | {"model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
        models = (await c.get("/v1/models")).json()
    assert by_id.status_code == by_flag.status_code == 200, by_flag.text
    assert by_flag.json()["model"] == "fake"  # the served id, whatever name was sent
    assert by_flag.json()["choices"][0]["message"]["content"] == "Paris"
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert "'fake' or 'default'" in other.json()["error"]["message"]
    assert [m["id"] for m in models["data"]] == ["fake", "default"]  # what a client may send


LONG = "Answer from the passage below.\n\n" + "The Loire is a river of France. " * 20 + QUESTION


@pytest.mark.parametrize("mode", ["json", "held stream", "live stream"])
async def test_a_whole_long_message_is_warned_to_the_caller_not_to_the_log(mode: str) -> None:
    guard = fake_guard(action="flag", on_error="flag" if mode == "live stream" else "abstain")
    async with client(guard) as c:
        short = await c.post(CHAT, json=body(stream=mode != "json"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            long = await c.post(CHAT, json=body(LONG, stream=mode != "json"))
    assert long.status_code == 200, long.text
    esi, short_esi = (
        (long.json()["esi"], short.json()["esi"])
        if mode == "json"
        else (events(long)[-1]["esi"], events(short)[-1]["esi"])
    )
    (warning,) = esi["warnings"]
    assert warning.startswith(f"whole_message: the question is a {len(LONG)}-character")
    assert "system message" in warning  # what the caller can do about it
    assert long.headers["X-ESI-Warning"] == "whole_message"
    assert "warnings" not in short_esi and "X-ESI-Warning" not in short.headers
    assert not [w for w in caught if issubclass(w.category, WholeMessageWarning)]


async def test_the_start_up_line_says_model_engine_threshold_action_and_auth(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="esi_guard.server")
    settings = {"api_key": "s3cret", "threshold_source": "calibration file t.json"}
    async with client(fake_guard(threshold=0.42, action="abstain"), **settings):
        pass
    async with client(fake_guard(), model_aliases=("default",)):
        pass
    keyed, open_ = [r.getMessage() for r in caplog.records if "serving model" in r.message]
    assert keyed.startswith("serving model 'fake' on engine fake: threshold 0.42 ")
    assert "(calibration file t.json)" in keyed and "action abstain" in keyed
    assert "auth on" in keyed and "s3cret" not in caplog.text
    assert "auth off" in open_ and "requests send model 'fake' or 'default'" in open_


async def test_draining_answers_health_503_and_refuses_new_chat_requests() -> None:
    async with client(fake_guard()) as c:
        service = c.app.state.service  # type: ignore[attr-defined]
        assert (await c.get("/health")).status_code == 200
        service.drain()
        health = await c.get("/health")
        refused = await c.post(CHAT, json=body())
        live = await c.get("/health/live")
        metrics = (await c.get("/metrics")).text
    assert health.status_code == 503
    assert health.json() | {"model": None} == {
        "live": True, "ready": False, "draining": True, "model": None,
    }  # fmt: skip
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "server_shutting_down"
    assert refused.headers["Retry-After"] == "1"
    assert live.status_code == 200 and "esi_guard_ready 0.0" in metrics


@pytest.mark.parametrize("stream", [False, True])
async def test_a_redacted_answer_is_served_without_the_sentences_it_lists(stream: bool) -> None:
    question = "Tell me three things."
    answer = "Paris is in France. Water boils at 100 degrees. The moon is made of cheese."
    backend = FakeBackend({question: answer}, default_sensitivity=1.0)
    scores = sorted(s.score for s in fake_guard(backend=backend).assess([question])[0].sentences)
    guard = fake_guard(backend=backend, action="redact", threshold=(scores[-1] + scores[-2]) / 2)
    async with client(guard) as c:
        r = await c.post(CHAT, json=body(question, stream=stream))
    assert r.status_code == 200 and r.headers["X-ESI-Decision"] == "redact"
    if stream:
        chunks = events(r)
        content, esi = streamed_text(chunks), chunks[-1]["esi"]
    else:
        content, esi = r.json()["choices"][0]["message"]["content"], r.json()["esi"]
    assert esi["redacted"] == 1
    (removed,) = [s for s in esi["sentences"] if s["decision"] == "redact"]
    assert removed["score"] == pytest.approx(scores[-1])
    assert content == (answer[: removed["start"]] + answer[removed["end"] :]).rstrip()
    assert answer[removed["start"] : removed["end"]] not in r.text  # nor anywhere else
