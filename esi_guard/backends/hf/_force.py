"""Teacher forcing on a transformers model: many answers after many prompts, few passes.

A pass runs the shared prompt prefix once, aligns answers so the output layer runs at answer
positions only, and moves only the top-k (and asked-for hidden states) off the device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from esi_guard.backends._engine_helpers import non_finite, shared_prefix
from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.backends.hf._hidden import capture
from esi_guard.backends.hidden import HiddenSpec, HiddenStates, reduce_hidden
from esi_guard.scoring import TopK

if TYPE_CHECKING:
    from esi_guard.backends.hf._engine import Engine
    from esi_guard.exceptions import BackendError

__all__ = ["Rendered", "force_group", "pack"]

_PASS_COST = 32
"""A forward pass's fixed cost, in token positions: a little padding is worth one pass fewer."""


@dataclass(frozen=True)
class Rendered:
    """A forcing request with its rows' prompt token ids, and its place in the call."""

    index: int
    request: ForcingRequest
    rows: list[list[int]]


_shared = shared_prefix  # the name the tests know


def _cost(group: Sequence[Rendered], reuse: bool) -> int:
    """Token positions a pass over ``group`` computes (the shared prefix once, rows padded)."""
    prompts = [row for item in group for row in item.rows]
    shared = _shared(prompts, reuse)
    answer = max(len(item.request.answer_ids) for item in group)
    return _PASS_COST + shared + len(prompts) * (max(map(len, prompts)) - shared + answer)


def pack(
    requests: Sequence[Rendered], max_rows: int, *, reuse_prefix: bool = True
) -> list[list[Rendered]]:
    """Pack whole requests into passes of at most ``max_rows`` sequences.

    A request joins the first pass where that costs no more than a pass of its own, so requests
    after different long prefixes (RAG passages) each keep their own shared prefix.
    """
    groups: list[list[Rendered]] = []
    for request in requests:
        alone = _cost([request], reuse_prefix)
        for group in groups:
            rows = sum(len(item.rows) for item in group) + len(request.rows)
            if rows <= max_rows and _cost([*group, request], reuse_prefix) <= (
                _cost(group, reuse_prefix) + alone
            ):
                group.append(request)
                break
        else:
            groups.append([request])
    return groups


def force_group(
    engine: Engine, group: list[Rendered], top_k: int, *, reuse_prefix: bool
) -> list[Forced | BackendError]:
    """One forward pass over a group's rows: the top-k at each answer position.

    The caller holds the engine's lock. ``reuse_prefix``: run the rows' shared prefix once. A
    request with ``hidden`` (and ``include_original``) gets its original row's states.
    """
    import torch

    prompts: list[list[int]] = []
    answers: list[list[int]] = []
    for item in group:
        prompts += item.rows
        answers += [list(item.request.answer_ids)] * len(item.rows)
    # Each row keeps at least its last prompt token (it predicts answer token 0); left padding
    # starts every answer in one column, so the output layer runs at answer positions only.
    shared = _shared(prompts, reuse_prefix)
    tails = [p[shared:] for p in prompts]
    lead = max(len(t) for t in tails)
    n_answer = max(len(a) for a in answers)
    width = lead + n_answer
    n_rows = len(prompts)
    input_ids = torch.full((n_rows, width), engine.pad_id, dtype=torch.long)
    attention = torch.zeros((n_rows, shared + width), dtype=torch.long)
    attention[:, :shared] = 1
    positions = torch.full((n_rows, width), shared, dtype=torch.long)
    for i, (tail, answer) in enumerate(zip(tails, answers, strict=True)):
        pad, row = lead - len(tail), tail + answer
        input_ids[i, pad : pad + len(row)] = torch.tensor(row)
        attention[i, shared + pad : shared + pad + len(row)] = 1
        positions[i, pad : pad + len(row)] = torch.arange(shared, shared + len(row))
    first = lead - 1 if engine.can_trim else 0  # the column predicting answer token 0
    trim = {"logits_to_keep": width - first} if engine.can_trim else {}
    device = engine.device
    hooks, read_states = _original_states(engine, group, lead)
    with torch.inference_mode():
        cache = None
        if shared:
            prefix = torch.tensor([prompts[0][:shared]], device=device)
            cache = engine.prefill(prefix)
            cache.batch_repeat_interleave(n_rows)
        with hooks as kept:
            logits = engine.model(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                position_ids=positions.to(device),
                use_cache=cache is not None,
                **{engine.cache_name: cache},
                **trim,
            ).logits
        start = lead - 1 - first
        picked = logits[:, start : start + n_answer]
    ids, values = engine.topk_to_numpy(picked, top_k)
    requests = [item.request for item in group]
    return _split(engine.model_id, requests, ids, values, read_states(kept))


def _original_states(
    engine: Engine, group: list[Rendered], lead: int
) -> tuple[Any, Callable[[dict[int, list[Any]]], list[HiddenStates | None]]]:
    """Hooks for the original rows' asked-for states, and the function reducing what they kept."""
    import torch

    wanted: list[tuple[int, int, HiddenSpec, int]] = []
    row = 0
    for i, item in enumerate(group):
        spec = item.request.hidden
        if spec is not None:  # with include_original: its row comes first
            wanted.append((i, row, spec, len(item.request.answer_ids)))
        row += len(item.rows)
    if not wanted:
        return contextlib.nullcontext({}), lambda kept: [None] * len(group)
    rows = torch.tensor([row for _, row, _, _ in wanted], device=engine.device)
    columns = slice(lead - 1, lead - 1 + max(max(n, 1) for *_, n in wanted))
    layers = sorted({layer for _, _, spec, _ in wanted for layer in spec.layers})

    def read(kept: dict[int, list[Any]]) -> list[HiddenStates | None]:
        states: list[HiddenStates | None] = [None] * len(group)
        held = {layer: kept[layer][-1].cpu().numpy() for layer in layers}  # the one pass
        for k, (i, _, spec, n) in enumerate(wanted):
            by_layer = {layer: held[layer][k, : max(n, 1)] for layer in spec.layers}
            states[i] = reduce_hidden(spec, by_layer, n)
        return states

    return capture(engine.model, layers, lambda state: state[rows, columns]), read


def _split(
    model_id: str,
    group: list[ForcingRequest],
    ids: np.ndarray,
    values: np.ndarray,
    hidden: Sequence[HiddenStates | None] | None = None,
) -> list[Forced | BackendError]:
    results: list[Forced | BackendError] = []
    row = 0
    for request, states in zip(group, hidden or [None] * len(group), strict=True):
        n = len(request.answer_ids)
        size = len(request.variants) + int(request.include_original)
        if not np.isfinite(values[row : row + size, :n]).all():
            results.append(non_finite(model_id))
            row += size
            continue
        original = None
        if request.include_original:
            original = TopK(ids[row, :n], values[row, :n])
            row += 1
        variants = [
            TopK(ids[row + i, :n], values[row + i, :n]) for i in range(len(request.variants))
        ]
        row += len(request.variants)
        results.append(Forced(variants=variants, original=original, hidden=states))
    return results
