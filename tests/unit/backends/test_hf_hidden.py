"""HFBackend's hidden states, read by hooks from its own generate and teacher-forcing passes.

On a tiny random 3-layer Llama: every state must equal the one a plain, unpadded
``output_hidden_states=True`` forward gives at the positions behind the answer's top-k
rows, whichever path (batched generation, streaming, teacher forcing) read it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from esi_guard import ConfigurationError, HFBackend
from esi_guard.backends import (
    FINAL,
    POSITIONS,
    ChatMessage,
    Forced,
    ForcingRequest,
    Generation,
    HiddenSpec,
    HiddenStates,
)
from esi_guard.backends.hf._hidden import capture, decoder_parts
from tests.unit.backends.test_hf import EOS, PAD, StubTokenizer, user

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_LAYERS = 3
ALL = HiddenSpec((*range(N_LAYERS), FINAL), POSITIONS)
PROMPTS = [user("Short?"), user("A somewhat longer question to pad against?")]


@pytest.fixture(scope="module")
def backend() -> HFBackend:
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=N_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=EOS, pad_token_id=PAD, bos_token_id=2,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.eos_token_id = EOS
    return HFBackend(model, StubTokenizer(), model_id="tiny-llama-3")  # type: ignore[arg-type]


def generated(backend: HFBackend, prompts: list[list[ChatMessage]], **kwargs: Any) -> list[Any]:
    gens = backend.generate(prompts, max_new_tokens=6, top_k=8, **kwargs)
    assert all(isinstance(gen, Generation) for gen in gens)
    return list(gens)


def expected(backend: HFBackend, prompt: list[ChatMessage], answer: list[int]) -> np.ndarray:
    """The states of ``ALL`` from one unpadded ``output_hidden_states`` forward.

    Block L is ``hidden_states[L + 1]`` for all but the last block, whose output
    transformers replaces by the final norm's (``hidden_states[-1]``): that block is
    checked through the norm instead (see the test).
    """
    ids = backend.render(prompt)
    with torch.inference_mode():
        out = backend.model(input_ids=torch.tensor([ids + answer]), output_hidden_states=True)
    assert len(out.hidden_states) == N_LAYERS + 1
    rows = slice(len(ids) - 1, len(ids) - 1 + max(len(answer), 1))
    per_layer = []
    for layer in ALL.layers:
        source = -1 if layer in (FINAL, N_LAYERS - 1) else layer + 1
        states = out.hidden_states[source][0, rows].double().numpy()
        per_layer.append([states[0], states.mean(axis=0), states[-1]])
    return np.asarray(per_layer, dtype=np.float32)


def assert_states_close(got: HiddenStates | None, want: np.ndarray) -> None:
    """All but the last block's states (``expected`` has not got those)."""
    assert got is not None
    assert got.layers == ALL.layers and got.positions == POSITIONS
    assert got.values.dtype == np.float32 and got.values.shape == (N_LAYERS + 1, 3, 32)
    layers = [i for i, layer in enumerate(ALL.layers) if layer != N_LAYERS - 1]
    np.testing.assert_allclose(got.values[layers], want[layers], atol=1e-4, rtol=1e-4)


def test_generated_states_are_those_of_a_plain_forward_at_the_answers_rows(
    backend: HFBackend,
) -> None:
    for prompt, gen in zip(PROMPTS, generated(backend, PROMPTS, hidden=ALL), strict=True):
        assert len(gen.token_ids) >= 2  # rows beyond row 0 are exercised
        want = expected(backend, prompt, list(gen.token_ids))
        assert_states_close(gen.hidden, want)
        # The last block's output, through the final norm, is FINAL's state.
        last = torch.tensor(gen.hidden.values[N_LAYERS - 1, [0, 2]])
        with torch.inference_mode():
            normed = backend.model.model.norm(last).numpy()
        np.testing.assert_allclose(normed, gen.hidden.values[-1, [0, 2]], atol=1e-4, rtol=1e-4)


