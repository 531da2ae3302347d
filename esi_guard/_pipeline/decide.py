"""An answer's decision in one place: evidence in, result out; pure (no backend, no LangChain).

:func:`plan` makes each scorable item's :class:`~esi_guard.backends.ForcingRequest` (others are
decided: :func:`unscorable`); :func:`assess` scores ESI from the forced rows (:func:`scored`), or
an early stage decides on free signals (:func:`early`); :class:`Rule` makes every result. The
guard's pipeline and the agent middleware both use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast

from esi_guard._pipeline.items import Item, Outcome
from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.backends.hidden import HiddenSpec, HiddenStates
from esi_guard.combined import HIDDEN, CombinedScore, free_signals, repetition
from esi_guard.exceptions import BackendError, ScoringError, reason
from esi_guard.policy import Policy
from esi_guard.result import Action, Decision, ESIResult, OnError, ScoringConfig
from esi_guard.scoring import (
    Distance,
    ESIScore,
    TopK,
    ValueKind,
    esi_score,
    token_logprobs,
    truncated_entropy,
)
from esi_guard.sentences import SentenceScore, score_sentences

if TYPE_CHECKING:
    from esi_guard.interventions import Intervention

__all__ = [
    "HIDDEN_MISSING",
    "NO_SENTENCES",
    "Rule",
    "acted",
    "assess",
    "early",
    "plan",
    "scored",
    "unscorable",
    "untrusted",
]

NO_SENTENCES = (
    "the answer could not be split into sentences to score (it has none, or the backend "
    "cannot map its tokens to its text)"
)
"""Why a guard deciding on sentences cannot decide an answer (code ``no_sentences``)."""

HIDDEN_MISSING = "the backend gave no hidden states for the probe"
"""Why a score with a hidden-state probe cannot decide an answer (``hidden_states_missing``)."""

NON_FINITE = "scoring_error: {what} holds NaN or infinite values"
"""Why an answer whose numbers are not finite is unscored: never a decision on them."""


@dataclass(frozen=True)
class Rule:
    """A guard's decision settings, all the pipeline decides on, and the results they give."""

    policy: Policy
    """The stages that decide an answer and the threshold (:class:`~esi_guard.policy.Policy`)."""
    config: ScoringConfig
    """How scores are computed, as results report it."""
    model: str
    """The backend's ``model_id``, as results report it."""
    action: Action = "flag"
    on_error: OnError = "abstain"
    decide_on: Literal["esi", "sentences"] = "esi"
    """What the threshold applies to: the answer's score, or each sentence's."""
    sentence_threshold: float | None = None
    """Sentences whose score is above it are past the threshold (None: ``threshold``)."""
    threshold_source: str = "given"
    """Where the threshold came from, as results report it."""
    keep_hidden: HiddenSpec | None = None
    """Hidden states to read with each answer and put in its result (beside the stages')."""
    return_failures: bool = False
    """A failed step's error is the outcome whatever ``on_error`` (the server answers it as HTTP);
    ``on_error`` still decides answers that cannot be scored."""

    @property
    def threshold(self) -> float:
        """The last stage's threshold (the policy's)."""
        return self.policy.threshold

    @property
    def combined(self) -> CombinedScore | None:
        """The combined score ESI's stage decides on (its ``p_wrong``); None: on ESI."""
        return self.policy.combined

    @property
    def needs_probe_states(self) -> bool:
        """Whether ESI's stage decides on a combined score with a hidden-state probe."""
        return self.combined is not None and self.combined.hidden is not None

    @property
    def by_sentence(self) -> bool:
        """Whether answers are decided on their sentences (``redact``, or ``decide_on``)."""
        return self.action == "redact" or self.decide_on == "sentences"

    def judge(self, sentences: list[SentenceScore]) -> None:
        """Judge each sentence: ``accept`` or the action; on its own ``p_wrong`` if combined."""
        limit = self.threshold if self.sentence_threshold is None else self.sentence_threshold
        combined = self.combined if self.by_sentence else None
        for sentence in sentences:
            if combined is not None:
                signals = {"esi": sentence.score, **sentence.signals,
                           "repetition": repetition(sentence.text)}  # fmt: skip
                sentence.p_wrong = combined.scored(signals, None)[0]
            signal = sentence.score if sentence.p_wrong is None else sentence.p_wrong
            sentence.decision = self.action if signal > limit else "accept"

    def by_sentences(self, sentences: list[SentenceScore]) -> Decision:
        """The answer's decision from its judged sentences (``redact`` with all past: abstain)."""
        past = sum(sentence.decision != "accept" for sentence in sentences)
        if self.action == "redact" and past == len(sentences):
            return "abstain"
        return self.action if past else "accept"

    def decision(
        self,
        score: float | None,
        p_wrong: float | None,
        sentences: list[SentenceScore] | None = None,
    ) -> Decision:
        """``accept``, the action, or (unscored) what ``on_error`` makes of it."""
        if score is None:
            return "flag" if self.on_error == "flag" else "abstain"
        if sentences is not None and self.by_sentence:
            return self.by_sentences(sentences)
        signal = p_wrong if p_wrong is not None else score
        route = self.policy.last.route(signal, self.threshold)
        return "accept" if route == "accept" else self.action

    def failure(self, item: Item, error: BackendError) -> Outcome:
        """A failed step's outcome under ``on_error``: the error itself, or unscored."""
        if self.on_error == "raise" or self.return_failures:
            return error
        return self.result(item, None, reason(error))

    def result(
        self,
        item: Item,
        score: float | None,
        why: str | None,
        token_scores: list[float] | None = None,
        forced: int = 0,
        signals: dict[str, float] | None = None,
        hidden: HiddenStates | None = None,
        sentences: list[SentenceScore] | None = None,
    ) -> ESIResult:
        """The item's result: scored, or unscored with ``why``; the decision it implies."""
        sentences = list(sentences or [])
        p_wrong = None
        signals = dict(signals or {})
        if score is not None and self.combined is not None:
            p_wrong, term = self.combined.scored({"esi": score, **signals}, hidden)
            if term is not None:
                signals[HIDDEN] = term
        if score is not None and not (math.isfinite(score) and math.isfinite(p_wrong or 0.0)):
            # A NaN compares False with the threshold: never a decision on one.
            score, p_wrong, why = None, None, NON_FINITE.format(what="the answer's score")
        self.judge(sentences)
        return self._built(
            item, hidden,
            score=score,
            decision=self.decision(score, p_wrong, sentences),
            scored=score is not None,
            reason=why,
            variants=list(item.variants),
            token_scores=token_scores or [],
            work={"forced_variants": forced, "forced_tokens": forced * len(item.answer_ids)},
            variants_used=len(item.variants),
            signals=signals if score is not None else {},
            p_wrong=p_wrong,
            decided_by=self.policy.decided_by_esi,
            sentences=sentences if score is not None else [],
            sentence_threshold=self.sentence_threshold,
        )  # fmt: skip

    def _built(self, item: Item, hidden: HiddenStates | None, **fields: Any) -> ESIResult:
        """The one constructor of results: what every result of ``item`` carries; ``fields``."""
        return ESIResult(
            threshold=self.threshold,
            answer=item.answer,
            answer_token_ids=[int(i) for i in item.answer_ids],
            model=self.model,
            scoring=self.config.as_metadata(),
            finish_reason=item.finish_reason,
            hidden=hidden if self.keep_hidden is not None else None,
            threshold_source=self.threshold_source,
            probe_score=item.probe_score,
            prompt_tokens=item.prompt_tokens,
            **fields,
        )

    @property
    def uses_esi(self) -> bool:
        """False for a policy without an ESI stage: no variant is ever forced."""
        return self.policy.uses_esi

    @property
    def decides_early(self) -> bool:
        """Whether answers may be decided right after generation (a stage before ESI)."""
        return self.policy.decides_early

    def early(
        self, item: Item, signals: dict[str, float] | None, hidden: HiddenStates | None
    ) -> ESIResult | None:
        """The result an early stage decides right after generation, or None: ESI must.

        The first stage before ESI whose score is outside its band decides (:meth:`Policy.early`).
        Without ESI, an answer the last stage cannot score is unscored, never passed.
        """
        if not self.uses_esi:
            why = None
            if not item.answer_ids:
                why = "empty_answer: the answer has no tokens to score"
            elif signals is None:
                why = "no_distributions: the backend gave no top-k distributions with the answer"
            elif self.policy.needs_hidden is not None and hidden is None:
                why = f"hidden_states_missing: {HIDDEN_MISSING}"
            if why is not None:
                return self.result(item, None, why)
        if signals is None or not item.answer_ids:
            return None
        read = self.policy.early(signals, hidden)
        for early in read:
            if early.stage.name == "probe":
                item.probe_score = early.value
        if not read or read[-1].route is None:
            return None
        decided = read[-1]
        if not math.isfinite(decided.value):  # an inf outside a band, a NaN at the threshold
            why = NON_FINITE.format(what=f"the {decided.stage.name} stage's score")
            return None if self.uses_esi else self.result(item, None, why)
        if decided.stage.name == "probe":
            score, p_wrong, kept = decided.value, None, dict(signals)
        else:
            score, p_wrong = None, decided.value
            kept = dict(signals) if decided.term is None else {**signals, HIDDEN: decided.term}
        return self._built(
            item, hidden,
            score=score,
            decision=self.action if decided.route == "untrusted" else "accept",
            scored=True,
            reason=None,
            variants=[],
            token_scores=[],
            work={"forced_variants": 0, "forced_tokens": 0},
            variants_used=0,
            signals=kept,
            p_wrong=p_wrong,
            decided_by=decided.stage.name,
        )  # fmt: skip


