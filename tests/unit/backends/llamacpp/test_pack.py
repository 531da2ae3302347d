"""Teacher forcing's packing plan and its run (``_pack``), on a recording engine: no model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from esi_guard import BackendError
from esi_guard.backends.llamacpp._engine import Row
from esi_guard.backends.llamacpp._pack import Job, Part, plan, run, run_alone


def job(
    lengths: list[int],
    answer: int = 3,
    shared: int = 0,
    names: tuple[str, ...] = (),
    cached: int = 0,
) -> Job:
    """A job whose rows have these lengths (their first ``shared`` tokens the same)."""
    rows = [[7] * shared + [100 + i] * (n - shared) for i, n in enumerate(lengths)]
    return Job(rows, list(range(answer)), shared, names, cached)


def test_a_plan_packs_a_requests_rows_and_splits_them_where_they_do_not_fit() -> None:
    jobs = [job([10, 11, 12], shared=8), job([9, 9])]  # tails: 2 + 2 answer tokens each
    assert plan(jobs, n_ctx=100, n_seq_max=16) == [Part(0, range(3)), Part(1, range(2))]
    by_rows = plan(jobs, n_ctx=100, n_seq_max=2)
    assert by_rows == [Part(0, range(2)), Part(0, range(2, 3), prefix=False), Part(1, range(2))]
    # cells: the prefix once (8), then rows of 4, 5, 6 tokens: 8 + 4 + 5 = 17 fit, + 6 does not
    by_cells = plan(jobs, n_ctx=17, n_seq_max=16)
    assert by_cells[:2] == [Part(0, range(2)), Part(0, range(2, 3), prefix=False)]
    alone = plan(jobs, n_ctx=14, n_seq_max=16)  # 8 + 6: the last row just fits on its own
    assert [(p.job, list(p.rows), p.prefix) for p in alone[:3]] == [
        (0, [0], True), (0, [1], False), (0, [2], False)
    ]  # fmt: skip
    with pytest.raises(BackendError, match="a row of 14 tokens does not fit 13 cells"):
        plan(jobs, n_ctx=13, n_seq_max=16)
    assert plan([Job([], [1])], n_ctx=8, n_seq_max=2) == []


class RecordingEngine:
    """Stands for the engine in :func:`run`: records its calls; each output's logits row
    holds its sequence and position, and each tensor read holds the same rows times ten."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.states: dict[str, np.ndarray] = {}

    def decode(
        self,
        shared: list[tuple[list[int], list[int]]],
        rows: list[Row],
        names: Any = (),
        *,
        shared_at: int = 0,
    ) -> np.ndarray:
        given = [(r.seq, r.start, len(r.tokens)) for r in rows]
        spans = [(len(t), s) if not shared_at else (shared_at, len(t), s) for t, s in shared]
        self.calls.append(("decode", spans, given, list(names)))
        out = np.array([[r.seq, r.start + o] for r in rows for o in r.outputs], dtype=np.float32)
        self.states = {name: out * 10 for name in names}
        return out

    def load_prefix(self, tokens: list[int]) -> None:
        self.calls.append(("load", len(tokens)))

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        self.calls.append(("copy", source, target, length))

    def drop(self, seq: int) -> None:
        self.calls.append(("drop", seq))

    def keep(self, seq: int, length: int) -> None:
        self.calls.append(("keep", seq, length))

    def clear(self) -> None:
        self.calls.append(("clear",))


def test_a_plan_runs_with_each_rows_outputs_in_order_and_the_first_rows_states() -> None:
    jobs = [job([10, 11, 12], shared=8, names=("l_out-3",)), job([5, 6], names=("l_out-3",))]
    engine = RecordingEngine()
    decodes = plan(jobs, n_ctx=100, n_seq_max=2)
    out, states = run(engine, jobs, decodes, lambda logits: logits)  # type: ignore[arg-type]
    for each, rows in zip(jobs, out, strict=True):
        assert len(rows) == len(each.rows)
        for tokens, logits in zip(each.rows, rows, strict=True):  # the answer's positions
            assert list(logits[:, 1]) == list(range(len(tokens) - 1, len(tokens) + 2))
    assert [list(logits[:, 0]) for logits in out[0]] == [[0] * 3, [1] * 3, [0] * 3]
    for rows, read in zip(out, states, strict=True):  # the first row's, only
        assert list(read) == ["l_out-3"] and np.array_equal(read["l_out-3"], rows[0] * 10)
    assert engine.calls == [
        ("decode", [(8, [0, 1])], [(0, 8, 4), (1, 8, 5)], ["l_out-3"]),  # prefix computed once
        ("drop", 1), ("keep", 0, 8),  # only the prefix stays, under sequence 0
        ("decode", [], [(0, 8, 6)], []),  # the row that did not fit, on the held prefix
        ("clear",),
        ("decode", [], [(0, 0, 7), (1, 0, 8)], ["l_out-3"]),  # no prefix shared
        ("clear",),
    ]  # fmt: skip


def test_a_held_prefix_is_shared_with_every_row_of_the_next_decode() -> None:
    jobs = [job([10] * 5, shared=8)]
    engine = RecordingEngine()
    run(engine, jobs, plan(jobs, n_ctx=100, n_seq_max=2), lambda logits: logits)  # type: ignore[arg-type]
    copies = [call for call in engine.calls if call[0] == "copy"]
    assert copies == [("copy", 0, 1, 8)]  # rows 2-3 (seqs 0-1), then row 4 (seq 0)
    assert engine.calls[-1] == ("clear",)
    assert sum(call[0] == "decode" for call in engine.calls) == 3


def test_a_cached_prefix_is_loaded_and_the_rest_of_the_shared_one_decoded_after_it() -> None:
    """The chat template's part (5 tokens) comes through the engine's prefix cache and is
    shared with each row; the 3 more tokens every row shares go once into the first decode,
    at positions 5..7; rows alone decode that rest on sequence 0 before copying it."""
    jobs = [job([10, 11], shared=8, cached=5)]
    engine = RecordingEngine()
    run(engine, jobs, plan(jobs, n_ctx=100, n_seq_max=4), lambda logits: logits)  # type: ignore[arg-type]
    assert engine.calls == [
        ("load", 5), ("copy", 0, 1, 5),
        ("decode", [(5, 3, [0, 1])], [(0, 8, 4), (1, 8, 5)], []),
        ("clear",),
    ]  # fmt: skip
    alone = RecordingEngine()
    run_alone(alone, jobs, lambda logits: logits)  # type: ignore[arg-type]
    assert alone.calls[:4] == [
        ("load", 5), ("decode", [], [(0, 5, 3)], []), ("copy", 0, 1, 8),
        ("decode", [], [(1, 8, 4)], []),
    ]  # fmt: skip
