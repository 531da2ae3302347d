"""The guard on the real embedded model: answers, reproducibility, batching, and the math."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from esi_guard import ESIGuard, HFBackend, WholeMessageWarning
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID
from esi_guard.backends.hf import backend as hf_backend_module

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SYSTEM = "Please directly answer the following question with one or few words."


def prompt(question: str) -> list[tuple[str, str]]:
    return [("system", SYSTEM), ("human", question)]


@pytest.fixture(scope="module")
def guard(hf_backend: HFBackend) -> ESIGuard:
    return ESIGuard(backend=hf_backend, threshold=0.5, max_new_tokens=24)


def test_capital_of_france_is_paris(hf_backend: HFBackend) -> None:
    message = ESIGuard(backend=hf_backend, threshold=0.5).invoke("What is the capital of France?")
    assert "Paris" in message.content
    esi = message.response_metadata["esi"]
    assert esi["scored"] and math.isfinite(esi["score"]) and esi["score"] >= 0.0
    assert (
        esi["answer_token_ids"] and hf_backend.tokenizer.eos_token_id not in esi["answer_token_ids"]
    )


def test_scores_are_finite_and_reproducible(guard: ESIGuard, sciq_questions: list[str]) -> None:
    inputs = [prompt(q) for q in sciq_questions[:3]]
    first = [m.response_metadata["esi"] for m in guard.batch(inputs)]
    again = [m.response_metadata["esi"] for m in guard.batch(inputs)]
    for a, b in zip(first, again, strict=True):
        assert a["scored"] and math.isfinite(a["score"])
        assert a["variants"] == b["variants"]
        assert a["answer_token_ids"] == b["answer_token_ids"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-6)


def test_batched_and_one_by_one_scores_agree(guard: ESIGuard, sciq_questions: list[str]) -> None:
    inputs = [prompt(q) for q in sciq_questions[3:7]]
    batched = [m.response_metadata["esi"] for m in guard.batch(inputs)]
    single = [guard.invoke(x).response_metadata["esi"] for x in inputs]
    for b, s in zip(batched, single, strict=True):
        assert b["answer_token_ids"] == s["answer_token_ids"]
        assert b["score"] == pytest.approx(s["score"], abs=1e-4)


def test_existing_answer_scores_like_the_generated_one(guard: ESIGuard) -> None:
    message = guard.invoke(prompt("What gas do plants absorb from the air?"))
    esi = message.response_metadata["esi"]
    result = guard.score(prompt("What gas do plants absorb from the air?"), esi["answer"])
    assert result.answer_token_ids == esi["answer_token_ids"]
    assert result.variants == esi["variants"]
    assert result.score == pytest.approx(esi["score"], abs=1e-4)


def test_a_prompt_past_the_context_window_is_withheld_and_the_batch_goes_on(
    hf_backend: HFBackend,
) -> None:
    guard = ESIGuard(backend=hf_backend, threshold=0.5, max_new_tokens=24)
    window = hf_backend.context_length
    assert window is not None
    huge = "Which of these words is the longest? " + "photosynthesis " * window
    with pytest.warns(WholeMessageWarning, match="with_prompt"):  # a long whole message
        fine, refused = guard.batch([prompt("What is the capital of France?"), prompt(huge)])
    assert fine.response_metadata["esi"]["scored"] and "Paris" in fine.content
    esi = refused.response_metadata["esi"]
    assert esi["reason"].startswith("context_overflow: ") and str(window) in esi["reason"]
    assert esi["decision"] == "abstain" and refused.content == guard.abstain_message


def test_a_stop_sequence_ends_the_real_models_answer(hf_backend: HFBackend) -> None:
    guard = ESIGuard(backend=hf_backend, threshold=0.5, max_new_tokens=24)
    question = "What is the capital of France?"
    full = guard.invoke(question).response_metadata["esi"]
    word = full["answer"].split()[2]  # "The capital of France is Paris." -> "of"
    message = guard.invoke(question, stop=[word])
    esi = message.response_metadata["esi"]
    assert word not in esi["answer"] and full["answer"].startswith(esi["answer"])
    assert esi["finish_reason"] == "stop" and esi["scored"]
    assert esi["answer_token_ids"] == full["answer_token_ids"][: len(esi["answer_token_ids"])]
    assert 0 < len(esi["answer_token_ids"]) < len(full["answer_token_ids"])
    text = hf_backend.tokenizer.decode(esi["answer_token_ids"], skip_special_tokens=True)
    assert text.strip() == esi["answer"] == message.content
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == len(esi["answer_token_ids"])


def test_the_gguf_s_kept_reading_gives_the_same_model_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("ESI_GUARD_CACHE", str(tmp_path))
    read: list[bool] = []
    real = hf_backend_module.read_kept

    def spied(folder: Path, dtype: object) -> object:
        found = real(folder, dtype)
        read.append(found is not None)
        return found

    monkeypatch.setattr(hf_backend_module, "read_kept", spied)
    fresh = HFBackend.default(device="cpu")  # read from the GGUF file, and kept
    (kept,) = (tmp_path / "converted").iterdir()
    again = HFBackend.default(device="cpu")  # read from the kept folder
    assert read == [False, True] and (kept / "model.safetensors").is_file()
    # named as the GGUF's reading is, so a wrapper of the model (a pipeline) finds its file
    assert again.model.config._name_or_path == fresh.model.config._name_or_path
    assert again.model_id == fresh.model_id == EMBEDDED_MODEL_ID
    assert HFBackend(again.model, again.tokenizer).model_id == EMBEDDED_MODEL_ID
    assert again.model_sha256 == fresh.model_sha256 is not None
    question = "Was ist die Hauptstadt von Frankreich? ½ 日本"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    texts = [b.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
             for b in (fresh, again)]  # fmt: skip
    assert texts[0] == texts[1]
    ids = [b.tokenizer(texts[0], add_special_tokens=False)["input_ids"] for b in (fresh, again)]
    assert ids[0] == ids[1]
    with torch.no_grad():
        logits = [b.model(torch.tensor([ids[0]])).logits for b in (fresh, again)]
    assert torch.equal(logits[0], logits[1])
    assert again.tokenizer.eos_token_id == fresh.tokenizer.eos_token_id
