"""What the guard reports: the per-answer ``ESIResult`` and the one ``ScoringConfig``.

``ScoringConfig`` is the single description of how scores are computed, shared by the guard, its
results, the calibration cache and the threshold file: a threshold only means something for scores
computed the same way, and :meth:`ScoringConfig.differences` names what is not the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from esi_guard import _retired
from esi_guard._keywords import check_keywords
from esi_guard.backends.hidden import HiddenStates
from esi_guard.sentences import SentenceScore

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "Action",
    "Decision",
    "ESIResult",
    "OnError",
    "ScoringConfig",
]

DEFAULT_MAX_NEW_TOKENS = 64
"""Most tokens per answer, for the guard and ``esi-guard calibrate`` alike (a threshold file
records its own, and a guard built from it answers with it)."""

Decision = Literal["accept", "flag", "abstain", "route", "redact", "raise", "pass"]
"""``accept`` for a trusted answer, else the action taken (``raise``: by the agent middleware;
``redact``: sentences removed); ``pass``: an agent's tool-call turn, passed on unscored."""

Action = Literal["flag", "abstain", "route", "redact"]
"""What the guard does with an untrusted answer (``redact``: drops sentences past the threshold)."""

OnError = Literal["abstain", "flag", "raise"]
"""What the guard does with an answer it could not score."""


_RETIRED = ("min_variants", "stop_constant")
"""Fields of modes retired in 0.2.0 (:mod:`esi_guard._retired`) that older files hold."""