def test_batched_generation_gives_each_prompt_its_states_alone(backend: HFBackend) -> None:
    batched = generated(backend, PROMPTS, hidden=ALL)
    for prompt, gen in zip(PROMPTS, batched, strict=True):
        (alone,) = generated(backend, [prompt], hidden=ALL)
        assert alone.token_ids == gen.token_ids
        np.testing.assert_allclose(gen.hidden.values, alone.hidden.values, atol=1e-4, rtol=1e-4)


def test_teacher_forcing_the_answer_gives_the_states_generation_read(backend: HFBackend) -> None:
    gens = generated(backend, PROMPTS, hidden=ALL)
    requests = [
        ForcingRequest(prompt=prompt, variants=[user("Shrt?"), user("Another variant here?")],
                       answer_ids=gen.token_ids, include_original=True, hidden=ALL)
        for prompt, gen in zip(PROMPTS, gens, strict=True)
    ]  # fmt: skip
    plain = ForcingRequest(prompt=PROMPTS[0], variants=[user("Shrt?")], answer_ids=[5, 6])
    for reuse in (True, False):  # the shared prefix is computed apart, or not
        forcer = HFBackend(backend.model, backend.tokenizer, reuse_prefix=reuse)
        forced = forcer.teacher_force([requests[0], plain, requests[1]], top_k=8)
        assert all(isinstance(f, Forced) for f in forced)
        assert forced[1].hidden is None  # a request that did not ask gets none
        for gen, got in zip(gens, [forced[0], forced[2]], strict=True):
            assert got.hidden is not None and got.hidden.layers == ALL.layers
            np.testing.assert_allclose(got.hidden.values, gen.hidden.values, atol=1e-4, rtol=1e-4)


def test_a_stop_sequence_cuts_the_states_with_the_answer(backend: HFBackend) -> None:
    whole = generated(backend, PROMPTS[:1], hidden=ALL)[0]
    cut = generated(backend, PROMPTS[:1], hidden=ALL, stop=[" "])[0]  # ids are space-joined
    assert len(cut.token_ids) == 1 < len(whole.token_ids)
    prompt_last = whole.hidden.values[:, 0]
    for position in range(3):  # one row: every position is the prompt's last state
        np.testing.assert_allclose(cut.hidden.values[:, position], prompt_last, atol=1e-5)
    empty = ForcingRequest(prompt=PROMPTS[0], variants=[], answer_ids=[], include_original=True,
                           hidden=ALL)  # fmt: skip
    (forced,) = backend.teacher_force([empty], top_k=8)
    assert isinstance(forced, Forced) and forced.hidden is not None
    np.testing.assert_allclose(forced.hidden.values[:, 1], prompt_last, atol=1e-4, rtol=1e-4)


async def test_streaming_and_async_give_the_states_generate_gives(backend: HFBackend) -> None:
    (want,) = generated(backend, PROMPTS[1:], hidden=ALL)
    *pieces, streamed = list(
        backend.stream_generate(PROMPTS[1], max_new_tokens=6, top_k=8, hidden=ALL)
    )
    assert "".join(pieces) == streamed.text
    (async_gen,) = await backend.agenerate(PROMPTS[1:], max_new_tokens=6, top_k=8, hidden=ALL)
    async_streamed = [
        piece
        async for piece in backend.astream_generate(
            PROMPTS[1], max_new_tokens=6, top_k=8, hidden=ALL
        )
    ][-1]
    for got in (streamed, async_gen, async_streamed):
        assert isinstance(got, Generation) and got.token_ids == want.token_ids
        np.testing.assert_allclose(got.hidden.values, want.hidden.values, atol=1e-5)


def hook_count(backend: HFBackend) -> int:
    blocks, norm = decoder_parts(backend.model)
    return sum(len(module._forward_hooks) for module in [*blocks, norm])


