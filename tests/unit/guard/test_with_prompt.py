"""ESIGuard.with_prompt: only the question variable of a RAG template is intervened on."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate

from esi_guard import (
    ConfigurationError,
    ESIGuard,
    FakeBackend,
    InputError,
    WholeMessageWarning,
)
from esi_guard.backends import ForcingRequest
from esi_guard.calibration.file import ThresholdFile
from esi_guard.guard import TemplatedPrompt

RAG = (
    "You are an assistant for question-answering tasks. Use the following pieces of retrieved "
    "context to answer the question. If you don't know the answer, just say that you don't "
    "know.\nContext: {context}\nQuestion: {question}\nAnswer:"
)
CONTEXT = (
    "Mesophiles grow best in moderate temperature, typically between 25 and 40 degrees "
    "Celsius. They are often found living in or on the bodies of humans or other animals."
)
QUESTION = "What type of organism grows best at moderate temperature?"
VALUES = {"context": CONTEXT, "question": QUESTION}


class Recording(FakeBackend):
    """A fake backend that keeps every forcing request it gets."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(default_answer="Mesophiles", default_sensitivity=1.0, **kwargs)
        self.requests: list[ForcingRequest] = []

    def teacher_force(self, requests: Any, *, top_k: int) -> Any:
        self.requests += list(requests)
        return super().teacher_force(requests, top_k=top_k)


def guard(**kwargs: Any) -> ESIGuard:
    return ESIGuard(**{"backend": Recording(), "threshold": 0.5, **kwargs})


def test_only_the_question_changes_in_every_row() -> None:
    the_guard = guard()
    prompt = ChatPromptTemplate.from_messages([("human", RAG)])
    message = the_guard.with_prompt(prompt).invoke(VALUES)
    esi = message.response_metadata["esi"]
    assert esi["scored"] and "context_reliance" not in esi
    original = RAG.format(**VALUES)
    before, after = original.split(QUESTION)
    (request,) = the_guard.backend.requests  # type: ignore[attr-defined]
    assert request.prompt[-1]["content"] == original
    rows = [variant[-1]["content"] for variant in request.variants]
    assert rows and len(rows) == len(set(esi["variants"]) - {QUESTION})
    for row in rows:
        assert row.startswith(before) and row.endswith(after)  # byte-identical outside
        assert row[len(before) : len(row) - len(after)] in esi["variants"]


def test_a_string_template_and_a_question_before_the_context() -> None:
    the_guard = guard()
    template = "Question: {question}\n\nPassage: {context}\n\nAnswer in a few words."
    the_guard.with_prompt(PromptTemplate.from_template(template)).invoke(VALUES)
    original = template.format(**VALUES)
    before, after = original.split(QUESTION)
    (request,) = the_guard.backend.requests  # type: ignore[attr-defined]
    for variant in request.variants:
        row = variant[-1]["content"]
        assert row.startswith(before) and row.endswith(after)


def test_context_in_the_system_message_gives_todays_variants() -> None:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from this context: {context}"), ("human", "{question}")]
    )
    templated, plain = guard(), guard()
    by_template = templated.with_prompt(prompt).invoke(VALUES).response_metadata["esi"]
    by_chain = (prompt | plain).invoke(VALUES).response_metadata["esi"]
    assert by_template["variants"] == by_chain["variants"]
    assert by_template["score"] == by_chain["score"]
    assert templated.backend.requests == plain.backend.requests  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["batch", "abatch", "ainvoke", "stream", "astream"])
def test_every_entry_point_scores_the_same(mode: str) -> None:
    prompt = ChatPromptTemplate.from_messages([("human", RAG)])
    expected = guard().with_prompt(prompt).invoke(VALUES)
    chain = guard().with_prompt(prompt)
    if mode == "batch":
        message = chain.batch([VALUES, VALUES])[1]
    elif mode == "abatch":
        message = asyncio.run(chain.abatch([VALUES]))[0]
    elif mode == "ainvoke":
        message = asyncio.run(chain.ainvoke(VALUES))
    elif mode == "stream":
        message = list(chain.stream(VALUES))[-1]
    else:

        async def last() -> Any:
            return [chunk async for chunk in chain.astream(VALUES)][-1]

        message = asyncio.run(last())
    got, want = message.response_metadata["esi"], expected.response_metadata["esi"]
    assert got["variants"] == want["variants"] and got["score"] == want["score"]


