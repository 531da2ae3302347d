"""ESIGuardrail in block mode blocks every answer it did not accept: each choice of ``n > 1``,
and a response whose answer it cannot read (found by an audit of fail-open paths: only the
first choice was scored, and an unreadable answer passed unscored)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
litellm = pytest.importorskip("litellm")
from fastapi import HTTPException  # noqa: E402

from esi_guard import FakeBackend  # noqa: E402
from esi_guard.backends import Forced, ForcingRequest  # noqa: E402
from esi_guard.exceptions import BackendError  # noqa: E402
from esi_guard.litellm_guardrail import ESIGuardrail  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning")

QUESTION = "What is the capital of France?"


class FailsOn(FakeBackend):
    """Forcing fails for one answer (the upstream dropped that request)."""

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        out = super().teacher_force(requests, top_k=top_k)
        return [BackendError("upstream down") if r.answer == "Lyon" else o
                for r, o in zip(requests, out, strict=True)]  # fmt: skip


def rail() -> ESIGuardrail:
    return ESIGuardrail(backend=FailsOn(), threshold=0.3, esi_action="block", n_variants=4,
                        guardrail_name="esi", default_on=True)  # fmt: skip


def chat(*answers: str) -> Any:
    return litellm.ModelResponse(model="m", choices=[
        {"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": a}}
        for i, a in enumerate(answers)
    ])  # fmt: skip


async def test_block_blocks_an_unscored_answer_in_any_choice() -> None:
    data = {"model": "m", "n": 2, "messages": [{"role": "user", "content": QUESTION}]}
    with pytest.raises(HTTPException) as blocked:
        await rail().async_post_call_success_hook(data, None, chat("Paris", "Lyon"))
    assert blocked.value.status_code == 400
    assert blocked.value.detail["esi"]["scored"] is False
    passed = await rail().async_post_call_success_hook(data, None, chat("Paris", "Paris"))
    assert passed.esi["decision"] == "accept"


async def test_block_blocks_an_answer_it_cannot_read() -> None:
    data = {"model": "m", "prompt": QUESTION}  # a text completion: no messages
    response = litellm.TextCompletionResponse(
        model="m", choices=[{"index": 0, "text": "Lyon", "finish_reason": "stop"}]
    )
    with pytest.raises(HTTPException) as blocked:
        await rail().async_post_call_success_hook(data, None, response)
    assert blocked.value.status_code == 400
