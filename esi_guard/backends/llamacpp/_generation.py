"""Greedy answers for :class:`~.backend.LlamaCppBackend`, from rendered prompts."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from esi_guard.backends._engine_helpers import finish_greedy
from esi_guard.backends._types import Generation
from esi_guard.backends.hidden import HiddenSpec, reduce_hidden
from esi_guard.backends.llamacpp._decoding import (
    GROUP_CELLS,
    Greedy,
    greedy_group,
    groups,
)
from esi_guard.backends.llamacpp._engine import Engine
from esi_guard.backends.llamacpp._tap import tensor_name
from esi_guard.exceptions import BackendError
from esi_guard.scoring import TopK

__all__ = ["finish", "greedy_rows"]


def greedy_rows(
    engine: Engine,
    lock: threading.Lock,
    rows: Sequence[list[int]],
    rooms: Sequence[int],
    top_k: int,
    names: Sequence[str],
    is_end: Callable[[int], bool],
    prefixes: Sequence[int],
) -> list[Greedy]:
    """The greedy answer after each of ``rows`` (up to its room), in order.

    Runs of :func:`._decoding.groups` are stepped together under ``lock``, the KV cache emptied
    after each. ``prefixes``: each row's first tokens that go through the prefix cache.
    """
    cells = min(engine.n_ctx, GROUP_CELLS)
    sizes = [len(row) + room for row, room in zip(rows, rooms, strict=True)]
    answers: list[Greedy] = []
    for group in groups(sizes, most=engine.n_seq_max, cells=cells):
        with lock:
            try:
                answers += greedy_group(
                    engine,
                    [rows[i] for i in group],
                    [rooms[i] for i in group],
                    top_k,
                    names,
                    is_end,
                    [prefixes[i] for i in group],
                )
            finally:
                engine.clear()
    return answers


def finish(
    answer: Greedy,
    prompt_tokens: int,
    stop: Sequence[str],
    hidden: HiddenSpec | None,
    *,
    is_end: Callable[[int], bool],
    decode: Callable[[Sequence[int]], str],
    model_id: str,
) -> Generation | BackendError:
    """A greedy answer's :class:`Generation`, cut at its end and stop sequences, states reduced."""
    tokens, ids, values, states = answer
    gen = finish_greedy(
        tokens,
        TopK(ids, values),
        is_end=is_end,
        decode=decode,
        stop=stop,
        prompt_tokens=prompt_tokens,
        model_id=model_id,
    )
    if hidden is not None and isinstance(gen, Generation):
        layers = {layer: np.stack(states[tensor_name(layer)]) for layer in hidden.layers}
        gen = replace(gen, hidden=reduce_hidden(hidden, layers, len(gen.token_ids)))
    return gen