def untrusted(result: ESIResult) -> bool:
    """Scored and not accepted."""
    return result.scored and result.decision not in ("accept", "pass")


def acted(result: ESIResult, action: Action | Literal["raise"]) -> ESIResult:
    """``result`` with ``action`` as decision if untrusted: for callers acting themselves."""
    return replace(result, decision=action) if untrusted(result) else result


def plan(
    items: Sequence[Item],
    *,
    rule: Rule,
    hidden: HiddenSpec | None,
    intervention: Intervention,
    include_original: bool,
) -> list[tuple[Item, ForcingRequest]]:
    """The forcing requests of the items that can be scored; the others are decided."""
    planned = []
    for item in items:
        if item.outcome is not None:
            continue
        problem = unscorable(item, intervention, rule, states_asked=include_original)
        if problem is not None:
            item.outcome = rule.result(item, None, reason(problem))
            continue
        texts = list(item.changed)
        request = ForcingRequest(
            prompt=item.prompt.messages,
            variants=[item.prompt.with_question(text) for text in texts],
            answer_ids=list(item.answer_ids),
            answer=item.answer,
            include_original=include_original,
            hidden=hidden if include_original and item.hidden is None else None,
        )
        planned.append((item, request))
    return planned


def unscorable(
    item: Item, intervention: Intervention, rule: Rule, *, states_asked: bool = False
) -> ScoringError | None:
    """Why ``item`` cannot be scored, known before anything is forced; else None.

    No tokens; no variant that differs; deciding on sentences, no token offsets
    (``item.token_ends``); with a probe, no hidden states and none asked (``states_asked``).
    """
    if not item.answer_ids:
        return ScoringError("the answer has no tokens to score", code="empty_answer")
    if not item.changed:
        msg = f"no variant differs from the question ({intervention.name} found nothing to change)"
        return ScoringError(msg, code="no_effective_variant")
    if rule.by_sentence and item.token_ends is None:
        return ScoringError(NO_SENTENCES, code="no_sentences")
    if rule.needs_probe_states and item.hidden is None and not states_asked:
        return ScoringError(HIDDEN_MISSING, code="hidden_states_missing")
    return None


