"""Teacher forcing with a request's rows packed into few ``llama_decode`` calls.

A request's rows (the original when asked for, then each variant) share a prompt prefix and are
each followed by the same answer. :func:`plan` (pure) packs them into as few decodes as
``n_seq_max`` and ``n_ctx`` allow; :func:`run` computes the prefix once (its chat-template part
from the prefix cache), shares its KV cells with every row and reduces logits to top-k at once. A
decode never holds two requests' rows and the cache is emptied between requests, so a request gets
the same bits whatever it is batched with (mixing requests was no faster on a CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from esi_guard.backends._engine_helpers import non_finite
from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.backends.hidden import reduce_hidden
from esi_guard.backends.llamacpp._engine import Engine, Row, topk_rows
from esi_guard.backends.llamacpp._tap import tensor_name
from esi_guard.exceptions import BackendError
from esi_guard.scoring import TopK

__all__ = ["Job", "Part", "TopRows", "force", "forced", "plan", "run", "run_alone"]

T = TypeVar("T")

TopRows = tuple[np.ndarray, np.ndarray]
"""A row's top-k ids and values at each answer position (:func:`~._engine.topk_rows`)."""


@dataclass(frozen=True)
class Job:
    """One request's forcing: the same answer after each of its rows.

    ``rows``: the rendered prompts (the original first when asked for); ``shared``: leading tokens
    all rows share, computed once; ``names``: graph tensors read on the first row; ``cached``: how
    many ``shared`` tokens come through the engine's prefix cache (the chat template's part).
    """

    rows: Sequence[Sequence[int]]
    answer: Sequence[int]
    shared: int = 0
    names: Sequence[str] = ()
    cached: int = 0

    def load(self, engine: Engine, seqs: Sequence[int]) -> list[tuple[list[int], list[int]]]:
        """The cached prefix loaded under ``seqs``; the rest of the shared one, to decode."""
        if self.cached:
            engine.load_prefix(self.rows[0][: self.cached])
            for seq in seqs[1:]:
                engine.copy_prefix(0, seq, self.cached)
        if self.shared > self.cached:
            return [(list(self.rows[0][self.cached : self.shared]), list(seqs))]
        return []

    def tail(self, row: int) -> list[int]:
        """The tokens row ``row`` decodes after the prefix: its own, then the answer's."""
        return [*self.rows[row][self.shared :], *self.answer[:-1]]

    def outputs(self, row: int) -> list[int]:
        """Offsets into :meth:`tail` whose logits predict the answer's tokens."""
        first = len(self.rows[row]) - 1 - self.shared
        return list(range(first, first + len(self.answer)))


@dataclass(frozen=True)
class Part:
    """One decode: rows ``rows`` of job ``job``; ``prefix``: the job's prefix is computed in it."""

    job: int
    rows: range
    prefix: bool = True


def plan(jobs: Sequence[Job], *, n_ctx: int, n_seq_max: int) -> list[Part]:
    """The decodes that force ``jobs``, in order; every row in exactly one, one job per decode.

    Raises:
        BackendError: A row that does not fit a decode alone (callers check lengths).
    """
    decodes: list[Part] = []
    for number, job in enumerate(jobs):
        start = 0
        cells = job.shared
        for row in range(len(job.rows)):
            size = len(job.tail(row))
            if job.shared + size > n_ctx:
                msg = f"a row of {job.shared + size} tokens does not fit {n_ctx} cells"
                raise BackendError(msg)
            if row - start + 1 > n_seq_max or cells + size > n_ctx:
                decodes.append(Part(number, range(start, row), prefix=start == 0))
                start, cells = row, job.shared
            cells += size
        if job.rows:
            decodes.append(Part(number, range(start, len(job.rows)), prefix=start == 0))
    return decodes


