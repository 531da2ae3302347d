"""The guard around the model objects LangChain users already hold, on the real embedded model."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.prompts import ChatPromptTemplate
from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline

from esi_guard import EngineMismatchWarning, ESIGuard, HFBackend, LlamaCppBackend
from esi_guard.backends import embedded_gguf
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID, EmbeddedBackend
from esi_guard.calibration.file import ThresholdFile

# Side by side (pytest -n), on one worker: the module's reference answers computed once.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("adapters")]

SYSTEM = "Please directly answer the following question with one or few words."


def prompts(questions: list[str]) -> list[list[tuple[str, str]]]:
    return [[("system", SYSTEM), ("human", q)] for q in questions]


def test_the_promised_line_runs_as_written() -> None:
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])
    chain = prompt | ESIGuard(threshold=0.3)
    message = chain.invoke({"question": "What is the capital of France?"})
    assert "Paris" in message.content
    assert message.response_metadata["esi"]["scored"]


def test_guards_without_a_model_share_one_loaded_copy() -> None:
    first, second = ESIGuard(threshold=0.3), ESIGuard(threshold=0.5, action="abstain")
    assert isinstance(first.backend, EmbeddedBackend)
    assert isinstance(second.backend, EmbeddedBackend)
    assert first.backend.loaded is second.backend.loaded
    assert isinstance(first.backend.loaded, LlamaCppBackend)  # llama-cpp-python is installed


@pytest.fixture(scope="module")
def reference(hf_backend: HFBackend, sciq_questions: list[str]) -> list[Any]:
    """Five SciQ answers guarded on the session's transformers backend, once for the module."""
    guard = ESIGuard(backend=hf_backend, threshold=0.3, max_new_tokens=24)
    return guard.batch(prompts(sciq_questions[:5]))


@pytest.mark.parametrize("wrapper", ["pipeline", "HuggingFacePipeline", "ChatHuggingFace"])
def test_a_users_pipeline_is_guarded_on_the_same_weights_with_the_same_scores(
    hf_backend: HFBackend, sciq_questions: list[str], wrapper: str, reference: list[Any]
) -> None:
    from transformers import pipeline

    pipe = pipeline("text-generation", model=hf_backend.model, tokenizer=hf_backend.tokenizer)
    llm = {
        "pipeline": pipe,
        "HuggingFacePipeline": HuggingFacePipeline(pipeline=pipe),
        "ChatHuggingFace": ChatHuggingFace(
            llm=HuggingFacePipeline(pipeline=pipe), tokenizer=hf_backend.tokenizer
        ),
    }[wrapper]
    guarded = ESIGuard(llm=llm, threshold=0.3, max_new_tokens=24)
    assert isinstance(guarded.backend, HFBackend)
    assert guarded.backend.model is hf_backend.model  # the same weights, loaded once
    assert guarded.backend.model_id == EMBEDDED_MODEL_ID  # read from the embedded folder
    assert guarded.backend.model_sha256 == hf_backend.model_sha256
    inputs = prompts(sciq_questions[:5])
    for ours, theirs in zip(guarded.batch(inputs), reference, strict=True):
        a, b = ours.response_metadata["esi"], theirs.response_metadata["esi"]
        assert ours.content == theirs.content and a["answer_token_ids"] == b["answer_token_ids"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-9)


def test_the_embedded_weights_have_one_identity_however_loaded(hf_backend: HFBackend) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    llama = llama_cpp.Llama(model_path=str(embedded_gguf()), verbose=False)
    backends = [
        ESIGuard(threshold=0.3).backend,
        ESIGuard(llm=llama, threshold=0.3).backend,
        ESIGuard(llm=str(embedded_gguf()), threshold=0.3).backend,  # llama.cpp: installed
        hf_backend,
    ]
    assert isinstance(backends[2], LlamaCppBackend)
    assert {b.model_id for b in backends} == {EMBEDDED_MODEL_ID}
    assert len({b.model_sha256 for b in backends}) == 1 and backends[0].model_sha256
    assert [b.engine for b in backends[1:]] == ["llamacpp-f16", "llamacpp-f16", "transformers"]


def test_a_file_calibrated_on_transformers_serves_a_llama_with_one_warning(
    hf_backend: HFBackend, tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    """The new user's path: calibrated with the CLI's transformers, served by llama.cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = tmp_path / "threshold.json"
    scoring = threshold_file().scoring.model_copy(
        update={"n_variants": 3, "max_new_tokens": 8, "system_prompt": SYSTEM}
    )  # asked under SYSTEM, as the call below asks
    identity = {"model_sha256": hf_backend.model_sha256, "engine": hf_backend.engine}
    threshold_file(model=hf_backend.model_id, scoring=scoring, **identity).write(path)
    llama = llama_cpp.Llama(model_path=str(embedded_gguf()), verbose=False)
    mismatch = "transformers engine and this guard runs llamacpp"
    with pytest.warns(EngineMismatchWarning, match=mismatch) as caught:
        guard = ESIGuard.from_calibration(path, llm=llama)
    assert len(caught) == 1 and isinstance(guard.backend, LlamaCppBackend)
    assert guard.invoke([("system", SYSTEM), ("human", "What is 2+2?")]).content
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the engine it was calibrated on: silent
        ESIGuard.from_calibration(path, backend=hf_backend)
