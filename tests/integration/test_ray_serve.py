"""The guard on Ray Serve: a local Ray on loopback, the embedded model in 2 replicas.

Called with the openai SDK (invoke, stream); one replica killed (SIGKILL) while requests are
in flight: each request is answered with its decision or gets the retryable 503
``replica_unavailable``, the SDK's retry answers it, and Serve runs 2 replicas again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import httpx
import openai
import pytest

# Side by side (pytest -n), one local Ray at a time: every Ray test and docs/ray.md on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.xdist_group("ray"),
]

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from benchmarks.timing.ray import embedded_guard  # noqa: E402
from esi_guard.ray import guard_app  # noqa: E402
from esi_guard.server import ServeSettings  # noqa: E402
from integrations.llamacpp.server import free_port  # noqa: E402

APP, KEY, MODEL = "esi-guard", "test-key", "guarded"
COUNTRIES = ("France", "Japan", "Brazil", "Kenya", "Canada", "Norway", "Egypt", "Peru")
QUESTIONS = [f"What is the capital city of {c}?" for c in COUNTRIES]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    settings = ServeSettings(model_name=MODEL, api_key=KEY, max_batch=8)
    app = guard_app(partial(embedded_guard, 3, 12), settings, num_replicas=2,
                    health_check_period_s=2, health_check_timeout_s=10)  # fmt: skip
    serve.run(app, name=APP, route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        serve.shutdown()
        ray.shutdown()


def _pids(want: int = 2, seconds: float = 180) -> list[int]:
    """The replicas' process ids, once ``want`` distinct ones answer."""
    handle = serve.get_deployment_handle("ESIGuard", app_name=APP)
    deadline, seen = time.monotonic() + seconds, set()
    while time.monotonic() < deadline:
        try:
            card = handle.describe.remote().result(timeout_s=10)
        except Exception:  # a replica starting or gone: ask again
            time.sleep(0.5)
            continue
        seen.add(card["pid"])
        if len(seen) >= want:
            return sorted(seen)
    raise AssertionError(f"fewer than {want} replicas answered: {seen}")


def _marked(raw: Any) -> dict[str, Any]:
    """A 200 with its decision in the body and the header; its ``esi``."""
    assert raw.status_code == 200
    esi = raw.parse().model_extra["esi"]
    assert esi["decision"] in {"accept", "flag"}
    assert raw.headers["x-esi-decision"] == esi["decision"]
    return esi  # type: ignore[no-any-return]


def test_two_replicas_serve_the_openai_sdk(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    esi = _marked(raw)
    assert esi["scored"] and esi["score"] >= 0
    answer = raw.parse().choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True))  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].model_extra["esi"]["decision"] == esi["decision"]  # type: ignore[index]
    refused = httpx.post(f"{base_url}/chat/completions", headers={"Authorization": "Bearer no"},
                         json={"model": MODEL, "messages": messages})  # fmt: skip
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert len(_pids(2)) == 2


def _ask(client: openai.OpenAI, i: int) -> Any:
    messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" ({i})"}]
    try:
        return client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    except openai.APIError as exc:
        return exc


def test_a_killed_replica_loses_no_request_and_is_replaced(base_url: str) -> None:
    victim = _pids(2)[0]
    once = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(_ask, once, i) for i in range(16)]
        time.sleep(1.0)  # both replicas busy with a batch
        os.kill(victim, signal.SIGKILL)
        outcomes = [f.result() for f in futures]
    failed = [i for i, o in enumerate(outcomes) if isinstance(o, Exception)]
    for i, outcome in enumerate(outcomes):
        if i not in failed:
            _marked(outcome)
            continue
        assert isinstance(outcome, openai.APIStatusError), repr(outcome)
        assert outcome.status_code == 503
        assert outcome.body["code"] == "replica_unavailable"  # type: ignore[index]
        assert outcome.response.headers["retry-after"] == "1"
    assert failed, "the kill came after every answer: no request was in flight"
    retrying = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=5)
    for i in failed:
        _marked(_ask(retrying, i))
    after = _pids(2)
    assert victim not in after and len(after) == 2
