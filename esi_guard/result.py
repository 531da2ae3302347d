"""What the guard reports: the per-answer ``ESIResult`` and the one ``ScoringConfig``.

``ScoringConfig`` is the single description of how scores are computed. The guard
exposes its own (``ESIGuard.scoring_config``), every result carries it (``scoring``), the
calibration runner keys its cache on it and the threshold file stores it: a threshold
only means something for scores computed the same way, and :meth:`ScoringConfig.differences`
names what is not the same.
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
"""Most tokens per answer, for the guard and ``esi-guard calibrate`` alike (a threshold
file records the value it was calibrated with, and a guard from it answers with it)."""

Decision = Literal["accept", "flag", "abstain", "route", "redact", "raise", "pass"]
"""``accept`` for a trusted answer, otherwise the action the guard took (``raise``: the
agent middleware raised :class:`UncertainAnswerError`; ``redact``: some of the answer's
sentences were removed); ``pass``: not an answer (an agent turn that calls tools), passed
on unscored."""

Action = Literal["flag", "abstain", "route", "redact"]
"""What the guard does with an untrusted answer (``redact``: removes the sentences past
the threshold)."""

OnError = Literal["abstain", "flag", "raise"]
"""What the guard does with an answer it could not score."""


_RETIRED = ("min_variants", "stop_constant")
"""Fields of modes retired in 0.2.0 (:mod:`esi_guard._retired`) that older files hold."""


def _decision_moved(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` without the ``decide_on`` a file written before 0.2.0 holds.

    What a threshold applies to is the file's ``granularity``, not the score's;
    ``decide_on="context_reliance"`` (retired in 0.2.0) gets its one-line error.
    """
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
    """The tokens two truncated distributions are compared on (see
    :func:`~esi_guard.esi_score`)."""
    values: Literal["logits", "logprobs"]
    """What the backend's top-k values are."""
    approximate: bool
    """True when the variants' distributions are not exact teacher forcing."""
    seed: int
    """Seed of the intervention."""
    max_new_tokens: int = Field(ge=1)
    """Most tokens generated per answer."""
    system_prompt: str | None = None
    """The system prompt a calibration run put before each question (None for a guard,
    which takes whatever prompt the chain hands it)."""
    prompt_template: str | None = None
    """The template a calibration run rendered each question with (``{question}``, and
    ``{context}`` for data with passages), through ``ESIGuard.with_prompt``; None when the
    question was its own message."""

    def differences(self, other: ScoringConfig, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """One ``"<field>: <this> vs <other>"`` line per field whose values differ."""
        mine, theirs = self.model_dump(), other.model_dump()
        return [
            f"{name}: {mine[name]!r} vs {theirs[name]!r}"
            for name in type(self).model_fields
            if name not in ignore and mine[name] != theirs[name]
        ]

    def score_differences(self, other: ScoringConfig) -> list[str]:
        """:meth:`differences` in what defines the score, the prompt left out.

        A guard is handed its prompts (a threshold file sets its own on the guard, and a
        probe estimates ESI under any): only a difference in the score itself refuses.
        """
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
    """ESI score, or None when the answer could not be scored (``scored`` False) or was
    decided without ESI (``decided_by="free"``: a combined score without ESI; the decision
    is then on ``p_wrong``)."""
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
    """ESI's work beyond the answer itself: ``forced_variants`` (prompts teacher-forced)
    and ``forced_tokens`` (answer tokens forced after them); never part of the model's
    ``usage_metadata``."""
    variant_scores: list[float] = field(default_factory=list)
    """Each variant's own score (mean over tokens of alpha_t * D), in ``variants`` order;
    ``score`` is their mean."""
    variants_used: int = 0
    """How many variants were scored: ``n_variants``, or fewer when the intervention gave
    fewer (0 for an answer decided without ESI)."""
    signals: dict[str, float] = field(default_factory=dict)
    """The greedy answer's free signals from the same pass: ``nll`` (its negative
    log-probability, each token's over its position's top-k), ``entropy`` (mean entropy
    of those distributions) and ``max_nll`` (its least likely token's negative
    log-probability); with a hidden-state probe, ``hidden`` (the probe's term in the logit
    of ``p_wrong``). Empty when unscored."""
    p_wrong: float | None = None
    """With a combined score (``ESIGuard(combined=...)``, or a threshold file calibrated
    with ``--score combined``): the probability that the answer is wrong, which the
    decision is then made on; None otherwise."""
    decided_by: Literal["probe", "free", "esi"] | None = None
    """What the decision was made on, when the guard can decide without ESI. With an
    ESI-probe cascade (``ESIGuard(esi_probe=...)``): ``probe`` when the cheap score was far
    enough from the threshold to decide on (no variant forced; ``score`` is then the
    probe's estimate of ESI, and ``p_wrong`` the cheap score's), ``esi`` when full ESI
    decided. ``free``: decided on a combined score without ESI (``p_wrong``; ``score``
    None, no variant forced), by a guard whose threshold file leaves ESI out (``calibrate
    --features nll,entropy,max_nll,hidden``), or by a value-of-information cascade
    (``calibrate --cascade``) outside its band (``esi`` inside it). None (left out of
    ``as_dict()``) for a guard that always runs ESI."""
    probe_score: float | None = None
    """With a cascade: the ESI probe's estimate of the score; None otherwise (left out)."""
    hidden: HiddenStates | None = field(default=None, repr=False, compare=False)
    """The answer's hidden states, when the guard was asked to keep them
    (``ESIGuard(hidden_states=...)``); in ``as_dict()`` as ``layers``, ``positions`` and
    nested lists of ``values``, and left out when None."""

    sentences: list[SentenceScore] = field(default_factory=list)
    """The answer's sentences, each scored on its own tokens and decided
    (:mod:`esi_guard.sentences`): what ``action="redact"`` and ``decide_on="sentences"``
    decide on. Empty when the answer was not scored with ESI or the backend cannot map
    its tokens to its text."""
    sentence_threshold: float | None = None
    """The threshold sentences were decided on, when it is not ``threshold`` (left out)."""
    threshold_source: str = "given"
    """Where ``threshold`` came from: ``"given"`` (``threshold=``), ``"file:<path>"``
    (``ESIGuard.from_calibration``) or ``"shipped:<file>"`` (the model's shipped
    calibration, taken when no threshold was given)."""

    prompt_tokens: int | None = field(default=None, compare=False)
    """How many tokens the prompt took, when the backend said (set by
    :meth:`ESIGuard.assess`; a chat message has it as ``usage_metadata``, so it is left out
    of ``as_dict()``)."""

    @property
    def kept_answer(self) -> str:
        """The answer less its sentences decided ``redact`` (trailing space stripped).

        The whole answer when none was; what ``action="redact"`` returns.
        """
        if not any(sentence.decision == "redact" for sentence in self.sentences):
            return self.answer
        kept = [s.text for s in self.sentences if s.decision != "redact"]
        return "".join(kept).rstrip()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy; ``hidden`` only where asked for.

        ``sentences`` as a list of dicts; with sentences removed (``redact``), ``redacted``:
        each removed sentence's ``text``, ``start``, ``end``, ``score`` (and ``p_wrong``)
        and the ``threshold`` it was past.
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