def _decision_moved(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` less an older file's ``decide_on`` (now ``granularity``); a retired value errors."""
    if "decide_on" not in data:
        return data
    if data["decide_on"] == "context_reliance":
        error = _retired.retired("context_reliance", where)
        raise error
    return {key: value for key, value in data.items() if key != "decide_on"}


class ScoringConfig(BaseModel):
    """How scores are computed; a guard must score the same way to use a threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, **data: Any) -> None:
        """Validate; an unknown field is a :class:`ConfigurationError` naming the nearest."""
        data = _decision_moved(_retired.check(data, _RETIRED, "ScoringConfig"), "scoring")
        check_keywords("ScoringConfig", data, type(self).model_fields)
        super().__init__(**data)

    @model_validator(mode="before")
    @classmethod
    def _not_retired(cls, data: Any) -> Any:
        """A file's fields of retired modes: dropped when unset, an error when set."""
        if not isinstance(data, dict):
            return data
        return _decision_moved(_retired.check(data, _RETIRED, "scoring"), "scoring")

    intervention: dict[str, Any]
    """The intervention's ``describe()``: its name and parameters."""
    n_variants: int = Field(ge=1)
    """L, the number of variants per question."""
    top_k: int = Field(ge=1)
    """k, the tokens kept in each truncated distribution."""
    distance: str
    """The distance between truncated distributions."""
    support: Literal["pair", "all"] = "pair"
    """The tokens two truncated distributions are compared on (see :func:`~esi_guard.esi_score`)."""
    values: Literal["logits", "logprobs"]
    """What the backend's top-k values are."""
    approximate: bool
    """True when the variants' distributions are not exact teacher forcing."""
    seed: int
    """Seed of the intervention."""
    max_new_tokens: int = Field(ge=1)
    """Most tokens generated per answer."""
    system_prompt: str | None = None
    """The system prompt a calibration run put before each question (None for a guard)."""
    prompt_template: str | None = None
    """A calibration run's ``with_prompt`` template (``{question}``, ``{context}``), or None."""

    def differences(self, other: ScoringConfig, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """One ``"<field>: <this> vs <other>"`` line per field whose values differ."""
        mine, theirs = self.model_dump(), other.model_dump()
        return [
            f"{name}: {mine[name]!r} vs {theirs[name]!r}"
            for name in type(self).model_fields
            if name not in ignore and mine[name] != theirs[name]
        ]

    def score_differences(self, other: ScoringConfig) -> list[str]:
        """:meth:`differences` without the prompt fields: a guard is handed its prompts."""
        return self.differences(other, ignore=("system_prompt", "prompt_template"))

    def as_metadata(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the optional fields left out when unset)."""
        optional = ("system_prompt", "prompt_template")
        unset = {name for name in optional if getattr(self, name) is None}
        return self.model_dump(exclude=unset)


@dataclass
class ESIResult:
    """What the guard found about one answer; ``as_dict()`` is ``response_metadata["esi"]``."""

    score: float | None
    """The ESI score; None if unscored or decided without ESI (``decided_by="free"``)."""
    threshold: float
    """Scores above it are not trusted."""
    decision: Decision
    """``accept`` (scored, at or below the threshold) or the action taken."""
    scored: bool
    """False when no score could be computed; the action is then taken (fail closed)."""
    reason: str | None
    """Why the answer was not scored (``"<code>: <message>"``), or None."""
    answer: str
    """The model's answer (kept here when withheld or replaced)."""
    variants: list[str]
    """The intervened question texts actually used."""
    answer_token_ids: list[int]
    """Answer tokens, end-of-sequence excluded."""
    token_scores: list[float]
    """Per-token contributions (mean over variants of alpha_t * D)."""
    model: str
    """Backend's model identity."""
    scoring: dict[str, Any] = field(default_factory=dict)
    """The :class:`ScoringConfig` the score was computed with, as a dict."""
    finish_reason: str | None = None
    """``stop`` or ``length`` when the guard generated the answer."""
    work: dict[str, int] = field(default_factory=dict)
    """ESI's extra work (``forced_variants``, ``forced_tokens``); never in ``usage_metadata``."""
    variant_scores: list[float] = field(default_factory=list)
    """Each variant's score (mean over tokens of alpha_t * D), in ``variants`` order; ``score`` is
    their mean."""
    variants_used: int = 0
    """Variants scored: ``n_variants``, fewer if the intervention gave fewer, 0 without ESI."""
    signals: dict[str, float] = field(default_factory=dict)
    """The answer's free signals from the same pass, over each position's top-k: ``nll`` (its
    negative log-probability), ``entropy`` (mean entropy), ``max_nll`` (its least likely token's)
    and, with a hidden-state probe, ``hidden`` (the probe's term in ``p_wrong``'s logit). Empty
    when unscored."""
    p_wrong: float | None = None
    """With a combined score: the probability the answer is wrong, which then decides; else None."""
    decided_by: Literal["probe", "free", "esi"] | None = None
    """What decided, if the guard can decide without ESI (else None, left out): ``probe`` (an
    ESI-probe cascade's estimate of ESI, in ``score``), ``free`` (a combined score without ESI,
    alone or as a value cascade outside its band; ``score`` None) or ``esi`` (ESI after those)."""
    probe_score: float | None = None
    """With a cascade: the ESI probe's estimate of the score; None otherwise (left out)."""
    hidden: HiddenStates | None = field(default=None, repr=False, compare=False)
    """The answer's hidden states if asked for (``ESIGuard(hidden_states=...)``), else None; in
    ``as_dict()`` as ``layers``, ``positions`` and nested lists of ``values``."""

    sentences: list[SentenceScore] = field(default_factory=list)
    """The answer's sentences, each scored and decided (:mod:`esi_guard.sentences`) for ``redact``
    and ``decide_on="sentences"``; empty without ESI or if the backend cannot map tokens to text."""
    sentence_threshold: float | None = None
    """The threshold sentences were decided on, when it is not ``threshold`` (left out)."""
    threshold_source: str = "given"
    """Where ``threshold`` came from: ``"given"``, ``"file:<path>"`` or ``"shipped:<file>"``."""

    prompt_tokens: int | None = field(default=None, compare=False)
    """The prompt's tokens if known (set by :meth:`ESIGuard.assess`; not in ``as_dict()``)."""

    @property
    def kept_answer(self) -> str:
        """The answer less its sentences decided ``redact``: what ``action="redact"`` returns."""
        if not any(sentence.decision == "redact" for sentence in self.sentences):
            return self.answer
        kept = [s.text for s in self.sentences if s.decision != "redact"]
        return "".join(kept).rstrip()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy; ``hidden`` only if kept.

        With sentences removed, ``redacted``: each one's ``text``, ``start``, ``end``, ``score``
        (and ``p_wrong``) and the ``threshold`` it was past.
        """
        hidden = self.hidden
        out = asdict(replace(self, hidden=None, sentences=[]))
        out["sentences"] = [sentence.as_dict() for sentence in self.sentences]
        limit = self.threshold if self.sentence_threshold is None else self.sentence_threshold
        removed = [
            {key: value for key, value in sentence.as_dict().items()
             if key in ("text", "start", "end", "score", "p_wrong")} | {"threshold": limit}
            for sentence in self.sentences if sentence.decision == "redact"
        ]  # fmt: skip
        if removed:
            out["redacted"] = removed
        for name in ("decided_by", "probe_score", "sentence_threshold"):
            if out[name] is None:
                del out[name]
        del out["hidden"], out["prompt_tokens"]
        if hidden is not None:
            out["hidden"] = {"layers": list(hidden.layers), "positions": list(hidden.positions),
                             "values": hidden.values.tolist()}  # fmt: skip
        return out
