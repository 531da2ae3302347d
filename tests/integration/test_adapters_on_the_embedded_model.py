"""The guard around the model objects LangChain users already hold, on the real embedded model."""

from __future__ import annotations

import pytest
from langchain_core.prompts import ChatPromptTemplate
from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline

from esi_guard import ESIGuard, HFBackend, LlamaCppBackend
from esi_guard.backends.default import EmbeddedBackend

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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


@pytest.mark.parametrize("wrapper", ["pipeline", "HuggingFacePipeline", "ChatHuggingFace"])
def test_a_users_pipeline_is_guarded_on_the_same_weights_with_the_same_scores(
    hf_backend: HFBackend, sciq_questions: list[str], wrapper: str
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
    reference = ESIGuard(backend=hf_backend, threshold=0.3, max_new_tokens=24)
    assert isinstance(guarded.backend, HFBackend)
    assert guarded.backend.model is hf_backend.model  # the same weights, loaded once
    inputs = prompts(sciq_questions[:5])
    for ours, theirs in zip(guarded.batch(inputs), reference.batch(inputs), strict=True):
        a, b = ours.response_metadata["esi"], theirs.response_metadata["esi"]
        assert ours.content == theirs.content and a["answer_token_ids"] == b["answer_token_ids"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-9)
