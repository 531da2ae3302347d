"""``esi-guard serve`` on the embedded model in process (llama.cpp), from real clients."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from esi_guard import ESIGuard, LlamaCppBackend
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID
from integrations.llamacpp.server import free_port
from tests.unit.server.servers import process_ready, served, user

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What gas do plants absorb from the air?",
    "Which planet is known as the Red Planet?",
]


def test_the_embedded_model_served_to_the_openai_sdk_and_chat_openai() -> None:
    backend = LlamaCppBackend.default(n_threads=1)
    guard = ESIGuard(backend=backend, threshold=0.5, n_variants=3, max_new_tokens=12)
    direct = guard.invoke(QUESTIONS[0])
    with served(guard, batch_window_ms=50) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        name = client.models.list().data[0].id
        completion = client.chat.completions.create(model=name, messages=user(QUESTIONS[0]))
        esi = completion.model_extra["esi"]  # type: ignore[index]
        assert esi["scored"] and math.isfinite(esi["score"])
        assert esi["decision"] == ("accept" if esi["score"] <= 0.5 else "flag")
        assert completion.choices[0].message.content == direct.content  # the same greedy answer
        assert esi["score"] == pytest.approx(direct.response_metadata["esi"]["score"], abs=1e-6)
        model = ChatOpenAI(base_url=base_url, api_key="none", model=name, max_retries=0)  # type: ignore[arg-type]
        streamed = "".join(str(c.content) for c in model.stream(QUESTIONS[0]))
        assert streamed == completion.choices[0].message.content
        answers = model.batch(QUESTIONS, config={"max_concurrency": 4})
        assert answers[0].content == completion.choices[0].message.content
        assert all(a.content for a in answers)
        metrics = client.with_options(base_url=base_url.removesuffix("/v1")).get(
            "/metrics", cast_to=str
        )
    assert "esi_guard_batch_size_count" in metrics


ROOT = Path(__file__).resolve().parents[2]
LONG = "Answer from the passage.\n\n" + "Paris is the capital of France. " * 20 + QUESTIONS[0]


def test_esi_guard_serve_as_docs_start_it_names_warns_and_drains_after_sigterm() -> None:
    """`esi-guard serve --model default`, a real process: issue 49's papercuts, each checked."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "esi_guard.cli", "serve", "--model", "default",
               "--port", str(port), "--drain-seconds", "300"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE) as process:  # fmt: skip
        try:
            process_ready(process, url)
            models = httpx.get(f"{url}/v1/models").json()
            out: dict[str, Any] = {}
            body = {"model": "default", "messages": user(LONG)}  # the name it was started with
            asking = threading.Thread(target=lambda: out.update(r=httpx.post(
                f"{url}/v1/chat/completions", json=body, timeout=600)))  # fmt: skip
            asking.start()
            while asking.is_alive() and "in_flight 1.0" not in httpx.get(f"{url}/metrics").text:
                time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            health = httpx.get(f"{url}/health", timeout=5)  # draining, not refused
            asking.join(600)
            assert process.wait(60) in (0, -signal.SIGTERM)
        finally:
            process.kill()
        log = process.stderr.read().decode() if process.stderr else ""
    assert [m["id"] for m in models["data"]] == [EMBEDDED_MODEL_ID, "default"]
    assert health.status_code == 503 and health.json()["draining"] is True
    answer = out["r"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == EMBEDDED_MODEL_ID
    (warning,) = answer.json()["esi"]["warnings"]
    assert warning.startswith("whole_message:")
    assert answer.headers["X-ESI-Warning"] == "whole_message"
    start = next(line for line in log.splitlines() if "serving model" in line)
    for said in (EMBEDDED_MODEL_ID, "engine llamacpp-f16", "threshold 0.88", "on p_wrong",
                 "shipped threshold", "action flag", "auth off", "'default'"):  # fmt: skip
        assert said in start, start
    assert "WholeMessageWarning" not in log  # the caller got it, not the server's log
