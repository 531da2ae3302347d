"""Token-by-token decoding on an :class:`~._engine.Engine`: greedy answers.

The loops alone, on a context the caller holds (its lock taken, its KV cache cleared
afterwards): :class:`~.backend.LlamaCppBackend` renders, checks lengths and turns what
these return into its results.
"""

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
"""Most KV cells (prompts plus answer room) of the answers :func:`groups` steps together.

A step's attention spans every cell its decode's sequences hold (one unified cache), so
many long prompts stepped together would pay more for attention than they save."""

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

    Each token comes with its step's top-k; the last (an end token, or the ``room``-th)
    only in the returned answer.

    Returns (``yield from``) the tokens (the end token included when it came), the
    raw-logit top-k at each step and, per tensor of ``names``, its row at each step.
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

    Each prompt is decoded alone (its first ``prefixes[i]`` tokens through
    :meth:`~._engine.Engine.load_prefix`), in an empty KV cache (a prompt decoded beside another
    sequence's cells gets other numbers: the attention spans them), its cells copied out;
    they go back in together, a sequence each, and each step decodes the next token of
    every answer still going in one decode, one token a sequence. The answers are those
    :func:`greedy` gives each prompt alone, to the bit: a one-token-a-sequence decode
    rounds each token's numbers as a one-token decode does
    (``tests/integration/test_llamacpp_batching.py``). A step is bound by reading the
    weights, as a one-token decode is, so the answers share each read: 48 SciQ answers
    took 1.9x less time in groups of 8 than one at a time (embedded model, 2 cores).
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

    ``sizes``: each prompt's cells (its tokens plus its answer's room). A run holds at
    most ``most`` prompts whose sizes add up to at most ``cells``; a prompt larger than
    that goes alone.
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