def assess(
    items: Sequence[Item],
    planned: Sequence[tuple[Item, ForcingRequest]],
    forced: Sequence[Forced | BackendError],
    rule: Rule,
    kind: ValueKind,
) -> list[Outcome]:
    """Score each planned item from its forced distributions; every item's outcome."""
    by_item = {id(item): out for (item, _), out in zip(planned, forced, strict=True)}
    for item in items:
        out = by_item.get(id(item))
        if isinstance(out, BackendError):
            item.outcome = rule.failure(item, out)
        elif out is not None or (not rule.uses_esi and item.outcome is None):
            item.outcome = scored(item, out, rule, kind)  # without ESI, no tokens: out is None
    for item in items:
        item.steps["score"] = item.outcome
    return [cast(Outcome, item.outcome) for item in items]


def early(
    item: Item,
    topk: TopK | None,
    hidden: HiddenStates | None,
    rule: Rule,
    signals: dict[str, float] | None,
) -> None:
    """Decide ``item`` without ESI where the rule can, on its free ``signals`` from ``topk``."""
    broken = None
    if topk is not None and item.answer_ids and not topk.finite:
        broken = "the answer's top-k"  # NaN rows would read as certain: never decided on
    if hidden is not None and not hidden.finite:
        broken, hidden = broken or "the answer's hidden states", None
    if broken is not None and not rule.uses_esi:
        item.outcome = rule.result(item, None, NON_FINITE.format(what=broken))
    else:  # without signals or states no early stage decides: ESI refuses the rows itself
        item.outcome = rule.early(item, signals, hidden)
    if item.outcome is not None:
        item.steps["score"] = item.outcome


