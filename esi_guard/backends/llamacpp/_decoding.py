"""Greedy decoding loops on an :class:`~._engine.Engine`; the caller locks it, clears its cache."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import numpy as np

from esi_guard.backends._types import AnswerPiece
from esi_guard.backends.llamacpp._engine import Engine, Row, topk_rows
from esi_guard.scoring import TopK

__all__ = [
    "GROUP_CELLS",
    "Greedy",
    "greedy",
    "greedy_group",
    "groups",
]

GROUP_CELLS = 2048
"""Most KV cells (prompts plus answer room) :func:`groups` steps together: a step's attention
spans every cell in the unified cache, so many long prompts would cost more than they save."""

Greedy = tuple[list[int], np.ndarray, np.ndarray, dict[str, list[np.ndarray]]]
"""A greedy answer's tokens, its top-k ids and values per step, and the states read."""


def greedy(
    engine: Engine,
    row: Sequence[int],
    room: int,
    top_k: int,
    names: Sequence[str],
    is_end: Callable[[int], bool],
    prefix: int = 0,
) -> Generator[AnswerPiece, None, Greedy]:
    """Greedy decoding of up to ``room`` tokens after ``row``; yields each token as it comes.

    ``prefix``: the prompt's first tokens that go through :meth:`~._engine.Engine.load_prefix`.
    The last token (an end token or the ``room``-th) comes only in the result: the tokens (end
    included), the raw-logit top-k at each step and, per tensor of ``names``, its row per step.
    """
    states: dict[str, list[np.ndarray]] = {name: [] for name in names}
    tokens: list[int] = []
    ids, values = [], []
    logits = engine.prompt(row, prefix, names)
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
        yield AnswerPiece((token,), TopK(top_ids, top_values))
        logits = engine.decode([], [Row(0, [token], len(row) + len(tokens) - 1, [0])], names)
    return tokens, np.stack(ids), np.stack(values), states


def greedy_group(
    engine: Engine,
    rows: Sequence[Sequence[int]],
    rooms: Sequence[int],
    top_k: int,
    names: Sequence[str],
    is_end: Callable[[int], bool],
    prefixes: Sequence[int],
) -> list[Greedy]:
    """Greedy answers to several prompts (up to ``rooms[i]`` tokens each), stepped together.

    Each prompt is decoded alone in an empty KV cache (beside other cells its numbers would
    differ; first ``prefixes[i]`` tokens through :meth:`~._engine.Engine.load_prefix`), then each
    step decodes every live answer's next token in one decode, one token a sequence. The answers
    are :func:`greedy`'s for each prompt alone, to the bit, and come faster: a step is bound by
    reading the weights, and the answers share each read. Prompts decoded together would not
    match: llama.cpp rounds a many-token decode's numbers with its size.
    """
    tokens: list[list[int]] = [[] for _ in rows]
    ids: list[list[np.ndarray]] = [[] for _ in rows]
    values: list[list[np.ndarray]] = [[] for _ in rows]
    states: list[dict[str, list[np.ndarray]]] = [{name: [] for name in names} for _ in rows]

    def take(seq: int, logits: np.ndarray, at: int) -> bool:
        """Record sequence ``seq``'s step from row ``at`` of the decode; True: it goes on."""
        for name in names:
            states[seq][name].append(engine.states[name][at])
        top_ids, top_values = topk_rows(logits[at : at + 1], top_k)
        ids[seq].append(top_ids[0])
        values[seq].append(top_values[0])
        token = int(top_ids[0, 0])
        tokens[seq].append(token)
        return not is_end(token) and len(tokens[seq]) < rooms[seq]

    live, cells = [], []
    for seq, row in enumerate(rows):  # each prompt in an empty cache, as alone
        logits = engine.prompt(row, prefixes[seq], names)
        if take(seq, logits, 0):
            live.append(seq)
            cells.append(engine.save(0))
        engine.clear()
    for seq, data in zip(live, cells, strict=True):
        engine.restore(data, seq)
    while live:
        step = [Row(s, [tokens[s][-1]], len(rows[s]) + len(tokens[s]) - 1, [0]) for s in live]
        logits = engine.decode([], step, names)
        live = [seq for at, seq in enumerate(live) if take(seq, logits, at)]
    return [(tokens[s], np.stack(ids[s]), np.stack(values[s]), states[s]) for s in range(len(rows))]


def groups(sizes: Sequence[int], *, most: int, cells: int) -> list[list[int]]:
    """The indices of ``sizes``, in order, in runs stepped together.

    ``sizes``: each prompt's cells (tokens plus answer room). A run holds at most ``most`` prompts
    and ``cells`` cells; a larger prompt goes alone.
    """
    out: list[list[int]] = []
    used = cells + 1
    for index, size in enumerate(sizes):
        if not out or len(out[-1]) >= most or used + size > cells:
            out.append([])
            used = 0
        out[-1].append(index)
        used += size
    return out
