"""A prompt near the context window must not shorten another prompt's answer in its batch."""

from __future__ import annotations

import pytest

from esi_guard.backends import Generation
from tests.unit.backends.test_hf import backend, user  # noqa: F401  (the tiny model fixture)

pytest.importorskip("torch")


def test_a_long_prompt_does_not_shorten_the_answers_batched_with_it(backend) -> None:  # noqa: F811
    short = user("short question?")
    alone = backend.generate([short], max_new_tokens=8, top_k=5)[0]
    assert isinstance(alone, Generation)
    near = user("y" * (510 - len(backend.render(user("")))))
    assert 512 - len(backend.render(near)) == 2
    together = backend.generate([short, near], max_new_tokens=8, top_k=5)
    assert isinstance(together[0], Generation)
    assert together[0].token_ids == alone.token_ids
    assert together[0].finish_reason == alone.finish_reason
    assert isinstance(together[1], Generation) and len(together[1].token_ids) <= 2
