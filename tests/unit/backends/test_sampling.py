"""Sampled answers (the benchmarks' baselines): seeded, the model's own logprobs, cut at stops.

The HF checks run on test_hf.py's tiny random Llama; llama.cpp's sampling is checked on the
embedded model in tests/integration/test_llamacpp_backend.py.
"""

from __future__ import annotations

import pytest

from esi_guard import ConfigurationError, ContextLengthError, FakeBackend, HFBackend
from esi_guard.backends.sampling import make_sample, sample

PIECES = {1: "Mich", 2: "el", 3: "angelo", 4: " y", 5: "ou", 6: " know"}


def decode(ids: object) -> str:
    return "".join(PIECES[i] for i in ids)  # type: ignore[attr-defined]


def test_a_sampled_answer_ends_before_its_stop_sequence_with_its_logprobs() -> None:
    whole = make_sample([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4], decode=decode)
    assert whole.text == "Michelangelo y" and whole.tokens == ("Mich", "el", "angelo", " y")
    cut = make_sample([1, 2, 3, 4, 5], [-0.1, -0.2, -0.3, -0.4, -0.5], decode=decode,
                      stop=["you"])  # fmt: skip
    assert cut.text == "Michelangelo" and cut.token_logprobs == (-0.1, -0.2, -0.3)
    assert cut.tokens == ("Mich", "el", "angelo")
    assert cut.logprob == pytest.approx(-0.6) and cut.mean_logprob == pytest.approx(-0.2)


def test_other_backends_and_bad_settings_are_refused_before_any_work() -> None:
    with pytest.raises(ConfigurationError, match="FakeBackend cannot sample"):
        sample(FakeBackend(), [[]], n=2, temperature=1.0, max_new_tokens=4)
    with pytest.raises(ConfigurationError, match="temperature"):
        sample(FakeBackend(), [[]], n=2, temperature=0, max_new_tokens=4)


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from tests.unit.backends.test_hf import backend, lone_logits, user  # noqa: E402, F401


def test_samples_carry_the_models_own_token_logprobs(backend: HFBackend) -> None:  # noqa: F811
    prompts = [user("Name a colour."), user("Name a much longer thing, please?")]
    first = sample(backend, prompts, n=3, temperature=1.0, max_new_tokens=6, seed=7)
    assert [len(s) for s in first] == [3, 3]
    again = sample(backend, prompts, n=3, temperature=1.0, max_new_tokens=6, seed=7)
    assert first == again  # seeded
    texts = {s.text for per_prompt in first for s in per_prompt}
    assert len(texts) > 1  # really sampled (random weights spread the mass)
    for prompt, samples in zip(prompts, first, strict=True):
        for one in samples:
            ids = [int(t) for t in one.text.split()] if one.text else []
            assert len(ids) == len(one.token_logprobs)
            if not ids:
                continue
            expected = lone_logits(backend, prompt, ids).log_softmax(-1)
            picked = expected[torch.arange(len(ids)), torch.tensor(ids)]
            assert one.token_logprobs == pytest.approx(picked.tolist(), abs=1e-5)
    cut = sample(backend, prompts, n=3, temperature=1.0, max_new_tokens=6, seed=7, stop=[" "])
    pairs = [p for a, b in zip(first, cut, strict=True) for p in zip(a, b, strict=True)]
    for whole, short in pairs:  # the same draws, cut before the first space
        assert short.text == whole.text.split(" ")[0]
        assert short.token_logprobs == whole.token_logprobs[: len(short.token_logprobs)]


@pytest.mark.parametrize(("rows", "reuse"), [(3, True), (64, False)])
def test_samples_batched_or_alone_carry_the_models_own_token_logprobs(
    backend: HFBackend,  # noqa: F811
    rows: int,
    reuse: bool,
) -> None:
    """Prompts of different lengths share a pass (padded on the left), or each has its own."""
    other = HFBackend(backend.model, backend.tokenizer, max_batch_rows=rows, reuse_prefix=reuse)
    prompts = [user("Name a colour."), user("Name a much longer thing, please?"), user("Hi")]
    drawn = sample(other, prompts, n=3, temperature=1.0, max_new_tokens=6, seed=3)
    assert [len(s) for s in drawn] == [3, 3, 3]
    for prompt, samples in zip(prompts, drawn, strict=True):
        for one in samples:
            ids = [int(t) for t in one.text.split()] if one.text else []
            if not ids:
                continue
            expected = lone_logits(backend, prompt, ids).log_softmax(-1)
            picked = expected[torch.arange(len(ids)), torch.tensor(ids)]
            assert one.token_logprobs == pytest.approx(picked.tolist(), abs=1e-5)


def test_sampling_refuses_a_prompt_past_the_window_alone(backend: HFBackend) -> None:  # noqa: F811
    fits, too_long = user("short question?"), user("x" * 600)
    drawn = sample(backend, [fits, too_long, fits], n=2, temperature=1.0, max_new_tokens=4)
    assert isinstance(drawn[1], ContextLengthError)  # as generate and llama.cpp's sample do
    assert isinstance(drawn[0], list) and isinstance(drawn[2], list) and len(drawn[0]) == 2
