"""The forcing requests of the score step: what to force for each item.

:func:`plan` turns each scorable item into its :class:`~esi_guard.backends.ForcingRequest`;
an item that cannot be scored is decided here (:func:`unscorable`). Pure: the backend
call is the pipeline's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from esi_guard._pipeline.decide import Rule
from esi_guard._pipeline.items import Item
from esi_guard.backends._types import ForcingRequest
from esi_guard.backends.hidden import HiddenSpec
from esi_guard.exceptions import ScoringError, reason

if TYPE_CHECKING:
    from esi_guard.interventions import Intervention

__all__ = ["plan", "unscorable"]


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
        problem = unscorable(item, intervention)
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


def unscorable(item: Item, intervention: Intervention) -> ScoringError | None:
    """Why ``item`` cannot be scored (no answer tokens, no variant that differs); else None."""
    if not item.answer_ids:
        return ScoringError("the answer has no tokens to score", code="empty_answer")
    if not item.changed:
        msg = f"no variant differs from the question ({intervention.name} found nothing to change)"
        return ScoringError(msg, code="no_effective_variant")
    return None
