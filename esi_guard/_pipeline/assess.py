"""The score step's assessment: each item's forced distributions in, its decided outcome out.

ESI of the answer over its variants, made a result by the
:class:`~esi_guard._pipeline.decide.Rule`. Pure: no backend call, no LangChain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from esi_guard._pipeline.decide import Rule
from esi_guard._pipeline.items import Item, Outcome
from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.combined import free_signals, token_logprobs
from esi_guard.exceptions import BackendError, ScoringError, reason
from esi_guard.result import ESIResult
from esi_guard.scoring import (
    Distance,
    ESIScore,
    TopK,
    ValueKind,
    esi_score,
    truncated_entropy,
)
from esi_guard.sentences import score_sentences

__all__ = ["assess", "scored"]


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
        if id(item) not in by_item:
            continue
        out = by_item[id(item)]
        if isinstance(out, BackendError):
            item.outcome = rule.failure(item, out)
        else:
            item.outcome = scored(item, out, rule, kind)
    for item in items:
        item.steps["score"] = item.outcome
    return [cast(Outcome, item.outcome) for item in items]


def scored(item: Item, forced: Forced, rule: Rule, kind: ValueKind) -> ESIResult:
    """The item's result from its forced variants (one result, made at the end)."""
    # A forced original is on the variants' own numbers (a backend that forces on
    # other weights than it generates with returns one unasked): it wins.
    base = forced.original if forced.original is not None else item.original
    esi = _esi(item, forced, base, rule, kind)
    if isinstance(esi, ScoringError):
        return rule.result(item, None, reason(esi))
    assert base is not None  # _esi's
    # The free signals from the answer's own pass where it has one: what a guard that
    # decides without ESI reads (a forcing copy's numbers differ from the generator's).
    own = item.original if item.original is not None else base
    entropies = esi.alphas if own is base else truncated_entropy(own)
    logprobs = token_logprobs(own, item.answer_ids, kind)
    signals = free_signals(own, item.answer_ids, kind, entropies, text=item.answer,
                           logprobs=logprobs)  # fmt: skip
    hidden = item.hidden if item.hidden is not None else forced.hidden
    sentences = None
    if item.token_ends is not None:
        sentences = score_sentences(
            item.answer, item.token_ends, esi.token_scores, logprobs, entropies
        )
    rows = len(item.changed) + (forced.original is not None)
    result = rule.result(
        item, esi.score, None, [float(x) for x in esi.token_scores], rows, signals, hidden,
        sentences,
    )  # fmt: skip
    result.variant_scores = [float(x) for x in esi.variant_scores]
    return result


def _esi(
    item: Item, forced: Forced, base: TopK | None, rule: Rule, kind: ValueKind
) -> ESIScore | ScoringError:
    """ESI of the answer over all L variants, or why it cannot be computed."""
    changed = item.changed
    question = item.prompt.question
    if base is None:
        return ScoringError("the backend returned no original distributions")
    if len(forced.variants) != len(changed):
        return ScoringError(
            f"the backend returned {len(forced.variants)} variants for {len(changed)}"
        )
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
    try:
        return esi_score(base, everyone, distance=cast(Distance, rule.config.distance),
                         kind=kind, observed=observed, support=rule.config.support)  # fmt: skip
    except ScoringError as exc:
        return exc
