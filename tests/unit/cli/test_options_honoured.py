"""Options the CLI accepted and then ignored, honoured otherwise, or answered with a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import esi_guard.served
from esi_guard import ConfigurationError, FakeBackend
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module


@pytest.fixture
def loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``tmp_path/qa.jsonl`` (40 questions, half answered right), the working folder, loads."""
    rows = [{"question": f"Which city is number {i} on the list?", "answer": f"city{i}"}
            for i in range(40)]  # fmt: skip
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = {r["question"]: r["answer"] for r in rows[::2]}
    recorded: list[dict[str, Any]] = []

    def local_backend(model: str, **kwargs: Any) -> FakeBackend:
        recorded.append({"model": model, **kwargs})
        return FakeBackend(answers)

    monkeypatch.setattr(esi_guard.served, "local_backend", local_backend)
    monkeypatch.chdir(tmp_path)
    return recorded


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli_module.app, list(args))


def flat(text: str) -> str:
    return " ".join(text.split())


CALIBRATE = ("calibrate", "--data", "qa.jsonl", "--n-variants", "2", "--resamples", "20",
             "--select", "coverage")  # fmt: skip


def test_a_cache_scored_under_another_chat_template_or_dtype_is_not_continued(
    tmp_path: Path, loads: list[dict[str, Any]]
) -> None:
    (tmp_path / "a.jinja").write_text("{% for m in messages %}A {{ m['content'] }}\n{% endfor %}")
    (tmp_path / "b.jinja").write_text("{% for m in messages %}B {{ m['content'] }}\n{% endfor %}")
    first = invoke(*CALIBRATE, "--chat-template", "a.jinja", "--cache", "c.jsonl",
                   "--out", "a.json")  # fmt: skip
    assert first.exit_code == 0, first.output
    cut = (tmp_path / "c.jsonl").read_text().splitlines()[:6]  # a kill after 5 answers
    (tmp_path / "c.jsonl").write_text("\n".join(cut) + "\n")
    for other in (["--chat-template", "b.jinja"], ["--chat-template", "a.jinja",
                                                   "--dtype", "bfloat16"]):  # fmt: skip
        again = invoke(*CALIBRATE, *other, "--cache", "c.jsonl", "--out", "b.json")
        assert again.exit_code == 2, again.output  # was 0: A's answers kept under B's run
        assert "another run" in flat(again.stderr)
    same = invoke(*CALIBRATE, "--chat-template", "a.jinja", "--cache", "c.jsonl",
                  "--out", "a.json")  # fmt: skip
    assert same.exit_code == 0, same.output  # the same run resumes


@pytest.mark.parametrize(
    ("option", "value"),
    [("--batch-size", "0"), ("--batch-size", "-1"), ("--limit", "0"), ("--limit", "-3")],
)
def test_counts_below_one_are_refused_by_name(
    loads: list[dict[str, Any]], option: str, value: str
) -> None:
    # --batch-size 0 was a ValueError traceback from range(), -1 a KeyError; --limit 0 used
    # every example and --limit -3 all but the last 3 (recorded as limit -3).
    result = invoke(*CALIBRATE, "--out", "t.json", option, value)
    assert result.exit_code == 2, result.output
    assert option in result.output and loads == []


def test_distill_refuses_fewer_than_two_folds_before_scoring(loads: list[dict[str, Any]]) -> None:
    result = invoke("distill", "--data", "qa.jsonl", "--out", "p.json", "--folds", "1")
    assert result.exit_code == 2, result.output  # was sklearn's ValueError after scoring
    assert "--folds" in result.output and loads == []


