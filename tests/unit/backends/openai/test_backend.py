"""OpenAIBackend on a scripted in-process server (httpx.MockTransport): parsing, layouts,
retries, error mapping, per-item failures and key hygiene. No network, no model."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from langchain_core.callbacks import BaseCallbackHandler

from esi_guard import (
    APIError,
    ConfigurationError,
    ContextLengthError,
    ESIGuard,
    OpenAIBackend,
    esi_score,
)
from esi_guard.backends import Forced, ForcingRequest, Generation

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
ANSWER = ["Paris", " is", " nice"]
KEY = "sk-test-SECRET-4242"


def _tokens(text: str) -> list[str]:
    return re.findall(r"<[a-z]+>|\s*[A-Za-z]+|\s*\d+|\s*[^\sA-Za-z\d<>]|\s+", text)


def _row(prefix: str, token: str, k: int) -> dict[str, float]:
    """A deterministic distribution for the token after ``prefix``, ``token`` on top."""
    salt = int(hashlib.sha256(prefix.encode()).hexdigest()[:6], 16)
    row = {token: -0.2 - (salt % 50) / 100}
    for j in range(1, k):
        row[f"alt{(salt + j) % 11}"] = -1.0 - j - (salt % 7) / 10
    return dict(list(row.items())[:k])


class Server:
    """Answers completions (plain and echo, in either layout) and chat, like llama.cpp."""

    def __init__(self, layout: str = "same") -> None:
        self.layout = layout
        self.statuses: list[int | str] = []  # per request: HTTP status or a failure name
        self.requests: list[dict[str, Any]] = []
        self.chat_answers: dict[str, list[str]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append({"path": request.url.path, **body})
        status = self.statuses.pop(0) if self.statuses else 200
        if status == "timeout":
            raise httpx.ReadTimeout("scripted timeout", request=request)
        if status == "connect":
            raise httpx.ConnectError("scripted refusal", request=request)
        if status == "malformed":
            return httpx.Response(200, content=b'{"choices": [', headers=_json)
        if status == "nologprobs":
            return httpx.Response(200, json=_completion("x", None, "stop"))
        if status == "context":  # llama.cpp's words
            message = "Requested tokens (3000) exceed context window of 2048"
            return httpx.Response(400, json={"error": {"message": message}})
        if status != 200:
            return httpx.Response(int(status), json={"error": {"message": f"scripted {status}"}})
        if request.url.path.endswith("/chat/completions"):
            return httpx.Response(200, json=self._chat(body))
        return httpx.Response(200, json=self._completion(body))

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt, k = body["prompt"], body["logprobs"]
        if not body.get("echo"):
            n = min(body["max_tokens"], len(ANSWER))
            rows = [_row(prompt + "".join(ANSWER[:t]), ANSWER[t], k) for t in range(n)]
            logprobs = {"tokens": ANSWER[:n], "top_logprobs": rows, "text_offset": [0] * n}
            return _completion("".join(ANSWER[:n]), logprobs, "length")
        tokens = [*_tokens(prompt), " more"]  # the one token echo requests generate
        prefixes = ["".join(tokens[:i]) for i in range(len(tokens))]
        rows: list[dict[str, float] | None] = [
            _row(prefixes[i], tokens[i], k) for i in range(len(tokens))
        ]
        if self.layout == "next":  # entry i holds the distribution after token i
            rows = [*rows[1:]]
            tokens = tokens[:-1]
        rows[0] = None
        logprobs = {"tokens": tokens, "top_logprobs": rows, "text_offset": [0] * len(tokens)}
        return _completion(prompt + " more", logprobs, "length")

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        question = body["messages"][-1]["content"]
        answer = self.chat_answers.get(question, ANSWER)[: body["max_tokens"]]
        content = [
            {
                "token": token,
                "logprob": -0.2,
                "top_logprobs": [
                    {"token": t, "logprob": v}
                    for t, v in _row(
                        question + "".join(answer[:i]), token, body["top_logprobs"]
                    ).items()
                ],
            }
            for i, token in enumerate(answer)
        ]
        return {
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{
                "index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "".join(answer)},
                "logprobs": {"content": content},
            }],
        }  # fmt: skip


_json = {"content-type": "application/json"}


def _completion(text: str, logprobs: dict[str, Any] | None, finish: str) -> dict[str, Any]:
    return {
        "id": "x", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }  # fmt: skip


def make(server: Server, **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("mode", "echo")
    kwargs.setdefault("echo_alignment", server.layout)
    kwargs.setdefault("chat_template", TEMPLATE)
    transport = httpx.MockTransport(server)

    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()
        return server(request)

    sync = openai.OpenAI(
        base_url="http://mock/v1", api_key=KEY, http_client=httpx.Client(transport=transport)
    )
    aclient = openai.AsyncOpenAI(
        base_url="http://mock/v1",
        api_key=KEY,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    return OpenAIBackend(
        "m", api_key=KEY, retry_wait=0, client=sync, async_client=aclient, **kwargs
    )


PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
VARIANT = [{"role": "user", "content": "What is the capitl of Frace?"}]


def _force(b: OpenAIBackend, gen: Generation, variants: Any = (VARIANT,)) -> Forced | APIError:
    request = ForcingRequest(PROMPT, list(variants), gen.token_ids, gen.text, include_original=True)
    result = b.teacher_force([request], top_k=3)[0]
    assert isinstance(result, Forced | APIError)
    return result


@pytest.mark.parametrize("layout", ["same", "next"])
def test_echo_rows_are_the_answer_positions_in_either_layout(layout: str) -> None:
    b = make(Server(layout))
    gen = b.generate([PROMPT], max_new_tokens=8, top_k=3)[0]
    assert isinstance(gen, Generation)
    assert gen.text == "Paris is nice" and len(gen.token_ids) == 3
    forced = _force(b, gen)
    assert isinstance(forced, Forced) and forced.original is not None
    # Each answer token is the top-1 of its own row: the rows are aligned, not shifted.
    assert b.token_strings([int(i) for i in forced.original.ids[:, 0]]) == ANSWER
    # Echo under the original prompt reproduces generation's distributions exactly.
    np.testing.assert_allclose(forced.original.values, gen.topk.values)
    variant = forced.variants[0]
    assert not np.allclose(variant.values, forced.original.values)  # the prompt moved them


def test_wrong_layout_is_caught_not_scored() -> None:
    # Configured "same" on a "next" server: the answer's rows are not where they should be.
    b = make(Server("next"), echo_alignment="same")
    gen = b.generate([PROMPT], max_new_tokens=8, top_k=3)[0]
    assert isinstance(gen, Generation)
    forced = _force(b, gen)
    assert isinstance(forced, Forced) and forced.original is not None
    top1 = b.token_strings([int(i) for i in forced.original.ids[:, 0]])
    assert top1 != ANSWER  # which is what the alignment probe detects on real servers


def test_chat_mode_scores_the_divergence_with_the_upper_bound() -> None:
    server = Server()
    server.chat_answers[VARIANT[0]["content"]] = ["Paris", " was", " nice"]  # diverges at 1
    b = make(server, mode="chat")
    assert b.approximate
    gen = b.generate([PROMPT], max_new_tokens=8, top_k=3)[0]
    assert isinstance(gen, Generation)
    request = ForcingRequest(PROMPT, [VARIANT, PROMPT], gen.token_ids, gen.text)
    forced = b.teacher_force([request], top_k=3)[0]
    assert isinstance(forced, Forced)
    assert forced.observed == [2, 3]  # exact up to and including the first disagreement
    score = esi_score(gen.topk, forced.variants, kind="logprobs", observed=forced.observed)
    assert score.distances[0, 2] == 1.0  # past the divergence: the Hellinger bound
    assert 0 < score.distances[0, 1] < 1.0  # at it: measured
    assert np.allclose(score.distances[1], 0.0)  # the unchanged prompt regenerates the answer
    with pytest.raises(ConfigurationError, match="echo mode"):
        b.encode_answer(PROMPT, "Paris")


@pytest.mark.parametrize(
    ("script", "attempts", "retryable", "status"),
    [
        ([500, 200], 2, None, None),
        ([429, 429, 200], 3, None, None),
        (["timeout", 200], 2, None, None),
        (["connect", 200], 2, None, None),
        ([503] * 5, 4, True, 503),
        (["timeout"] * 5, 4, True, None),
        ([400], 1, False, 400),
        ([404], 1, False, 404),
        (["malformed"], 1, False, None),
        (["nologprobs"], 1, False, None),
    ],
)
def test_retries_only_what_is_retryable_and_maps_the_rest(
    script: list[int | str], attempts: int, retryable: bool | None, status: int | None
) -> None:
    server = Server()
    server.statuses = list(script)
    b = make(server, max_retries=3)
    result = b.generate([PROMPT], max_new_tokens=4, top_k=3)[0]
    assert len(server.requests) == attempts
    assert b.stats.retries == attempts - 1
    if retryable is None:
        assert isinstance(result, Generation)
        return
    assert isinstance(result, APIError)
    assert result.retryable is retryable and result.status_code == status
    assert result.original is not None or "logprobs" in str(result)


def test_a_failed_prompt_is_its_own_error_and_the_batch_keeps_the_rest() -> None:
    server = Server()
    b = make(server, max_retries=0, max_concurrency=1)
    g = ESIGuard(backend=b, threshold=0.5, n_variants=2, top_k=3, on_error="raise")
    server.statuses = [400]  # the first prompt's generation
    out = g.batch(["What is the capital of France?", "Where is Paris?"], return_exceptions=True)
    assert isinstance(out[0], APIError) and out[0].status_code == 400
    assert out[1].response_metadata["esi"]["scored"]
    server.statuses = [400]  # the default policy withholds it instead, saying why
    withheld = ESIGuard(backend=b, threshold=0.5, n_variants=2, top_k=3).invoke("Where is Paris?")
    esi = withheld.response_metadata["esi"]
    assert esi["decision"] == "abstain" and esi["reason"].startswith("backend_error: ")
    assert "400" in esi["reason"] and not esi["scored"]
    with pytest.raises(APIError):
        server.statuses = [400]
        g.invoke("What is the capital of France?")


async def test_async_path_scores_and_maps_failures() -> None:
    server = Server()
    b = make(server, max_retries=1)
    g = ESIGuard(backend=b, threshold=0.5, n_variants=2, top_k=3, on_error="raise")
    server.statuses = [500]
    out = await g.abatch(["What is the capital of France?", "Where is Paris?"])
    assert all(m.response_metadata["esi"]["scored"] for m in out)
    assert b.stats.retries == 1
    server.statuses = [500, 500]
    with pytest.raises(APIError, match="HTTP 500"):
        await g.ainvoke("What is the capital of France?")


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
        self.seen.append(repr((args, kwargs)))

    def on_chain_end(self, *args: Any, **kwargs: Any) -> None:
        self.seen.append(repr((args, kwargs)))

    def on_chain_error(self, *args: Any, **kwargs: Any) -> None:
        self.seen.append(repr((args, kwargs)))


def test_the_api_key_never_leaks(caplog: pytest.LogCaptureFixture) -> None:
    server = Server()
    b = make(server)
    g = ESIGuard(backend=b, threshold=0.5, n_variants=2, top_k=3)
    recorder = Recorder()
    with caplog.at_level(logging.DEBUG):
        message = g.invoke("What is the capital of France?", config={"callbacks": [recorder]})
        server.statuses = [401]
        failure = g.batch(["Where is Paris?"], return_exceptions=True)[0]
    assert recorder.seen  # the recorder did see the run
    haystack = " ".join(
        [json.dumps(message.response_metadata), repr(b), repr(failure), str(failure),
         caplog.text, *recorder.seen, repr(g), json.dumps(g.to_json(), default=repr)]
    )  # fmt: skip
    assert KEY not in haystack


def test_prompts_and_answers_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    g = ESIGuard(backend=make(Server()), threshold=0.5, n_variants=2, top_k=3)
    with caplog.at_level(logging.DEBUG, logger="esi_guard"), caplog.at_level(logging.INFO):
        message = g.invoke("What is the capital of France?")
    answer = message.response_metadata["esi"]["answer"]
    assert answer and "capital of France" not in caplog.text and answer not in caplog.text


def test_echo_without_a_template_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="chat template"):
        OpenAIBackend("some-remote-model", base_url="http://mock/v1", mode="echo")
    # auto mode falls back to chat without probing.
    b = OpenAIBackend("some-remote-model", base_url="http://mock/v1", mode="auto")
    assert b.approximate and b.mode == "chat"


@pytest.mark.parametrize("layout", ["same", "next"])
def test_auto_mode_probes_once_and_detects_the_layout(layout: str) -> None:
    server = Server(layout)
    b = make(server, mode="auto", echo_alignment="auto")
    assert b.mode == "auto" and b.echo_alignment == "auto"
    gen = b.generate([PROMPT], max_new_tokens=8, top_k=3)[0]
    assert isinstance(gen, Generation)
    assert (b.mode, b.echo_alignment) == ("echo", layout)
    probes = len(server.requests) - 1
    assert probes == 2  # a greedy continuation and its echo
    b.generate([PROMPT], max_new_tokens=8, top_k=3)
    assert len(server.requests) == probes + 2  # remembered: no second probe


def test_auto_mode_takes_chat_when_the_server_refuses_echo() -> None:
    server = Server()
    server.statuses = [404]  # no completions endpoint
    b = make(server, mode="auto", echo_alignment="auto")
    gen = b.generate([PROMPT], max_new_tokens=8, top_k=3)[0]
    assert isinstance(gen, Generation) and b.mode == "chat" and b.approximate
    assert server.requests[-1]["path"].endswith("/chat/completions")


def test_auto_mode_decides_nothing_while_the_server_is_down() -> None:
    server = Server()
    server.statuses = [503]
    b = make(server, mode="auto", echo_alignment="auto", max_retries=0)
    with pytest.raises(APIError, match="503"):
        b.generate([PROMPT], max_new_tokens=8, top_k=3)
    assert b.mode == "auto"
    assert isinstance(b.generate([PROMPT], max_new_tokens=8, top_k=3)[0], Generation)
    assert b.mode == "echo"


async def test_async_requests_are_bounded_and_cancelled_with_their_caller() -> None:
    server = Server()
    state = {"in_flight": 0, "peak": 0, "cancelled": 0, "delay": 0.02}
    started = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        started.set()
        try:
            await asyncio.sleep(state["delay"])
            return server(request)
        except asyncio.CancelledError:
            state["cancelled"] += 1
            raise
        finally:
            state["in_flight"] -= 1

    transport = httpx.MockTransport(handler)
    aclient = openai.AsyncOpenAI(
        base_url="http://mock/v1", api_key=KEY, http_client=httpx.AsyncClient(transport=transport)
    )
    b = OpenAIBackend("m", api_key=KEY, retry_wait=0, async_client=aclient, mode="echo",
                      echo_alignment="same", chat_template=TEMPLATE, max_concurrency=2)  # fmt: skip
    g = ESIGuard(backend=b, threshold=0.5, n_variants=3, top_k=3)
    out = await g.abatch([f"Which famous river flows through city number {i}?" for i in range(6)])
    assert [m.response_metadata["esi"]["reason"] for m in out] == [None] * 6
    assert state["peak"] == 2  # never more than max_concurrency in flight
    state["delay"] = 30.0
    started.clear()
    task = asyncio.create_task(g.ainvoke("What is the capital of France?"))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state["cancelled"] >= 1 and state["in_flight"] == 0


def test_a_server_refusing_a_long_prompt_is_a_context_overflow() -> None:
    server = Server()
    g = ESIGuard(backend=make(server), threshold=0.5, n_variants=2, top_k=3)
    server.statuses = ["context"]
    esi = g.invoke("What is the capital of France?").response_metadata["esi"]
    assert esi["reason"].startswith("context_overflow: ") and "2048" in esi["reason"]
    server.statuses = ["context"]
    with pytest.raises(ContextLengthError) as caught:
        ESIGuard(backend=make(server), threshold=0.5, on_error="raise").invoke("Where is Rome?")
    assert isinstance(caught.value, APIError) and caught.value.status_code == 400
