"""Greedy answers and samples for :class:`~.backend.LlamaCppBackend`, from rendered prompts.

:func:`greedy_rows` runs :mod:`._decoding`'s group loop over every prompt, each group
under the engine's lock and with its KV cache emptied after it; :func:`finish` makes a
greedy answer its :class:`~esi_guard.backends.Generation` (cut at the end and stop
sequences, its hidden states reduced); :func:`sample_rows` samples each prompt's answers
(for the sampling baselines).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from esi_guard.backends._engine_helpers import finish_greedy, make_sample
from esi_guard.backends._types import Generation, Sample
from esi_guard.backends.hidden import HiddenSpec, reduce_hidden
from esi_guard.backends.llamacpp._chat import Tokens
from esi_guard.backends.llamacpp._decoding import (
    GROUP_CELLS,
    Greedy,
    greedy_group,
    groups,
    sample_prompt,
)
from esi_guard.backends.llamacpp._engine import Engine
from esi_guard.backends.llamacpp._tap import tensor_name
from esi_guard.exceptions import BackendError
from esi_guard.scoring import TopK

__all__ = ["finish", "greedy_rows", "sample_rows"]


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

    ``prefixes``: each row's first tokens that go through the engine's prefix cache.

    The prompts go in runs of :func:`._decoding.groups` (at most ``n_seq_max`` prompts and
    :data:`._decoding.GROUP_CELLS` cells), each run stepped together by
    :func:`._decoding.greedy_group` under ``lock``, the KV cache emptied after it.
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
    """A greedy answer's :class:`Generation` (its states reduced when asked for)."""
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


def sample_rows(
    engine: Engine,
    lock: threading.Lock,
    tokens: Tokens,
    rows: Sequence[list[int]],
    *,
    n: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    stop: Sequence[str],
) -> list[list[Sample] | BackendError]:
    """``n`` answers after each of ``rows`` (:func:`._decoding.sample_prompt`, under ``lock``).

    One generator seeded with ``seed`` draws every prompt's answers, in order; a prompt
    whose answers the context cannot hold gets a :class:`ContextLengthError` in place.
    """
    rng = np.random.default_rng(seed)
    results: list[list[Sample] | BackendError] = []
    for row in rows:
        need = len(row) + min(n, engine.n_seq_max) * max_new_tokens
        too_long = engine.too_long(need, f"the prompt plus {n} sampled answers")
        if too_long is not None:
            results.append(too_long)
            continue
        room = min(max_new_tokens, engine.n_ctx - len(row) - 1)
        with lock:
            drawn = sample_prompt(engine, row, n, temperature, room, rng, tokens.is_end)
        results.append([make_sample(t, lp, decode=tokens.decode, stop=stop) for t, lp in drawn])
    return results
