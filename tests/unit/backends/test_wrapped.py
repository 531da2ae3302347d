"""Backends that wrap another pass every member on: none falls back to Backend's default."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest

from esi_guard import FakeBackend
from esi_guard.backends import AnswerPiece, Forced, ForcingRequest, Generation
from esi_guard.backends.base import Backend
from esi_guard.server._timed import TimedBackend

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def test_every_member_a_backend_may_override_is_passed_on() -> None:
    from esi_guard.backends._wrapped import Wrapped

    overridable = {
        name for name, member in vars(Backend).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }  # fmt: skip
    passed_on = set(vars(Wrapped))
    assert overridable <= passed_on, sorted(overridable - passed_on)


def test_the_timed_backend_is_its_inner_one_and_times_generate_and_force() -> None:
    inner = FakeBackend(default_answer="Paris is the capital.")
    seen: list[str] = []
    timed = TimedBackend(inner, lambda step, seconds: seen.append(step))
    gen = timed.generate([PROMPT], max_new_tokens=8, top_k=5)[0]
    assert isinstance(gen, Generation)
    # decode and the token stream were Backend's defaults (None, one piece), not inner's
    assert timed.decode(gen.token_ids) == inner.decode(gen.token_ids)
    assert timed.token_offsets(gen.token_ids, gen.text) == inner.token_offsets(
        gen.token_ids, gen.text
    )
    pieces = list(timed.stream_tokens(PROMPT, max_new_tokens=8, top_k=5))
    theirs = list(inner.stream_tokens(PROMPT, max_new_tokens=8, top_k=5))
    assert len(pieces) == len(theirs) and all(isinstance(p, AnswerPiece) for p in pieces[:-1])
    assert isinstance(pieces[-1], Generation) and pieces[-1].text == gen.text
    request = ForcingRequest(PROMPT, [[{"role": "user", "content": "Wht is the capital?"}]],
                             gen.token_ids, gen.text)  # fmt: skip
    forced = asyncio.run(timed.ateacher_force([request], top_k=5))[0]
    expected = inner.teacher_force([request], top_k=5)[0]
    assert isinstance(forced, Forced) and isinstance(expected, Forced)
    np.testing.assert_array_equal(forced.variants[0].values, expected.variants[0].values)
    assert seen == ["generate", "force"]  # streams and decoding are not timed steps
    assert (timed.model_id, timed.engine, timed.values_kind) == (
        inner.model_id, inner.engine, inner.values_kind,
    )  # fmt: skip


def test_the_embedded_backend_knows_its_identity_without_loading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from esi_guard.backends import embedded

    def no_load(n_threads: int | None = None) -> Backend:
        raise AssertionError("loaded")

    monkeypatch.setattr(embedded, "embedded_backend", no_load)
    backend = embedded.EmbeddedBackend()
    assert backend.model_id == embedded.EMBEDDED_MODEL_ID
    assert backend.approximate is False
    assert backend.engine in ("llamacpp-f16", "transformers") or embedded._LOADED
    backend.check_hidden(None)
    assert not inspect.isabstract(type(backend))
