"""``ESIGuardrail`` inside a real LiteLLM proxy on loopback, routing to the real llama.cpp server.

LiteLLM's proxy (``litellm[proxy]``) pins dependencies of its own, and the newest LiteLLM's
proxy extra needs a ``litellm-proxy`` distribution the package registry lacks: it runs from a
virtual environment of its own, ``.venv-litellm`` (``make install-litellm-proxy``, part of
``make test``), or the ``litellm`` executable named by ``ESI_GUARD_LITELLM``. The proxy is a
separate process either way, as it is in production; this test talks to it over HTTP with the
openai SDK.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from integrations.llamacpp.server import CHATML, LlamaServer, free_port

# Side by side (pytest -n), the session's llama.cpp servers on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.xdist_group("llama_server"),
]

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"


def litellm_executable() -> Path | None:
    named = os.environ.get("ESI_GUARD_LITELLM")
    path = Path(named) if named else ROOT / ".venv-litellm" / "bin" / "litellm"
    return path if path.is_file() else None


def config(server: LlamaServer, template: Path) -> str:
    """One route to the llama.cpp server; a flagging guardrail on by default, a blocking one
    a request switches on. Threshold 0: every scored answer is past it."""
    rail = (
        "      guardrail: esi_guard.litellm_guardrail.ESIGuardrail\n"
        "      mode: post_call\n"
        f"      api_base: {server.base_url}\n"
        f"      upstream_model: {server.model}\n"
        "      api_mode: echo\n"
        f"      chat_template: {template}\n"
        "      threshold: 0.0\n"
        "      n_variants: 2\n"
        "      top_k: 5\n"
    )
    return (
        "model_list:\n"
        "  - model_name: smol\n"
        "    litellm_params:\n"
        f"      model: openai/{server.model}\n"
        f"      api_base: {server.base_url}\n"
        "      api_key: none\n"
        "      temperature: 0\n"
        "guardrails:\n"
        "  - guardrail_name: esi-flag\n"
        "    litellm_params:\n"
        f"{rail}"
        "      default_on: true\n"
        "      esi_action: flag\n"
        "  - guardrail_name: esi-block\n"
        "    litellm_params:\n"
        f"{rail}"
        "      default_on: false\n"
        "      esi_action: block\n"
    )


@pytest.fixture
def proxy(llama_server: LlamaServer, tmp_path: Path) -> Iterator[tuple[str, str]]:
    executable = litellm_executable()
    if executable is None:
        pytest.skip("no LiteLLM proxy: run `make install-litellm-proxy` or set ESI_GUARD_LITELLM")
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    (tmp_path / "config.yaml").write_text(config(llama_server, template), encoding="utf-8")
    port = free_port()
    key = f"sk-{secrets.token_hex(16)}"  # the proxy refuses to start without a master key
    env = {
        "LITELLM_MASTER_KEY": key,
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network
        "PYTHONPATH": str(ROOT),
        "OPENAI_API_KEY": "none",
    }
    command = [str(executable), "--config", str(tmp_path / "config.yaml"),
               "--host", "127.0.0.1", "--port", str(port), "--telemetry", "False"]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until_ready(process, port, log)
            yield f"http://127.0.0.1:{port}/v1", key
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_until_ready(process: subprocess.Popen[bytes], port: int, log: IO[bytes]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/health/readiness", timeout=2
            ) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    log.seek(0)
    tail = log.read().decode(errors="replace").strip().splitlines()[-15:]
    pytest.fail("the LiteLLM proxy did not start:\n" + "\n".join(tail))


def test_litellm_proxy_flags_with_esi_and_blocks_with_its_400(proxy: tuple[str, str]) -> None:
    base_url, key = proxy
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    raw = client.chat.completions.with_raw_response.create(
        model="smol",
        messages=messages,
        max_tokens=8,
    )
    completion = raw.parse()
    esi = completion.model_extra["esi"]  # type: ignore[index]
    assert completion.choices[0].message.content
    assert esi["scored"] and esi["decision"] == "flag" and esi["score"] > 0.0
    assert esi["variants_used"] == 2
    assert raw.headers["x-esi-decision"] == "flag"
    assert float(raw.headers["x-esi-score"]) == pytest.approx(esi["score"], abs=1e-6)
    with pytest.raises(openai.BadRequestError) as blocked:
        client.chat.completions.create(
            model="smol", messages=messages, max_tokens=8,
            extra_body={"guardrails": ["esi-block"]},
        )  # fmt: skip
    assert blocked.value.status_code == 400
    body = blocked.value.body
    assert isinstance(body, dict)
    assert "ESI untrusted answer" in str(body)
    assert "'decision': 'flag'" in str(body) or '"decision": "flag"' in str(body)
