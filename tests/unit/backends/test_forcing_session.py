"""Forcing sessions: an answer forced piece by piece equals it forced once (no model)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from esi_guard.backends import FakeBackend, Forced, ForcingRequest
from esi_guard.backends.hidden import HiddenSpec
from esi_guard.backends.llamacpp._engine import Row
from esi_guard.backends.llamacpp._session import Session, cells
from esi_guard.exceptions import BackendError, ConfigurationError, ContextLengthError

ANSWER = "Paris is the capital . It lies on the Seine . It is big ."


def request(backend: FakeBackend) -> ForcingRequest:
    prompt = [{"role": "user", "content": "Where is Paris?"}]
    variants = [[{"role": "user", "content": q}] for q in ("Were is Paris?", "Where is Pars?")]
    ids = backend.encode_answer(prompt, ANSWER)
    return ForcingRequest(prompt, variants, ids, ANSWER, include_original=True)


def joined(parts: list[Forced], row: int | None) -> tuple[np.ndarray, np.ndarray]:
    tops = [part.original if row is None else part.variants[row] for part in parts]
    assert all(top is not None for top in tops)
    return (np.concatenate([t.ids for t in tops if t is not None]),
            np.concatenate([t.values for t in tops if t is not None]))  # fmt: skip


def test_the_default_session_gives_one_shot_forcings_numbers_piece_by_piece() -> None:
    backend = FakeBackend(default_answer=ANSWER, default_sensitivity=0.5)
    whole = request(backend)
    (once,) = backend.teacher_force([whole], top_k=5)
    assert isinstance(once, Forced) and once.original is not None
    ids = list(whole.answer_ids)
    with backend.open_forcing(replace(whole, answer_ids=[], answer=""), top_k=5,
                              max_answer_tokens=64) as session:  # fmt: skip
        assert not session.incremental
        parts = [session.extend(ids[a:b]) for a, b in [(0, 5), (5, 5), (5, 11), (11, len(ids))]]
        assert session.answer_ids == ids
    assert all(isinstance(part, Forced) for part in parts)
    assert [len(p.variants[0].ids) for p in parts if isinstance(p, Forced)] == [
        5,
        0,
        6,
        len(ids) - 11,
    ]
    got = [p for p in parts if isinstance(p, Forced)]
    for row in (0, 1, None):
        reference = once.original if row is None else once.variants[row]
        assert reference is not None
        got_ids, got_values = joined(got, row)
        np.testing.assert_array_equal(got_ids, reference.ids)
        np.testing.assert_array_equal(got_values, reference.values)
    with pytest.raises(ConfigurationError, match="closed"):
        session.extend(ids[:1])


def test_a_session_opens_on_a_request_without_answer_or_hidden_states() -> None:
    backend = FakeBackend()
    whole = request(backend)
    with pytest.raises(ConfigurationError, match="no answer"):
        backend.open_forcing(whole, top_k=5, max_answer_tokens=8)
    spec = HiddenSpec((0,), ("answer_mean",))
    empty = replace(whole, answer_ids=[], answer="", hidden=spec)
    with pytest.raises(ConfigurationError, match="no hidden states"):
        backend.open_forcing(empty, top_k=5, max_answer_tokens=8)


def test_a_failed_forcing_comes_back_in_place() -> None:
    backend = FakeBackend(failures={"Where is Paris?": "teacher_force"})
    empty = replace(request(backend), answer_ids=[], answer="")
    with backend.open_forcing(empty, top_k=5, max_answer_tokens=8) as session:
        assert isinstance(session.extend([1, 2]), BackendError)


class Recording:
    """Stands for the session's engine: records each decode; each output's logits row
    puts its sequence and the position of the token it was read at in two columns."""

    n_ctx = 64
    n_seq_max = 4

    def __init__(self) -> None:
        self.decodes: list[tuple[list[tuple[list[int], list[int]]], list[Row]]] = []
        self.cleared = False

    def decode(self, shared: Any, rows: list[Row], names: Any = ()) -> np.ndarray:
        self.decodes.append((shared, rows))
        out = [[r.seq, r.start + o] for r in rows for o in r.outputs]
        return np.array(out, dtype=np.float32).reshape(-1, 2)

    def clear(self) -> None:
        self.cleared = True


def test_the_llamacpp_session_decodes_each_rows_new_tokens_only() -> None:
    """Rows [9, 9, 1, 2] and [9, 9, 3]: the prefix [9, 9] once, then each row's prompt
    but its last token; a piece decodes the token before it and its own but the last, and
    reads the logits at those positions (one-shot forcing's, :class:`~._pack.Job`)."""
    engine, released = Recording(), []
    rows = [[9, 9, 1, 2], [9, 9, 3]]
    prompt = [{"role": "user", "content": "q"}]
    opened = ForcingRequest(prompt, [prompt], [], include_original=True)
    session = Session(FakeBackend(), engine, rows, 2, opened, top_k=2,  # type: ignore[arg-type]
                      with_original=True, model_id="m", release=released.append)  # fmt: skip
    shared, heads = engine.decodes[0]
    assert shared == [([9, 9], [0, 1])]
    assert [(r.seq, list(r.tokens), r.start, list(r.outputs)) for r in heads] == [(0, [1], 2, [])]
    first = session.extend([5, 6, 7])
    second = session.extend([8])
    _, rows1 = engine.decodes[1]
    assert [(r.seq, list(r.tokens), r.start) for r in rows1] == [
        (0, [2, 5, 6], 3),
        (1, [3, 5, 6], 2),
    ]
    _, rows2 = engine.decodes[2]
    assert [(r.seq, list(r.tokens), r.start) for r in rows2] == [(0, [7], 6), (1, [7], 5)]
    assert isinstance(first, Forced) and isinstance(second, Forced)
    assert first.original is not None and second.original is not None
    # the original row's outputs sit at positions 3, 4, 5 then 6; the variant's at 2.. then 5
    assert sorted(first.original.values[:, 0].tolist()) == [3.0, 4.0, 5.0]
    assert second.variants[0].values.max() == 5.0
    assert cells(rows, 2, 4) == 2 + (2 + 4) + (1 + 4)
    too_long = session.extend([1] * 40)
    assert isinstance(too_long, ContextLengthError)
    assert session.extend([1]) is too_long  # the session stays failed
    session.close()
    session.close()
    assert engine.cleared and released == [engine]