def test_bad_keys_and_inputs() -> None:
    prompt = ChatPromptTemplate.from_messages([("human", RAG)])
    with pytest.raises(ConfigurationError, match=r"'query'.*\['context', 'question'\]"):
        guard().with_prompt(prompt, question_key="query")
    chain = guard().with_prompt(prompt)
    with pytest.raises(InputError, match="'question'"):
        chain.invoke({"context": CONTEXT})
    with pytest.raises(InputError, match="'question'"):
        chain.invoke({"context": CONTEXT, "question": "  "})
    with pytest.raises(InputError, match="dict"):
        chain.invoke(QUESTION)  # type: ignore[arg-type]
    with pytest.raises(KeyError):  # the prompt's own error for its other variables
        chain.invoke({"question": QUESTION})


def test_a_long_whole_message_warns_once_per_guard() -> None:
    the_guard = guard()
    message = RAG.format(**VALUES) * 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        the_guard.invoke(message)
        the_guard.invoke(message)
        the_guard.batch([message, message])
        the_guard.with_prompt(ChatPromptTemplate.from_messages([("human", RAG)])).invoke(VALUES)
        guard().invoke(QUESTION)  # short: no warning
    warned = [w for w in caught if issubclass(w.category, WholeMessageWarning)]
    assert len(warned) == 1 and "with_prompt" in str(warned[0].message)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        guard().invoke(message)  # another guard warns again
    assert [w.category for w in again] == [WholeMessageWarning]


# -- context reliance, retired in 0.2.0 ---------------------------------------------------


@pytest.mark.parametrize("by", ["with_prompt", "calibrate"])
def test_a_rag_prompt_forces_no_row_beyond_its_variants(by: str) -> None:
    the_guard = guard()
    if by == "with_prompt":
        prompt = ChatPromptTemplate.from_messages([("human", RAG)])
        message = the_guard.with_prompt(prompt, question_key="question").invoke(VALUES)
        esi = message.response_metadata["esi"]
    else:  # how `esi-guard calibrate` asks a question with its passage
        from esi_guard.cli.run.score import renderer_for

        (result,) = the_guard.assess([renderer_for(None, RAG).render(VALUES)])
        esi = result.as_dict()
    (request,) = the_guard.backend.requests  # type: ignore[attr-defined]
    changed = len(set(esi["variants"]) - {QUESTION})
    assert len(request.variants) == changed
    assert esi["work"]["forced_variants"] == changed + int(request.include_original)


def test_deciding_on_context_reliance_is_refused_with_its_release() -> None:
    with pytest.raises(
        ConfigurationError, match=r"^ESIGuard: decide_on='context_reliance'.*0\.2\.0"
    ):
        guard(decide_on="context_reliance")


def test_context_key_is_refused_with_its_release() -> None:
    prompt = ChatPromptTemplate.from_messages([("human", RAG)])
    with pytest.raises(ConfigurationError, match=r"^with_prompt: .*context_key.*0\.2\.0"):
        guard().with_prompt(prompt, context_key="context")
    with pytest.raises(ConfigurationError, match=r"^TemplatedPrompt: .*0\.2\.0"):
        TemplatedPrompt(prompt=prompt, context_key="context")


def test_a_file_deciding_on_context_reliance_is_refused_in_one_line(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "threshold.json"
    threshold_file().write(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["scoring"]["decide_on"] = "context_reliance"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ConfigurationError) as caught:
        ESIGuard.from_calibration(path, backend=Recording())
    message = str(caught.value)
    assert message.startswith(f"threshold file {path}: scoring: decide_on='context_reliance'")
    assert "0.2.0" in message and "\n" not in message