@pytest.mark.parametrize("where", ["missing/t.json", "folder"])
def test_an_out_path_that_cannot_be_written_ends_the_command_before_scoring(
    tmp_path: Path, loads: list[dict[str, Any]], where: str
) -> None:
    (tmp_path / "folder").mkdir()
    result = invoke(*CALIBRATE, "--out", where)
    assert result.exit_code == 2, result.output  # was a traceback once every answer was scored
    assert f"--out {where}" in flat(result.stderr) and loads == []
    plot = invoke(*CALIBRATE, "--out", "t.json", "--plot", where)
    assert plot.exit_code == 2 and f"--plot {where}" in flat(plot.stderr) and loads == []
    probe = invoke("distill", "--data", "qa.jsonl", "--out", where)
    assert probe.exit_code == 2 and f"--out {where}" in flat(probe.stderr) and loads == []


def test_a_cache_path_that_is_a_folder_is_named(
    tmp_path: Path, loads: list[dict[str, Any]]
) -> None:
    (tmp_path / "folder").mkdir()
    result = invoke(*CALIBRATE, "--out", "t.json", "--cache", "folder")
    assert result.exit_code == 2, result.output  # was IsADirectoryError
    assert "--cache folder" in flat(result.stderr)


@pytest.mark.parametrize("judge", ["json:no_such_model", "no_such_module_x:model"])
def test_a_judge_that_cannot_be_imported_is_named(loads: list[dict[str, Any]], judge: str) -> None:
    result = invoke(*CALIBRATE, "--out", "t.json", "--labels", "judge", "--judge", judge)
    assert result.exit_code == 2, result.output  # was AttributeError / an unnamed import error
    assert f"--judge {judge}" in flat(result.output) and loads == []


@pytest.mark.parametrize(
    "extra",
    [["--plot", "p.png"], ["--cascade"], ["--features", "esi,nll"], ["--fit-fraction", "0.5"]],
)
def test_sentence_granularity_refuses_what_it_would_ignore(
    loads: list[dict[str, Any]], extra: list[str]
) -> None:
    result = invoke(*CALIBRATE, "--out", "t.json", "--granularity", "sentence", *extra)
    assert result.exit_code == 2, result.output  # was 0, the option ignored
    assert extra[0] in flat(result.stderr) and loads == []


@pytest.mark.parametrize(
    ("given", "option"),
    [(["--dtype", "bfloat16"], "--dtype"), (["--device", "cuda"], "--device"),
     (["--backend", "llamacpp"], "--backend")],
)  # fmt: skip
def test_local_model_options_with_a_server_end_the_command_at_once(
    loads: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, given: list[str], option: str
) -> None:
    built: list[Any] = []
    monkeypatch.setattr(build, "backend", lambda *args: built.append(args) or FakeBackend({}))
    server = ["--api-base", "http://127.0.0.1:9/v1"]
    result = invoke(*CALIBRATE, "--out", "t.json", *server, *given)
    assert result.exit_code == 2, result.output  # was: accepted, the server asked as if absent
    assert option in flat(result.stderr) and built == []
    with pytest.raises(ConfigurationError, match=option):
        esi_guard.served.GuardOptions(upstream="http://127.0.0.1:9/v1", upstream_model="m",
                                      **{option[2:]: given[1]}).check()  # fmt: skip


def test_serve_refuses_a_fallback_it_would_never_ask() -> None:
    for options in ({"fallback_upstream": "http://127.0.0.1:9/v1"},
                    {"fallback_model": "m"}):  # fmt: skip
        with pytest.raises(ConfigurationError, match="--fallback"):
            esi_guard.served.GuardOptions(**options).check()  # was: accepted and never used


def test_the_file_records_no_seed_for_examples_left_in_file_order(
    loads: list[dict[str, Any]],
) -> None:
    from esi_guard.calibration.file import ThresholdFile

    plain = invoke(*CALIBRATE, "--out", "plain.json")
    shuffled = invoke(*CALIBRATE, "--out", "shuffled.json", "--seed", "0")
    assert plain.exit_code == 0 and shuffled.exit_code == 0, plain.output + shuffled.output
    a, b = ThresholdFile.read("plain.json"), ThresholdFile.read("shuffled.json")
    assert a.dataset.sha256 != b.dataset.sha256  # --seed 0 shuffles: another sample
    assert (a.dataset.seed, b.dataset.seed) == (None, 0)  # was (0, 0)
