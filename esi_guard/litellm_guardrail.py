"""``ESIGuardrail``: ESI as a LiteLLM proxy guardrail (the ``litellm`` extra).

After each call (``post_call``) it scores the route's answer with :meth:`ESIGuard.score`,
teacher-forced by the API backend on the same upstream, then flags it (``esi_action="flag"``, the
default: an ``esi`` object on the response, ``x-esi-score`` and ``x-esi-decision`` headers) or
blocks every answer not accepted, unscored ones included (``esi_action="block"``: LiteLLM's
guardrail HTTP 400, its detail carrying ``esi``). In the proxy's ``config.yaml``::

    guardrails:
      - guardrail_name: esi
        litellm_params:
          guardrail: esi_guard.litellm_guardrail.ESIGuardrail
          mode: post_call
          default_on: true
          api_base: http://vllm-host:8000/v1     # the upstream the route answers from
          upstream_model: meta-llama/Llama-3.1-8B-Instruct
          threshold: /etc/esi/threshold.json     # a calibration file, or a number
          esi_action: block                      # or flag

Streaming responses are not scored (the post-call hook sees whole responses only; use
``esi-guard serve``). Scoring runs in a worker thread, one answer at a time per request.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any, Literal

from litellm.integrations.custom_guardrail import CustomGuardrail
from litellm.types.guardrails import GuardrailEventHooks

from esi_guard.applied import esi_info
from esi_guard.backends.adapters import read_chat_template
from esi_guard.backends.base import Backend
from esi_guard.exceptions import ConfigurationError
from esi_guard.served import build_guard

if TYPE_CHECKING:
    from esi_guard.result import ESIResult

__all__ = ["ESIGuardrail", "esi_summary"]


def esi_summary(result: ESIResult) -> dict[str, Any]:
    """What a response says about its answer (the same object ``esi-guard serve`` sends)."""
    return esi_info(result.as_dict())


class ESIGuardrail(CustomGuardrail):
    """Score each answer of a LiteLLM route with ESI; flag it, or block it with a 400.

    Args:
        api_base: The upstream's ``/v1`` URL (the server the route answers from).
        upstream_model: The model name the upstream serves.
        threshold: A calibration file (``esi-guard calibrate``) or a number.
        esi_action: ``flag`` or ``block`` (not ``action``: LiteLLM sets its own on every guardrail).
        api_key: The upstream's key (default ``OPENAI_API_KEY``, else none).
        api_mode: ``echo`` or ``auto`` (echo if offered); ``chat`` cannot teacher-force: refused.
        chat_template: A Jinja chat template file, for echo mode.
        n_variants: L, variants per question (a calibration file's own by default).
        top_k: k, tokens per distribution (the file's by default).
        backend: A ready backend instead of the upstream's (tests, a model in process).
        **kwargs: LiteLLM's guardrail settings (``guardrail_name``, ``event_hook``...).
    """

    def __init__(
        self,
        *,
        api_base: str | None = None,
        upstream_model: str | None = None,
        threshold: str | float | None = None,
        esi_action: Literal["flag", "block"] = "flag",
        api_key: str | None = None,
        api_mode: Literal["echo", "auto"] = "auto",
        chat_template: str | None = None,
        n_variants: int | None = None,
        top_k: int | None = None,
        backend: Backend | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("supported_event_hooks", [GuardrailEventHooks.post_call])
        kwargs.setdefault("event_hook", GuardrailEventHooks.post_call)
        super().__init__(**kwargs)
        if esi_action not in ("flag", "block"):
            msg = f"esi_action must be 'flag' or 'block', got {esi_action!r}"
            raise ConfigurationError(msg)
        if threshold is None:
            msg = "ESIGuardrail needs threshold: a calibration file or a number"
            raise ConfigurationError(msg)
        if backend is None:
            backend = _upstream(api_base, upstream_model, api_key, api_mode, chat_template)
        self.guard = build_guard(backend, str(threshold), on_error="flag", option="threshold",
                                 n_variants=n_variants, top_k=top_k)  # fmt: skip
        self.esi_action: Literal["flag", "block"] = esi_action

    async def async_post_call_success_hook(
        self, data: dict[str, Any], user_api_key_dict: Any, response: Any
    ) -> Any:
        """Score the response's answer; flag it, or raise LiteLLM's 400 to block it."""
        if not self.should_run_guardrail(data=data, event_type=GuardrailEventHooks.post_call):
            return response
        answers = _answers(response)
        messages = data.get("messages")
        texts = [answer for answer in answers or () if answer is not None]
        if answers is None or (texts and not messages):  # an answer it cannot score
            if self.esi_action == "block":
                _block("answer could not be read", None)
            return response
        if not texts or not messages:
            return response
        prompt = [{"role": m["role"], "content": _text(m.get("content"))} for m in messages]
        results = [await asyncio.to_thread(self.guard.score, prompt, text) for text in texts]
        # Every choice is scored; the response reports the first one not accepted.
        result = next((r for r in results if r.decision != "accept"), results[0])
        info = esi_summary(result)
        if self.esi_action == "block" and result.decision != "accept":
            _block("untrusted answer" if result.scored else "answer could not be scored", info)
        _mark(response, info)
        return response


def _block(why: str, info: dict[str, Any] | None) -> None:
    """LiteLLM's guardrail 400, saying why (and the answer's ``esi`` where it was scored)."""
    from fastapi import HTTPException

    detail: dict[str, Any] = {"error": f"Violated guardrail policy: ESI {why}"}
    if info is not None:
        detail["esi"] = info
    raise HTTPException(status_code=400, detail=detail)


def _upstream(
    api_base: str | None, model: str | None, api_key: str | None, mode: str,
    chat_template: str | None,
) -> Backend:  # fmt: skip
    if not api_base or not model:
        msg = "ESIGuardrail needs api_base and upstream_model (the route's upstream), or backend"
        raise ConfigurationError(msg)
    if mode not in ("echo", "auto"):
        msg = (
            f"ESIGuardrail api_mode must be 'echo' or 'auto', got {mode!r}: it scores answers "
            "the route generated, which needs the upstream's echo logprobs (teacher forcing)"
        )
        raise ConfigurationError(msg)
    from esi_guard.backends.openai import OpenAIBackend

    return OpenAIBackend(model, base_url=api_base, api_key=api_key, mode=mode,  # type: ignore[arg-type]
                         chat_template=read_chat_template(chat_template))  # fmt: skip


def _answers(response: Any) -> list[str | None] | None:
    """Each choice's text (None: nothing to score); None if one is not a chat message's text."""
    out: list[str | None] = []
    for choice in getattr(response, "choices", None) or ():
        message = getattr(choice, "message", None)
        if message is None:
            return None
        content = getattr(message, "content", None)
        if content is not None and not isinstance(content, str):
            return None
        out.append(content if content and content.strip() else None)
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def _mark(response: Any, info: dict[str, Any]) -> None:
    """``esi`` on the response, and the two headers LiteLLM adds to the HTTP reply."""
    score = info["score"]
    shown = "none" if score is None or not math.isfinite(score) else f"{score:.6f}"
    hidden = getattr(response, "_hidden_params", None)
    if isinstance(hidden, dict):
        headers = hidden.setdefault("additional_headers", {}) or {}
        headers.update({"x-esi-score": shown, "x-esi-decision": str(info["decision"])})
        hidden["additional_headers"] = headers
    response.esi = info
