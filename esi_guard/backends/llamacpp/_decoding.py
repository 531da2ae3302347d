"""Token-by-token decoding on an :class:`~._engine.Engine`: greedy answers and samples.

The loops alone, on a context the caller holds (its lock taken, its KV cache cleared
afterwards): :class:`~.backend.LlamaCppBackend` renders, checks lengths and turns what
these return into its results.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from esi_guard.backends.llamacpp._engine import Engine, Row, topk_rows

__all__ = ["Greedy", "greedy", "sample_group"]

Greedy = tuple[list[int], np.ndarray, np.ndarray, dict[str, list[np.ndarray]]]
"""A greedy answer's tokens, its top-k ids and values per step, and the states read."""


def greedy(
    engine: Engine,
    row: Sequence[int],
    room: int,
    top_k: int,
    names: Sequence[str],
    is_end: Callable[[int], bool],
) -> Generator[list[int], None, Greedy]:
    """Greedy decoding of up to ``room`` tokens after ``row``; yields each token as it comes.

    Returns (``yield from``) the tokens (the end token included when it came), the
    raw-logit top-k at each step and, per tensor of ``names``, its row at each step.
    """
    states: dict[str, list[np.ndarray]] = {name: [] for name in names}
    tokens: list[int] = []
    ids, values = [], []
    logits = engine.decode([], [Row(0, row, 0, [len(row) - 1])], names)
    while True:
        for name in names:
            states[name].append(engine.states[name][0])
        top_ids, top_values = topk_rows(logits, top_k)
        ids.append(top_ids[0])
        values.append(top_values[0])
        token = int(top_ids[0, 0])
        tokens.append(token)
        if is_end(token) or len(tokens) >= room:
            break
        yield [token]
        logits = engine.decode([], [Row(0, [token], len(row) + len(tokens) - 1, [0])], names)
    return tokens, np.stack(ids), np.stack(values), states


def sample_group(
    engine: Engine,
    row: Sequence[int],
    n: int,
    temperature: float,
    room: int,
    rng: Any,
    is_end: Callable[[int], bool],
) -> list[tuple[list[int], list[float]]]:
    """``n`` answers after ``row`` sampled at ``temperature``, decoded together.

    The prompt is decoded once, its KV cells shared by the ``n`` sequences. Each token's
    log-probability is the model's own (raw logits, temperature 1).
    """
    seqs = list(range(n))
    shared = [(row[:-1], seqs)] if len(row) > 1 else []
    logits = engine.decode(shared, [Row(s, [row[-1]], len(row) - 1, [0]) for s in seqs])
    tokens: list[list[int]] = [[] for _ in seqs]
    logprobs: list[list[float]] = [[] for _ in seqs]
    live = seqs
    for step in range(room):
        scaled = logits.astype(np.float64)
        logp = scaled - scaled.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        hot = np.exp((scaled - scaled.max(axis=1, keepdims=True)) / temperature)
        hot /= hot.sum(axis=1, keepdims=True)
        nxt = []
        for i, seq in enumerate(live):
            token = int(rng.choice(hot.shape[1], p=hot[i]))
            if is_end(token):
                continue
            tokens[seq].append(token)
            logprobs[seq].append(float(logp[i, token]))
            nxt.append(seq)
        live = nxt
        if not live or step == room - 1:
            break
        position = len(row) + step
        logits = engine.decode([], [Row(seq, [tokens[seq][-1]], position, [0]) for seq in live])
    return list(zip(tokens, logprobs, strict=True))
