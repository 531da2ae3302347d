"""ESIGuardrail, the LiteLLM post-call guardrail, on the fake backend: flag or block."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
litellm = pytest.importorskip("litellm")
from fastapi import HTTPException  # noqa: E402

from esi_guard import FakeBackend  # noqa: E402
from esi_guard.exceptions import ConfigurationError  # noqa: E402
from esi_guard.litellm_guardrail import ESIGuardrail  # noqa: E402

# litellm's own types warn as pydantic builds them on first use.
pytestmark = pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning")

QUESTION = "What is the capital of France?"
SHAKY = "Which river flows through the town of Tübingen?"
ANSWERS = {QUESTION: "Paris", SHAKY: "the Danube river"}


def guardrail(esi_action: str = "flag", **backend: Any) -> ESIGuardrail:
    fake = FakeBackend(ANSWERS, sensitivity={SHAKY: 1.5}, **backend)
    return ESIGuardrail(backend=fake, threshold=0.3, esi_action=esi_action, n_variants=4,  # type: ignore[arg-type]
                        guardrail_name="esi", default_on=True)  # fmt: skip


def call(question: str) -> tuple[dict[str, Any], Any]:
    data = {"model": "m", "messages": [{"role": "user", "content": question}]}
    response = litellm.ModelResponse(
        model="m", choices=[{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": ANSWERS[question]}}],
    )  # fmt: skip
    return data, response


async def test_flag_passes_every_answer_with_its_esi_and_headers() -> None:
    rail = guardrail("flag")
    for question, decision in ((QUESTION, "accept"), (SHAKY, "flag")):
        data, response = call(question)
        out = await rail.async_post_call_success_hook(data, None, response)
        assert out.choices[0].message.content == ANSWERS[question]
        assert out.esi["decision"] == decision and out.esi["scored"]
        headers = out._hidden_params["additional_headers"]
        assert headers["x-esi-decision"] == decision
        assert float(headers["x-esi-score"]) == pytest.approx(out.esi["score"], abs=1e-6)


async def test_block_raises_litellms_400_for_untrusted_and_unscored_answers() -> None:
    data, response = call(QUESTION)
    passed = await guardrail("block").async_post_call_success_hook(data, None, response)
    assert passed.esi["decision"] == "accept"
    data, response = call(SHAKY)
    with pytest.raises(HTTPException) as untrusted:
        await guardrail("block").async_post_call_success_hook(data, None, response)
    assert untrusted.value.status_code == 400
    assert untrusted.value.detail["esi"]["decision"] == "flag"
    data, response = call(QUESTION)
    rail = guardrail("block", failures={QUESTION: "nan"})
    with pytest.raises(HTTPException) as unscored:
        await rail.async_post_call_success_hook(data, None, response)
    assert unscored.value.detail["esi"]["scored"] is False
    assert "could not be scored" in unscored.value.detail["error"]


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="threshold"):
        ESIGuardrail(backend=FakeBackend())
    with pytest.raises(ConfigurationError, match="api_base and upstream_model"):
        ESIGuardrail(threshold=0.3)
    with pytest.raises(ConfigurationError, match="'echo' or 'auto'"):
        ESIGuardrail(threshold=0.3, api_base="http://h/v1", upstream_model="m", api_mode="chat")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'flag' or 'block'"):
        ESIGuardrail(backend=FakeBackend(), threshold=0.3, esi_action="route")  # type: ignore[arg-type]
    # A mistyped file or template is named, not a float() or open() traceback.
    with pytest.raises(ConfigurationError, match=r"threshold thresholds/mine\.json: calibration "
                       "file not found"):  # fmt: skip
        ESIGuardrail(backend=FakeBackend(), threshold="thresholds/mine.json")
    with pytest.raises(ConfigurationError, match="a calibration file or a number, got 'high'"):
        ESIGuardrail(backend=FakeBackend(), threshold="high")
    with pytest.raises(ConfigurationError, match=r"cannot read the chat template nope\.jinja"):
        ESIGuardrail(threshold=0.3, api_base="http://h/v1", upstream_model="m",
                     chat_template="nope.jinja")  # fmt: skip


async def test_litellms_own_action_default_does_not_turn_flagging_into_blocking() -> None:
    # The proxy passes every custom guardrail action='block' among other providers' defaults.
    fake = FakeBackend(ANSWERS, sensitivity={SHAKY: 1.5})
    rail = ESIGuardrail(backend=fake, threshold=0.3, n_variants=4, action="block",
                        guardrail_name="esi", default_on=True)  # fmt: skip
    data, response = call(SHAKY)
    assert (await rail.async_post_call_success_hook(data, None, response)).esi["decision"] == "flag"
