"""The score step's forcing rounds, and what sequential ESI learns across them.

:func:`forcing_rounds` yields the forcing requests of each round and is sent back their
results: one round for plain ESI, several for sequential ESI (see
:mod:`esi_guard.sequential`), which stops an item once its decision is settled. There
only the variants a prompt has not had yet are forced in each round; :class:`Rounds`
keeps their distributions by variant text, the original and context rows of the first
round, and the rows forced so far, and merges them back into one :class:`Forced` per
prompt.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, cast

from esi_guard._pipeline.assess import assess, scored
from esi_guard._pipeline.decide import Rule
from esi_guard._pipeline.forcing import plan
from esi_guard._pipeline.items import Item, Outcome
from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.backends.hidden import HiddenSpec
from esi_guard.exceptions import BackendError
from esi_guard.result import ESIResult
from esi_guard.scoring import TopK, ValueKind
from esi_guard.sequential import schedule, settled

if TYPE_CHECKING:
    from esi_guard.interventions import Intervention

__all__ = ["Rounds", "forcing_rounds"]


class Rounds:
    """What sequential ESI has learned about each item across rounds."""

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = [item for item in items if item.outcome is None]
        self.full = {id(item): list(item.variants) for item in self.items}
        self.known: dict[int, dict[str, tuple[TopK, int | None]]] = {
            id(item): {} for item in self.items
        }
        self.original: dict[int, TopK | None] = {}
        self.context: dict[int, Forced | BackendError | None] = {}
        self.rows = {id(item): 0 for item in self.items}

    def start(self, size: int, *, last: bool) -> list[Item]:
        """The undecided items, each now holding its first ``size`` variants.

        Before the last round an item none of whose first variants differs from the
        question waits for the next round (the last decides it as unscorable).
        """
        live = []
        for item in self.items:
            if item.outcome is None:
                item.variants = self.full[id(item)][:size]
                if last or item.changed:
                    live.append(item)
        return live

    def record(
        self,
        planned: Sequence[tuple[Item, ForcingRequest]],
        forced: Sequence[Forced | BackendError],
    ) -> dict[int, Forced | BackendError]:
        """Keep each new variant's distributions by text; the main result per item."""
        main: dict[int, Forced | BackendError] = {}
        for (item, request), out in zip(planned, forced, strict=True):
            key = id(item)
            if key in main:  # the second request of an item: its context row
                self.context[key] = out
                self.rows[key] += 1
                continue
            main[key] = out
            if isinstance(out, BackendError):
                continue
            done = self.known[key]
            texts = [text for text in item.changed if text not in done]
            observed: list[int | None] = (
                list(out.observed) if out.observed is not None else [None] * len(texts)
            )
            for text, topk, seen in zip(texts, out.variants, observed, strict=False):
                done[text] = (topk, seen)
            if out.original is not None:  # asked for, or a backend that always forces it
                self.original.setdefault(key, out.original)
            if request.include_original and out.hidden is not None:
                item.hidden = out.hidden
            self.rows[key] += len(request.variants) + int(out.original is not None)
        return main

    def merged(self, item: Item) -> Forced:
        """Every variant of the item forced so far, in ``item.changed`` order."""
        known = self.known[id(item)]
        seen = [known[text][1] for text in item.changed]
        full = len(item.answer_ids)
        return Forced(
            variants=[known[text][0] for text in item.changed],
            original=self.original.get(id(item)),
            observed=None
            if all(count is None for count in seen)
            else [full if count is None else count for count in seen],
        )

    def work(self, item: Item) -> dict[str, int]:
        """ESI's work on the item over all rounds (``ESIResult.work``)."""
        rows = self.rows[id(item)]
        return {"forced_variants": rows, "forced_tokens": rows * len(item.answer_ids)}


def forcing_rounds(
    items: Sequence[Item],
    include_original: bool,
    *,
    rule: Rule,
    kind: ValueKind,
    hidden: HiddenSpec | None,
    intervention: Intervention,
) -> Generator[list[ForcingRequest], list[Forced | BackendError], list[Outcome]]:
    """The forcing requests of each round (sent back their results); the outcomes."""
    sizes = schedule(rule.config.min_variants or rule.config.n_variants, rule.config.n_variants)
    if len(sizes) == 1:
        planned = plan(items, rule=rule, hidden=hidden, intervention=intervention,
                       include_original=include_original)  # fmt: skip
        forced = yield [request for _, request in planned]
        return assess(items, planned, forced, rule, kind)
    rounds = Rounds(items)
    for number, size in enumerate(sizes):
        last = number == len(sizes) - 1
        live = rounds.start(size, last=last)
        planned = plan(live, rule=rule, hidden=hidden, intervention=intervention,
                       include_original=include_original and number == 0,
                       known=rounds.known)  # fmt: skip
        forced = yield [request for _, request in planned]
        outs = rounds.record(planned, forced)
        for item in live:
            if item.outcome is not None:
                continue
            result = _round_result(item, rounds, outs.get(id(item)), rule, kind)
            # An intervention may give fewer than n_variants: all of them used, decide.
            final = last or len(rounds.full[id(item)]) <= size
            if isinstance(result, BackendError):
                item.outcome = rule.failure(item, result)
            elif (
                final
                or not result.scored
                or settled(result.variant_scores, rule.threshold, rule.config.stop_constant or 0.0)
            ):
                result.stopped_early = not final
                item.outcome = result
    for item in items:
        item.steps["score"] = item.outcome
    return [cast(Outcome, item.outcome) for item in items]


def _round_result(
    item: Item, rounds: Rounds, out: Forced | BackendError | None, rule: Rule, kind: ValueKind
) -> ESIResult | BackendError:
    """The item's result from every variant forced so far (``out``: this round's)."""
    if isinstance(out, BackendError):
        return out
    result = scored(item, rounds.merged(item), rule, kind)
    result.work = rounds.work(item)
    return result
