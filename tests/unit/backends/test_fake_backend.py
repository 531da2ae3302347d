"""The in-package fake backend: deterministic, scripted, and honest about what it was asked."""

from __future__ import annotations

import numpy as np
import pytest

from esi_guard import BackendError, FakeBackend, esi_score
from esi_guard.backends import ChatMessage, Forced, ForcingRequest, Generation

Q = "What is the capital city of France?"


def chat(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content=text)]


def force(backend: FakeBackend, question: str, variants: list[str], *, original: bool = False):
    (gen,) = backend.generate([chat(question)], max_new_tokens=8, top_k=5)
    assert isinstance(gen, Generation)
    request = ForcingRequest(
        prompt=chat(question),
        variants=[chat(v) for v in variants],
        answer_ids=gen.token_ids,
        include_original=original,
    )
    (forced,) = backend.teacher_force([request], top_k=5)
    return gen, forced


def test_answers_are_scripted_words_cut_at_max_new_tokens() -> None:
    backend = FakeBackend({Q: "Paris is the capital"}, default_answer="No idea")
    full, other = backend.generate([chat(Q), chat("Who?")], max_new_tokens=4, top_k=3)
    (short,) = backend.generate([chat(Q)], max_new_tokens=2, top_k=3)
    assert isinstance(full, Generation) and isinstance(other, Generation)
    assert isinstance(short, Generation)
    assert (full.text, full.finish_reason, other.text) == (
        "Paris is the capital",
        "stop",
        "No idea",
    )
    assert (short.text, short.finish_reason) == ("Paris is", "length")
    assert full.topk.ids.shape == (4, 3) and list(full.topk.ids[:, 0]) == list(full.token_ids)
    assert backend.calls == [("generate", 2), ("generate", 1)]


def test_the_same_call_returns_the_same_numbers() -> None:
    a = force(FakeBackend({Q: "Paris"}, sensitivity={Q: 1.0}), Q, ["What is the capitl?"])[1]
    b = force(FakeBackend({Q: "Paris"}, sensitivity={Q: 1.0}), Q, ["What is the capitl?"])[1]
    assert isinstance(a, Forced) and isinstance(b, Forced)
    np.testing.assert_array_equal(a.variants[0].values, b.variants[0].values)


def test_sensitivity_moves_the_variants_and_zero_keeps_them() -> None:
    variant = "What is the capitl city of France?"
    for level, moved in ((0.0, False), (2.0, True)):
        gen, forced = force(FakeBackend({Q: "Paris"}, sensitivity={Q: level}), Q, [variant])
        assert isinstance(forced, Forced)
        score = esi_score(gen.topk, forced.variants).score
        assert (score > 0.01) is moved


def test_the_original_comes_back_only_when_asked() -> None:
    backend = FakeBackend({Q: "Paris"})
    assert force(backend, Q, ["x y"])[1].original is None  # type: ignore[union-attr]
    gen, forced = force(backend, Q, ["x y"], original=True)
    assert isinstance(forced, Forced) and forced.original is not None
    np.testing.assert_array_equal(forced.original.values, gen.topk.values)


@pytest.mark.parametrize("step", ["generate", "teacher_force"])
def test_scripted_failures_are_per_item(step: str) -> None:
    backend = FakeBackend({Q: "Paris"}, failures={Q: step})  # type: ignore[dict-item]
    if step == "generate":
        failed, ok = backend.generate([chat(Q), chat("Who?")], max_new_tokens=4, top_k=3)
        assert isinstance(failed, BackendError) and isinstance(ok, Generation)
        return
    requests = [
        ForcingRequest(prompt=chat(q), variants=[chat("a b")], answer_ids=[1]) for q in (Q, "Who?")
    ]
    failed, ok = backend.teacher_force(requests, top_k=3)
    assert isinstance(failed, BackendError) and isinstance(ok, Forced)


def test_nan_failures_and_whole_call_errors() -> None:
    forced = force(FakeBackend({Q: "Paris"}, failures={Q: "nan"}), Q, ["a b"])[1]
    assert isinstance(forced, Forced) and np.isnan(forced.variants[0].values).all()
    broken = FakeBackend(error=RuntimeError("engine down"))
    with pytest.raises(RuntimeError, match="engine down"):
        broken.generate([chat(Q)], max_new_tokens=2, top_k=2)
