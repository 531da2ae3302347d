"""A threshold file's prompt: the guard asks under it, and warns once under another."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.prompts import ChatPromptTemplate

from esi_guard import ConfigurationError, ESIGuard, FakeBackend, PromptMismatchWarning
from esi_guard.backends._types import Messages
from esi_guard.calibration.file import ThresholdFile

SYSTEM = "Please directly answer the following question with one or few words."
QUESTION = "What is the capital of Canada?"


class Recording(FakeBackend):
    """The fake backend, keeping every prompt it was asked to answer."""

    def __init__(self) -> None:
        super().__init__({QUESTION: "Ottawa"})
        self.prompts: list[Messages] = []

    def generate(self, prompts: Sequence[Messages], **kwargs: Any) -> Any:
        self.prompts += [list(p) for p in prompts]
        return super().generate(prompts, **kwargs)


def file_under(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile], **prompt: str | None
) -> Path:
    """A threshold file whose questions were asked under ``prompt`` (system, template)."""
    made = threshold_file()
    path = tmp_path / "threshold.json"
    made.model_copy(update={"scoring": made.scoring.model_copy(update=prompt)}).write(path)
    return path


@pytest.fixture
def calibrated(tmp_path: Path, threshold_file: Callable[..., ThresholdFile]) -> Path:
    return file_under(tmp_path, threshold_file, system_prompt=SYSTEM)


@pytest.mark.parametrize("mode", ["invoke", "batch", "stream"])
def test_from_calibration_asks_under_the_files_system_prompt(calibrated: Path, mode: str) -> None:
    backend = Recording()
    guard = ESIGuard.from_calibration(calibrated, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked as calibrated: no warning
        if mode == "invoke":
            message = guard.invoke(QUESTION)
        elif mode == "batch":
            (message,) = guard.batch([QUESTION])
        else:
            (message,) = list(guard.stream(QUESTION))
    assert message.response_metadata["esi"]["scored"]
    assert backend.prompts == [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    ]
    assert backend.calls.count(("generate", 1)) == 1  # batch's item found again by invoke


def test_a_chain_with_the_same_system_message_matches(calibrated: Path) -> None:
    backend = Recording()
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])
    chain = prompt | ESIGuard.from_calibration(calibrated, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chain.invoke({"question": QUESTION})
    assert backend.prompts[0][0] == {"role": "system", "content": SYSTEM}
    assert len(backend.prompts[0]) == 2  # the chain's own, not a second one


def test_a_chain_under_another_system_prompt_warns_once_per_guard(calibrated: Path) -> None:
    backend = Recording()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a helpful assistant."), ("human", "{question}")]
    )
    chain = prompt | ESIGuard.from_calibration(calibrated, backend=backend)
    with pytest.warns(PromptMismatchWarning, match="helpful assistant") as caught:
        chain.invoke({"question": QUESTION})
        chain.invoke({"question": QUESTION})
    assert len(caught) == 1
    assert SYSTEM in str(caught[0].message) and "esi-guard calibrate" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the caller's line
    assert backend.prompts[0][0]["content"] == "You are a helpful assistant."  # the call's wins


def test_another_system_prompt_given_warns_when_the_guard_is_built(calibrated: Path) -> None:
    backend = Recording()
    with pytest.warns(PromptMismatchWarning, match="system_prompt='Be brief.'"):
        guard = ESIGuard.from_calibration(calibrated, backend=backend, system_prompt="Be brief.")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, when built
        guard.invoke(QUESTION)
    assert backend.prompts[0][0] == {"role": "system", "content": "Be brief."}


def test_the_files_template_renders_a_bare_question_and_only_it_is_intervened_on(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    template = "Question: {question}\nAnswer in a few words."
    path = file_under(tmp_path, threshold_file, prompt_template=template)
    backend = Recording()
    guard = ESIGuard.from_calibration(path, backend=backend)
    assert guard.prompt_template == template and guard.system_prompt is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        esi = guard.invoke(QUESTION).response_metadata["esi"]
    assert backend.prompts == [[{"role": "user", "content": template.format(question=QUESTION)}]]
    assert all("Answer in a few words." not in variant for variant in esi["variants"])


def test_a_passage_template_is_left_to_with_prompt_and_a_bare_question_warns(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    template = "Passage: {context}\n\nQuestion: {question}"
    path = file_under(tmp_path, threshold_file, prompt_template=template)
    guard = ESIGuard.from_calibration(path, backend=Recording())
    assert guard.prompt_template is None
    rag = guard.with_prompt(ChatPromptTemplate.from_messages([("human", template)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file's template, any passage
        rag.invoke({"question": QUESTION, "context": "Ottawa is Canada's capital."})
    with pytest.warns(PromptMismatchWarning, match="the template"):
        guard.invoke(QUESTION)


def test_a_template_needs_question_as_its_one_variable() -> None:
    with pytest.raises(ConfigurationError, match="one variable"):
        ESIGuard(backend=FakeBackend(), threshold=0.3, prompt_template="{context} {question}")


def test_a_guard_without_a_file_asks_as_given(calibrated: Path) -> None:
    backend = Recording()
    prompt = ChatPromptTemplate.from_messages([("system", "Anything."), ("human", "{question}")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (prompt | ESIGuard(backend=backend, threshold=0.3)).invoke({"question": QUESTION})
    assert backend.prompts[0][0] == {"role": "system", "content": "Anything."}
