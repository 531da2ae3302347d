"""RAG on the embedded model: with_prompt over SQuAD 2.0 passages, and the CLI on a slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from typer.testing import CliRunner

from esi_guard import ESIGuard, HFBackend
from esi_guard.backends.hf._force import Rendered, _shared, pack
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.file import ThresholdFile
from esi_guard.calibration.prompts import RAG_TEMPLATE
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def passages(shared_data: Path) -> list[Example]:
    """Three SQuAD 2.0 questions on three different passages."""
    seen: dict[str, Example] = {}
    for example in load_examples(shared_data / "squad2" / "dev.json", seed=0):
        assert example.context is not None
        seen.setdefault(example.context, example)
        if len(seen) == 3:
            break
    return list(seen.values())


def test_a_retrieval_chain_guarded_with_prompt(
    hf_backend: HFBackend, passages: list[Example]
) -> None:
    guard = ESIGuard(backend=hf_backend, threshold=0.3, n_variants=4, max_new_tokens=12)
    prompt = ChatPromptTemplate.from_messages([("human", RAG_TEMPLATE)])
    contexts = {e.question: e.context for e in passages}
    retriever = lambda question: contexts[question]  # noqa: E731  (a retriever's stand-in)
    rag = (
        {"context": retriever, "question": RunnablePassthrough()}
        | guard.with_prompt(prompt)
    )  # fmt: skip
    messages = rag.batch([e.question for e in passages])
    for example, message in zip(passages, messages, strict=True):
        esi = message.response_metadata["esi"]
        assert esi["scored"] and esi["score"] >= 0 and "context_reliance" not in esi
        assert all(len(v) < len(example.question) + 5 for v in esi["variants"])  # the question
    text = (rag | StrOutputParser()).invoke(passages[0].question)
    assert text == messages[0].content


def test_context_first_variants_share_the_passage_prefix(
    hf_backend: HFBackend, passages: list[Example], monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = ChatPromptTemplate.from_messages([("human", RAG_TEMPLATE)])
    guard = ESIGuard(backend=hf_backend, threshold=0.3, n_variants=4, max_new_tokens=8)
    requests = []
    original = hf_backend.teacher_force

    def recording(batch, *, top_k):  # type: ignore[no-untyped-def]
        requests.extend(batch)
        return original(batch, top_k=top_k)

    monkeypatch.setattr(hf_backend, "teacher_force", recording)
    guard.with_prompt(prompt).batch([{"context": e.context, "question": e.question}
                                     for e in passages])  # fmt: skip
    rendered = [Rendered(i, r, [hf_backend.render(v) for v in r.variants])
                for i, r in enumerate(requests)]  # fmt: skip
    groups = pack(rendered, hf_backend.max_batch_rows)
    assert len(groups) == len(passages)  # one pass per passage, not one padded pass
    for group, example in zip(groups, passages, strict=True):
        assert example.context is not None
        head = RAG_TEMPLATE.split("{context}")[0] + example.context
        passage_end = len(hf_backend.render([{"role": "user", "content": head}])) - 8
        rows = [row for item in group for row in item.rows]
        assert _shared(rows, reuse=True) >= passage_end  # the passage is computed once


def test_cli_calibrates_on_a_squad_slice(
    tmp_path: Path, shared_data: Path, hf_backend: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "backend", lambda *args: hf_backend)
    runner = CliRunner()
    data = shared_data / "squad2" / "dev.json"
    out, cache = tmp_path / "threshold.json", tmp_path / "run.jsonl"
    common = ["--data", str(data), "--limit", "20", "--seed", "0", "--cache", str(cache),
              "--n-variants", "4", "--max-new-tokens", "12", "--resamples", "100",
              "--top-k", "20"]  # fmt: skip
    result = runner.invoke(
        cli_module.app,
        ["calibrate", *common, "--select", "coverage", "--coverage", "0.7", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "answerable:" in result.output and "unanswerable (declined):" in result.output
    written = ThresholdFile.read(out)
    assert written.scoring.prompt_template == RAG_TEMPLATE
    assert written.scoring.system_prompt is None and written.label_method.startswith("declines+")
    records = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    assert len(records) == 20 and {r["answerable"] for r in records} == {True, False}
    assert not any("context_reliance" in r for r in records)  # retired in 0.2.0: no extra row
    # The threshold file drives a guard on the same template.
    guard = ESIGuard.from_calibration(out, backend=hf_backend)
    assert guard.threshold == written.threshold

    # A template without {context} for data with passages: a clear error.
    bad = tmp_path / "bad.txt"
    bad.write_text("Answer: {question}")
    refused = runner.invoke(
        cli_module.app, ["calibrate", *common, "--prompt", str(bad), "--out", str(out)]
    )
    assert refused.exit_code == 2 and "no {context} variable" in refused.output