def test_without_hidden_nothing_is_hooked_and_the_distributions_are_unchanged(
    backend: HFBackend,
) -> None:
    baseline = hook_count(backend)  # transformers keeps output-recording hooks of its own
    seen: list[int] = []
    handle = backend.model.model.register_forward_pre_hook(
        lambda module, args: seen.append(hook_count(backend))
    )
    try:
        plain = generated(backend, PROMPTS)
        assert seen and set(seen) == {baseline}
        request = ForcingRequest(prompt=PROMPTS[0], variants=[user("Shrt?")],
                                 answer_ids=plain[0].token_ids, include_original=True)  # fmt: skip
        seen.clear()
        (forced_plain,) = backend.teacher_force([request], top_k=8)
        assert seen and set(seen) == {baseline}
        seen.clear()
        with_states = generated(backend, PROMPTS, hidden=ALL)
        assert seen and min(seen) > baseline  # hooked while it ran
    finally:
        handle.remove()
    assert hook_count(backend) == baseline  # and unhooked after
    assert all(gen.hidden is None for gen in plain)
    assert forced_plain.hidden is None
    for a, b in zip(plain, with_states, strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text
        assert a.topk.ids.tolist() == b.topk.ids.tolist()
        np.testing.assert_array_equal(a.topk.values, b.topk.values)
    (forced,) = backend.teacher_force([ForcingRequest(**{**vars(request), "hidden": ALL})], top_k=8)
    assert forced.original.ids.tolist() == forced_plain.original.ids.tolist()
    np.testing.assert_array_equal(forced.original.values, forced_plain.original.values)


def test_hooks_are_removed_when_the_pass_fails(backend: HFBackend) -> None:
    baseline = hook_count(backend)

    def fail(module: Any, args: Any) -> None:
        raise RuntimeError("the pass failed")

    handle = backend.model.model.register_forward_pre_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="the pass failed"):
            backend.generate(PROMPTS, max_new_tokens=4, top_k=5, hidden=ALL)
    finally:
        handle.remove()
    assert hook_count(backend) == baseline


def test_what_cannot_be_given_is_a_configuration_error(backend: HFBackend) -> None:
    assert backend.hidden_layers == (0, 1, 2, FINAL)
    assert backend.hidden_size == 32
    with pytest.raises(ConfigurationError, match=r"no layers \[3\]"):
        backend.generate(PROMPTS, max_new_tokens=4, top_k=5, hidden=HiddenSpec((3,)))
    with pytest.raises(ConfigurationError, match=r"no layers \[-2\]"):
        backend.stream_generate(PROMPTS[0], max_new_tokens=4, top_k=5, hidden=HiddenSpec((-2,)))
    no_original = ForcingRequest(prompt=PROMPTS[0], variants=[user("Shrt?")], answer_ids=[5],
                                 hidden=HiddenSpec((0,)))  # fmt: skip
    with pytest.raises(ConfigurationError, match="include_original"):
        backend.teacher_force([no_original], top_k=5)
    with (
        pytest.raises(ConfigurationError, match=r"no layers \[7\]"),
        capture(backend.model, [7], lambda state: state),
    ):
        pass


def test_an_architecture_without_known_blocks_is_named(backend: HFBackend) -> None:
    class Odd(torch.nn.Module):
        pass

    with pytest.raises(ConfigurationError, match="Odd"):
        decoder_parts(Odd())


def test_states_stay_on_the_models_device_until_the_passes_are_done() -> None:
    """No copy to the host inside a pass (on a GPU each one waited for the device, at every
    hooked layer of every decoding step): a model on the ``meta`` device, which holds no
    data, keeps what its hooks select there (a copy to the CPU would fail)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    with capture(model, [0, FINAL], lambda state: state[:, -1]) as kept:
        model(input_ids=torch.zeros((2, 5), dtype=torch.long, device="meta"))
    assert {layer: [t.device.type for t in per_pass] for layer, per_pass in kept.items()} == {
        0: ["meta"], FINAL: ["meta"]}  # fmt: skip
    assert all(t.dtype == torch.float32 and t.shape == (2, 16) for t in kept[0])
