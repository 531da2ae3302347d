"""The score step, pure: what to force for each item, and what the forced rows decide.

:func:`plan` turns each scorable item into its :class:`~esi_guard.backends.ForcingRequest`
(an item that cannot be scored is decided there: :func:`unscorable`); the pipeline makes
the one backend call; :func:`assess` scores ESI of each answer over its variants from the
forced distributions, and the :class:`~esi_guard._pipeline.decide.Rule` makes it a result.
No backend call, no LangChain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from esi_guard._pipeline.decide import HIDDEN_MISSING, NO_SENTENCES, Rule
from esi_guard._pipeline.items import Item, Outcome
from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.backends.hidden import HiddenSpec, HiddenStates
from esi_guard.combined import free_signals
from esi_guard.exceptions import BackendError, ScoringError, reason
from esi_guard.result import ESIResult
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

__all__ = ["assess", "early", "plan", "scored", "unscorable"]


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

    No answer tokens, no variant that differs; for a guard deciding on sentences, an answer
    the backend cannot map to its text (``item.token_ends`` None: ``Pipeline.planned`` asks
    it before planning; an answer with no sentence is known once it is split, in
    :func:`scored`); for a combined score
    with a probe, an answer generated without its states when the forcing will not ask
    for them (``states_asked``: the original row is forced, with states).
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
    """Score each planned item from its forced distributions; every item's outcome.

    A guard without ESI decides each from its forced original row (:func:`early`).
    """
    by_item = {id(item): out for (item, _), out in zip(planned, forced, strict=True)}
    for item in items:
        out = by_item.get(id(item))
        if isinstance(out, BackendError):
            item.outcome = rule.failure(item, out)
        elif not rule.uses_esi and item.outcome is None:  # no tokens: out is None
            early(item, None if out is None else out.original,
                  None if out is None else out.hidden, rule, kind)  # fmt: skip
        elif out is not None:
            item.outcome = scored(item, out, rule, kind)
    for item in items:
        item.steps["score"] = item.outcome
    return [cast(Outcome, item.outcome) for item in items]


def early(
    item: Item, topk: TopK | None, hidden: HiddenStates | None, rule: Rule, kind: ValueKind
) -> None:
    """Decide ``item`` without ESI where the rule can (a cascade, or a guard without ESI).

    Its free signals are read from ``topk`` (the answer's own pass) and kept on the item
    for ESI's stage when none decides.
    """
    signals = None
    if topk is not None and item.answer_ids:
        signals = free_signals(topk, item.answer_ids, kind, text=item.answer)
        item.signals = signals if topk is item.original else None
    item.outcome = rule.early(item, signals, hidden)
    if item.outcome is not None:
        item.steps["score"] = item.outcome


def scored(item: Item, forced: Forced, rule: Rule, kind: ValueKind) -> ESIResult:
    """The item's result from its forced variants (one result, made at the end).

    An answer its forced rows cannot score (no states for the probe, no original rows,
    no sentence for a guard judging sentences...) is unscored, with the rows it cost.
    """
    rows = len(item.changed) + (forced.original is not None)
    hidden = item.hidden if item.hidden is not None else forced.hidden
    try:
        esi, signals, sentences = _scores(item, forced, hidden, rule, kind)
    except ScoringError as exc:
        return rule.result(item, None, reason(exc), forced=rows)
    result = rule.result(
        item, esi.score, None, [float(x) for x in esi.token_scores], rows, signals, hidden,
        sentences,
    )  # fmt: skip
    result.variant_scores = [float(x) for x in esi.variant_scores]
    return result


def _scores(
    item: Item, forced: Forced, hidden: HiddenStates | None, rule: Rule, kind: ValueKind
) -> tuple[ESIScore, dict[str, float], list[SentenceScore] | None]:
    """ESI, the free signals and the sentences' scores; a ScoringError where it cannot."""
    if rule.needs_probe_states and hidden is None:  # asked with the original row, not given
        raise ScoringError(HIDDEN_MISSING, code="hidden_states_missing")
    # A forced original is on the variants' own numbers (a backend that forces on
    # other weights than it generates with returns one unasked): it wins.
    base = forced.original if forced.original is not None else item.original
    esi = _esi(item, forced, base, rule, kind)
    assert base is not None  # _esi's
    # The free signals from the answer's own pass where it has one: what a guard that
    # decides without ESI reads (a forcing copy's numbers differ from the generator's).
    own = item.original if item.original is not None else base
    entropies = esi.alphas if own is base else truncated_entropy(own)
    logprobs = token_logprobs(own, item.answer_ids, kind)
    signals = item.signals  # read at generation by a stage before ESI, on the same numbers
    if signals is None:
        signals = free_signals(own, item.answer_ids, kind, entropies, text=item.answer,
                               logprobs=logprobs)  # fmt: skip
    sentences = None
    if item.token_ends is not None:
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
    # Back to all L variants, in order: repeats share a result, unchanged ones are
    # the original (exact at every position).
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
