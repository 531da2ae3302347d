"""How the CLI builds the local model it scores with: the options reach the backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import esi_guard.served
from esi_guard import ConfigurationError, FakeBackend
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module


@pytest.fixture
def loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``tmp_path/qa.jsonl`` (12 questions, half answered right), the working folder, loads."""
    rows = [{"question": f"Which city is number {i} on the list?", "answer": f"city{i}"}
            for i in range(12)]  # fmt: skip
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = {r["question"]: r["answer"] for r in rows[::2]}  # calibrate refuses one kind
    recorded: list[dict[str, Any]] = []

    def local_backend(model: str, **kwargs: Any) -> FakeBackend:
        recorded.append({"model": model, **kwargs})
        return FakeBackend(answers)

    monkeypatch.setattr(esi_guard.served, "local_backend", local_backend)
    monkeypatch.chdir(tmp_path)  # where the default caches go
    return recorded


def test_calibrate_and_evaluate_load_the_model_with_the_dtype_given(
    tmp_path: Path, loads: list[dict[str, Any]]
) -> None:
    data = tmp_path / "qa.jsonl"
    out = tmp_path / "threshold.json"
    runner = CliRunner()
    common = ["--data", str(data), "--resamples", "20", "--dtype", "bfloat16"]
    result = runner.invoke(cli_module.app, [
        "calibrate", *common, "--n-variants", "2", "--select", "coverage", "--coverage", "0.5",
        "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    evaluated = runner.invoke(cli_module.app, ["evaluate", "--threshold", str(out), *common])
    assert evaluated.exit_code == 0, evaluated.output
    assert [(x["model"], x["dtype"], x["engine"]) for x in loads] == [
        ("default", "bfloat16", None)  # None: the guard's own choice (auto)
    ] * 2
    named = runner.invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--resamples", "20", "--backend", "transformers",
        "--n-variants", "2", "--select", "coverage", "--out", str(out),
    ])  # fmt: skip
    assert named.exit_code == 0, named.output
    assert loads[-1]["engine"] == "transformers" and loads[-1]["dtype"] is None


def test_threads_reach_the_local_model_and_leave_the_run_the_same(
    tmp_path: Path, loads: list[dict[str, Any]]
) -> None:
    data = tmp_path / "qa.jsonl"
    runner = CliRunner()
    common = ["--data", str(data), "--resamples", "20", "--n-variants", "2",
              "--select", "coverage"]  # fmt: skip
    first = runner.invoke(cli_module.app, ["calibrate", *common, "--threads", "1",
                                           "--out", "a.json"])  # fmt: skip
    assert first.exit_code == 0, first.output
    assert [x["n_threads"] for x in loads] == [1]
    # Other threads, the same run: the complete cache is found, no model loaded.
    again = runner.invoke(cli_module.app, ["calibrate", *common, "--threads", "2",
                                           "--out", "b.json"])  # fmt: skip
    assert again.exit_code == 0, again.output
    assert "no model loaded" in again.stdout and len(loads) == 1
    assert len(list(tmp_path.glob("esi-cache-qa-*.jsonl"))) == 1
    evaluated = runner.invoke(cli_module.app, [
        "evaluate", "--threshold", "a.json", "--data", str(data), "--resamples", "20",
        "--threads", "3", "--cache", "e.jsonl",
    ])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert loads[-1]["n_threads"] == 3
    unthreaded = runner.invoke(cli_module.app, ["calibrate", *common, "--out", "c.json",
                                                "--cache", "c.jsonl"])  # fmt: skip
    assert unthreaded.exit_code == 0 and loads[-1]["n_threads"] is None


@pytest.mark.parametrize(
    "args",
    [
        ["calibrate", "--out", "t.json", "--api-base", "http://localhost:8080/v1"],
        ["evaluate", "--threshold", "t.json", "--api-base", "http://localhost:8080/v1"],
    ],
)
def test_threads_with_a_server_end_the_command_at_once(tmp_path: Path, args: list[str]) -> None:
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "q?", "answer": "a"}) + "\n")
    result = CliRunner().invoke(cli_module.app, [*args, "--data", str(data), "--threads", "1"])
    assert result.exit_code == 2
    assert "--threads sets the CPU threads of a model run here" in " ".join(result.stderr.split())


def test_distill_and_serve_load_the_local_model_with_the_threads_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fastapi")
    loads: list[dict[str, Any]] = []

    def local_backend(model: str, **kwargs: Any) -> FakeBackend:
        loads.append(kwargs)
        raise ConfigurationError("stop here")  # the command ends, naming it

    monkeypatch.setattr(esi_guard.served, "local_backend", local_backend)  # distill's, serve's
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "q?"}) + "\n")
    runner = CliRunner()
    distilled = runner.invoke(cli_module.app, ["distill", "--data", str(data), "--out", "p.json",
                                               "--threads", "1"])  # fmt: skip
    served = runner.invoke(cli_module.app, ["serve", "--threads", "2"])
    assert (distilled.exit_code, served.exit_code) == (2, 2)
    assert "stop here" in distilled.stderr and "stop here" in served.stderr
    assert [x["n_threads"] for x in loads] == [1, 2]
    upstream = runner.invoke(cli_module.app, [
        "serve", "--upstream", "http://localhost:8080/v1", "--upstream-model", "m",
        "--threads", "1",
    ])  # fmt: skip
    assert upstream.exit_code == 2 and "--upstream" in upstream.stderr and len(loads) == 2


def test_a_server_is_asked_with_the_chat_template_given(tmp_path: Path) -> None:
    # Echo mode renders the prompt itself: calibrate must render it as serve --upstream does.
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    options = build.ModelOptions(model="my-model", api_base="http://127.0.0.1:9/v1",
                                 api_mode="echo", chat_template=str(template))  # fmt: skip
    chosen = build.backend(options)  # was: echo mode needs the chat template (it was not sent)
    served = (
        esi_guard.served.GuardOptions(
            upstream="http://127.0.0.1:9/v1",
            upstream_model="my-model",
            upstream_mode="echo",
            chat_template=str(template),
            threshold="0.3",
        )
        .build()
        .backend
    )
    prompt = [{"role": "user", "content": "Which planet is red?"}]
    rendered = [b.template.render(prompt) for b in (chosen, served)]  # type: ignore[attr-defined]
    assert rendered == ["Which planet is red?\n"] * 2