def run(
    engine: Engine,
    jobs: Sequence[Job],
    decodes: Sequence[Part],
    reduce: Callable[[np.ndarray], T],
) -> tuple[list[list[T]], list[dict[str, np.ndarray]]]:
    """Decode a :func:`plan`: each job's rows' logits through ``reduce``, and its states.

    Returns, per job, ``reduce`` of each row's ``(len(answer), n_vocab)`` logits in row order, and
    the tensors ``names`` read on its first row (``{}`` without names). The KV cache is left empty.
    """
    out: list[list[T]] = [[] for _ in jobs]
    states: list[dict[str, np.ndarray]] = [{} for _ in jobs]
    for number, part in enumerate(decodes):
        job = jobs[part.job]
        seqs = list(range(len(part.rows)))
        shared = []
        if job.shared and part.prefix:
            shared = job.load(engine, seqs)
        elif job.shared:  # held under sequence 0 since the decode before
            for seq in seqs[1:]:
                engine.copy_prefix(0, seq, job.shared)
        rows = [
            Row(seq, job.tail(row), job.shared, job.outputs(row))
            for seq, row in zip(seqs, part.rows, strict=True)
        ]
        names = job.names if part.rows.start == 0 else ()
        logits = engine.decode(shared, rows, names, shared_at=job.cached)
        size = len(job.answer)
        if names:  # the first row's outputs come first
            states[part.job] = {name: engine.states[name][:size] for name in names}
        out[part.job] += [reduce(logits[i * size : (i + 1) * size]) for i in seqs]
        goes_on = number + 1 < len(decodes) and not decodes[number + 1].prefix
        if goes_on and job.shared:
            for seq in seqs[1:]:
                engine.drop(seq)
            engine.keep(0, job.shared)
        else:
            engine.clear()
    return out, states


def run_alone(
    engine: Engine, jobs: Sequence[Job], reduce: Callable[[np.ndarray], T]
) -> tuple[list[list[T]], list[dict[str, np.ndarray]]]:
    """As :func:`run`, each row in a decode of its own: its numbers are those it gets alone."""
    out: list[list[T]] = []
    states: list[dict[str, np.ndarray]] = []
    for job in jobs:
        if job.shared:
            rest = job.load(engine, [0])
            if rest:
                engine.decode([], [Row(0, rest[0][0], job.cached, [])])
        rows: list[T] = []
        read: dict[str, np.ndarray] = {}
        for number in range(len(job.rows)):
            if job.shared:
                engine.copy_prefix(0, 1, job.shared)
            row = Row(1, job.tail(number), job.shared, job.outputs(number))
            rows.append(reduce(engine.decode([], [row], job.names if number == 0 else ())))
            read = engine.states if number == 0 else read
            engine.drop(1)
        engine.clear()
        out.append(rows)
        states.append(read)
    return out, states


def force(
    engine: Engine, jobs: Sequence[Job], top_k: int, pack_rows: bool, taps: int | None
) -> tuple[list[list[TopRows]], list[dict[str, np.ndarray]]]:
    """Each job's rows' top-k and its first row's states; the KV cache left empty.

    :func:`run` on a :func:`plan` with ``pack_rows``, else :func:`run_alone`. ``taps``: the hidden
    size, to turn taps on where a job reads states (a forcing copy's engine, never probed).
    """
    if taps is not None and any(job.names for job in jobs):
        engine.enable_taps(taps)
    reduce = partial(topk_rows, k=top_k)
    try:
        if not pack_rows:
            return run_alone(engine, jobs, reduce)
        return run(engine, jobs, plan(jobs, n_ctx=engine.n_ctx, n_seq_max=engine.n_seq_max), reduce)
    finally:
        engine.clear()


def forced(
    rows: list[TopRows],
    states: dict[str, np.ndarray],
    request: ForcingRequest,
    with_original: bool,
    model_id: str,
) -> Forced | BackendError:
    """A request's result from its rows' top-k (the original first when ``with_original``)."""
    if not all(np.isfinite(values).all() for _, values in rows):
        return non_finite(model_id)
    tops = [TopK(ids, values) for ids, values in rows]
    original = tops.pop(0) if with_original else None
    hidden = None
    if request.hidden is not None:
        layers = {layer: states[tensor_name(layer)] for layer in request.hidden.layers}
        hidden = reduce_hidden(request.hidden, layers, len(request.answer_ids))
    return Forced(variants=tops, original=original, hidden=hidden)