def scored(item: Item, forced: Forced | None, rule: Rule, kind: ValueKind) -> ESIResult:
    """The item's result from its forced rows (unscorable: unscored, with the rows it cost)."""
    base = item.original
    if forced is not None and forced.original is not None:
        # On the variants' own numbers (a forcing copy returns one unasked): ESI's base.
        base = forced.original
    own = item.original if item.original is not None else base  # the generator's numbers
    hidden = item.hidden
    if hidden is None and forced is not None:
        hidden = forced.hidden
    rows = 0 if forced is None else len(item.changed) + (forced.original is not None)
    try:
        esi, signals, sentences = _scores(item, forced, base, own, hidden, rule, kind)
    except ScoringError as exc:
        return rule.result(item, None, reason(exc), forced=rows)
    if esi is None:  # a guard without ESI
        early(item, own, hidden, rule, signals)
        return cast(ESIResult, item.outcome)
    result = rule.result(
        item, esi.score, None, [float(x) for x in esi.token_scores], rows, signals, hidden,
        sentences,
    )  # fmt: skip
    result.variant_scores = [float(x) for x in esi.variant_scores]
    return result


def _scores(
    item: Item,
    forced: Forced | None,
    base: TopK | None,
    own: TopK | None,
    hidden: HiddenStates | None,
    rule: Rule,
    kind: ValueKind,
) -> tuple[ESIScore | None, dict[str, float] | None, list[SentenceScore] | None]:
    """ESI on ``base``, free signals and sentence scores on ``own`` (the generator's pass)."""
    esi = None
    if rule.uses_esi:
        if rule.needs_probe_states and hidden is None:  # asked with the original row
            raise ScoringError(HIDDEN_MISSING, code="hidden_states_missing")
        if rule.needs_probe_states and hidden is not None and not hidden.finite:
            msg = "the answer's hidden states hold NaN or infinite values"
            raise ScoringError(msg)
        assert forced is not None  # planned
        esi = _esi(item, forced, base, rule, kind)
    signals = item.signals  # read at generation by a stage before ESI, on the same numbers
    if own is None or not item.answer_ids or (esi is None and not own.finite):
        return esi, signals, None  # no distributions (or NaN rows): no signal, unscored
    entropies = esi.alphas if esi is not None and own is base else truncated_entropy(own)
    logprobs = token_logprobs(own, item.answer_ids, kind)
    if signals is None:
        signals = free_signals(own, item.answer_ids, kind, entropies, text=item.answer,
                               logprobs=logprobs)  # fmt: skip
    sentences = None
    if esi is not None and item.token_ends is not None:
        sentences = score_sentences(
            item.answer, item.token_ends, esi.token_scores, logprobs, entropies
        )
    if rule.by_sentence and not sentences:  # an answer with no sentence (split once, here)
        raise ScoringError(NO_SENTENCES, code="no_sentences")
    return esi, signals, sentences


def _esi(item: Item, forced: Forced, base: TopK | None, rule: Rule, kind: ValueKind) -> ESIScore:
    """ESI of the answer over all L variants; a ScoringError saying why it cannot be."""
    changed = item.changed
    question = item.prompt.question
    if base is None:
        msg = "the backend returned no original distributions"
        raise ScoringError(msg)
    if len(forced.variants) != len(changed):
        msg = f"the backend returned {len(forced.variants)} variants for {len(changed)}"
        raise ScoringError(msg)
    # All L variants in order: repeats share a result, unchanged ones are the original.
    by_text = dict(zip(changed, forced.variants, strict=True))
    full = [len(item.answer_ids)] * len(changed)
    exact = dict(zip(changed, forced.observed or full, strict=True))
    everyone = [base if text == question else by_text[text] for text in item.variants]
    observed = None
    if forced.observed is not None:
        observed = [
            len(item.answer_ids) if text == question else exact[text] for text in item.variants
        ]
    return esi_score(base, everyone, distance=cast(Distance, rule.config.distance),
                     kind=kind, observed=observed, support=rule.config.support)  # fmt: skip
