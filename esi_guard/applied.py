"""A decided answer applied: what the caller is sent in its place, in one vocabulary.

:func:`apply` turns an :class:`~esi_guard.ESIResult` (and, for ``route``, the fallback's answer)
into an :class:`Applied`, which every front end (the chat model, ``esi-guard serve``) only
translates to its own format. Pure: no model, no LangChain import (the fallback is duck-typed).

=============  ===========================================  ============================
decision       content                                      finish reason
=============  ===========================================  ============================
``accept``     the answer                                   the answer's (``stop``...)
``flag``       the answer (the metadata says why)           the answer's
``abstain``    the abstain message                          ``content_filter``
``redact``     the answer without its untrusted sentences   the answer's
``route``      the fallback's answer (its usage added)      the fallback's, else ``stop``
=============  ===========================================  ============================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from esi_guard._text import message_text
from esi_guard.result import ESIResult

__all__ = ["ABSTAIN_FINISH_REASON", "Applied", "apply", "esi_info"]

ABSTAIN_FINISH_REASON = "content_filter"
"""OpenAI's finish reason for an answer a filter withheld, so every client already knows it."""


@dataclass(frozen=True)
class Applied:
    """What is sent in place of one guarded answer."""

    content: str
    finish_reason: str
    input_tokens: int
    """The prompt's tokens (plus the fallback's prompt, when routed)."""
    output_tokens: int
    """The answer's tokens (plus the fallback's answer, when routed)."""
    esi: dict[str, Any]
    """``response_metadata["esi"]``: the result's ``as_dict()``, and ``fallback_used`` if routed."""
    fallback_metadata: dict[str, Any] = field(default_factory=dict)
    """The fallback's ``response_metadata`` if routed (model name, finish reason), else empty."""

    @property
    def total_tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens


def apply(result: ESIResult, fallback: Any = None, *, abstain_message: str) -> Applied:
    """``result``'s decision applied (the module's table); ``fallback``: the answer routed to."""
    esi = result.as_dict()
    prompt_tokens, answer_tokens = result.prompt_tokens or 0, len(result.answer_token_ids)
    finish = result.finish_reason or "stop"
    if result.decision == "abstain":
        return Applied(abstain_message, ABSTAIN_FINISH_REASON, prompt_tokens, answer_tokens, esi)
    if result.decision == "redact":
        return Applied(result.kept_answer, finish, prompt_tokens, answer_tokens, esi)
    if result.decision == "route" and fallback is not None:
        meta = dict(getattr(fallback, "response_metadata", None) or {})
        usage = getattr(fallback, "usage_metadata", None) or {}
        return Applied(
            content=message_text(fallback, skip_other_blocks=True),  # a model's output
            finish_reason=meta.get("finish_reason") or "stop",
            input_tokens=prompt_tokens + usage.get("input_tokens", 0),
            output_tokens=answer_tokens + usage.get("output_tokens", 0),
            esi={**esi, "fallback_used": True},
            fallback_metadata=meta,
        )
    return Applied(result.answer, finish, prompt_tokens, answer_tokens, esi)


def esi_info(esi: dict[str, Any]) -> dict[str, Any]:
    """The ``esi`` object a response carries, from a result's ``as_dict()``.

    Score, decision, threshold and its source (``given``, ``file`` with the server's path left out,
    or ``shipped:<file>``), whether scored and why not, variants used, model; ``p_wrong``,
    ``decided_by``, ``fallback_used`` where set; each sentence's span (offsets in the model's
    answer), score and decision; how many were ``redacted``. No withheld or removed text is sent.
    """
    info = {
        "score": esi.get("score"),
        "decision": esi["decision"],
        "threshold": esi["threshold"],
        "scored": esi["scored"],
        "reason": esi.get("reason"),
        "variants_used": esi.get("variants_used", 0),
        "model": esi.get("model"),
        "threshold_source": _source(esi.get("threshold_source", "given")),
    }
    for name in ("p_wrong", "decided_by", "fallback_used"):
        if esi.get(name) is not None:
            info[name] = esi[name]
    if esi.get("sentences"):
        keys = ("start", "end", "score", "decision", "p_wrong")
        info["sentences"] = [{k: s[k] for k in keys if k in s} for s in esi["sentences"]]
    if esi.get("redacted"):
        info["redacted"] = len(esi["redacted"])
    return info


def _source(source: str) -> str:
    """``threshold_source`` as a client sees it: a threshold file's path stays on the server."""
    return "file" if source.startswith("file:") else source
