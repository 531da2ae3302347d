"""``esi-guard calibrate`` on a fake backend: formats, several files, reruns from the cache,
labels in the cache, refusals that say what they need, and errors on stderr."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from esi_guard import FakeBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.calibration.thresholds import (
    RiskTest,
    min_accepted,
    min_examples,
    risk_search,
    risk_tests,
)
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS

DIGEST = "ab" * 32


class DigestBackend(FakeBackend):
    """A fake backend that knows its weights' digest, as a GGUF-backed one does."""

    @property
    def model_sha256(self) -> str | None:
        return DIGEST


def questions(n: int, prefix: str = "q") -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows of the documented shape, and the fake model's answers (every third wrong)."""
    rows, answers = [], {}
    for i in range(n):
        question = f"Which city is number {i} on list {prefix}?"
        rows.append({"question": question, "answers": [f"city{i}"], "wrong": ["Atlantis"]})
        answers[question] = f"city{i}" if i % 3 else "Atlantis"
    return rows, answers


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[FakeBackend]:
    """Every model the CLI loads (answers for lists 'q' and 'r')."""
    answers = {**questions(60, "q")[1], **questions(60, "r")[1]}
    loaded: list[FakeBackend] = []

    def backend(*args: Any) -> FakeBackend:
        loaded.append(DigestBackend(answers, default_sensitivity=0.5))
        return loaded[-1]

    monkeypatch.setattr(build, "backend", backend)
    return loaded


def flat(text: str) -> str:
    """The text with rich's line wrapping undone."""
    return " ".join(text.split())


def calibrate(*args: str) -> Result:
    options = ["--n-variants", "2", "--resamples", "20"]
    return CliRunner().invoke(cli_module.app, ["calibrate", *options, *args])


def test_the_documented_shape_needs_no_field_flags_and_the_file_records_the_run(
    tmp_path: Path, loads: list[FakeBackend]
) -> None:
    data = write(tmp_path / "my_qa.jsonl", questions(30)[0])
    out, cache = tmp_path / "t.json", tmp_path / "c.jsonl"
    result = calibrate("--data", str(data), "--select", "coverage", "--out", str(out),
                       "--cache", str(cache))  # fmt: skip
    assert result.exit_code == 0, result.output
    written = ThresholdFile.read(out)
    assert (written.engine, written.model_sha256) == ("fake", DIGEST)
    assert written.scoring.max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert written.dataset.path == str(data) and written.dataset.n == 30
    assert "only 30 scored examples" in flat(result.stderr) and "warning" not in flat(result.stdout)
    header, *records = [json.loads(line) for line in cache.read_text().splitlines()]
    assert header["engine"] == "fake" and header["model_sha256"] == DIGEST
    assert header["request"]["max_new_tokens"] == DEFAULT_MAX_NEW_TOKENS
    assert [r["labels"] for r in records[:3]] == [
        {"containment": False}, {"containment": True}, {"containment": True}
    ]  # fmt: skip


def test_a_rerun_from_a_complete_cache_loads_no_model(
    tmp_path: Path, loads: list[FakeBackend]
) -> None:
    data = write(tmp_path / "qa.jsonl", questions(40)[0])
    cache = tmp_path / "c.jsonl"
    common = ["--data", str(data), "--cache", str(cache)]
    first = calibrate(*common, "--select", "coverage", "--out", str(tmp_path / "a.json"))
    assert first.exit_code == 0, first.output
    assert len(loads) == 1
    again = calibrate(*common, "--select", "f1", "--labels", "exact",
                      "--out", str(tmp_path / "b.json"))  # fmt: skip
    assert again.exit_code == 0, again.output
    assert len(loads) == 1 and "no model loaded" in flat(again.stdout)
    a, b = ThresholdFile.read(tmp_path / "a.json"), ThresholdFile.read(tmp_path / "b.json")
    assert (b.model, b.engine, b.model_sha256, b.scoring) == (
        a.model, a.engine, a.model_sha256, a.scoring)  # fmt: skip
    records = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    assert set(records[1]["labels"]) == {"containment", "exact_match"}  # both kept
    # Other scoring options: the model is loaded, and the cache refused as another run's.
    clash = calibrate(*common, "--top-k", "10", "--out", str(tmp_path / "c.json"))
    assert clash.exit_code == 2 and "another run" in flat(clash.stderr)
    assert len(loads) == 2


def test_a_cache_from_an_older_version_is_refused_by_name(
    tmp_path: Path, loads: list[FakeBackend]
) -> None:
    data = write(tmp_path / "qa.jsonl", questions(5)[0])
    cache = tmp_path / "old.jsonl"
    cache.write_text(json.dumps({"kind": "esi-guard/calibration-cache", "model": "m"}) + "\n")
    result = calibrate("--data", str(data), "--cache", str(cache), "--out", str(tmp_path / "t"))
    assert result.exit_code == 2 and "older esi-guard" in flat(result.stderr)


def test_several_data_files_are_concatenated_each_limited(
    tmp_path: Path, loads: list[FakeBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default cache goes
    first = write(tmp_path / "a.jsonl", questions(60, "q")[0])
    second = write(tmp_path / "b.jsonl", questions(60, "r")[0])
    out = tmp_path / "t.json"
    result = calibrate("--data", str(first), "--data", str(second), "--limit", "50",
                       "--select", "coverage", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    written = ThresholdFile.read(out)
    assert written.dataset.path == f"{first}, {second}" and written.dataset.n == 100
    assert "a.jsonl + b.jsonl" in flat(result.stdout)
    assert "warning" not in flat(result.stderr)  # 100 examples: not a small set
    assert len(list(tmp_path.glob("esi-cache-a+b-*.jsonl"))) == 1  # named by both files


def best_test(cache: Path, alpha: float, delta: float) -> RiskTest:
    """The tested threshold with the lowest bound, from the scores and labels in the cache."""
    records = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    scores = [r["score"] for r in records]
    wrong = [int(not r["labels"]["containment"]) for r in records]
    return min(risk_search(scores, wrong, alpha, delta), key=lambda t: (t.bound, -t.accepted))


def test_a_risk_target_out_of_reach_says_what_it_needs_and_still_plots(
    tmp_path: Path, loads: list[FakeBackend]
) -> None:
    data = write(tmp_path / "qa.jsonl", questions(12)[0])
    out, plot, cache = tmp_path / "t.json", tmp_path / "cal.png", tmp_path / "c.jsonl"
    result = calibrate("--data", str(data), "--select", "risk", "--alpha", "0.2",
                       "--out", str(out), "--plot", str(plot),
                       "--cache", str(cache))  # fmt: skip
    assert result.exit_code == 1
    assert "no threshold can qualify" in flat(result.stderr)  # warned before choosing
    best = best_test(cache, 0.2, 0.1)
    assert (
        f"the best bound is {best.bound:.3f} at {best.accepted} accepted ({best.errors} wrong"
        in flat(result.stderr)
    )
    assert (
        "12 examples are too few: even with none wrong the rule needs at least "
        f"{min_examples(0.2, 0.1)}, as its search tests the median score first"
    ) in flat(result.stderr)
    assert not out.exists() and plot.stat().st_size > 10_000
    assert "no threshold line" in flat(result.stdout)


def test_a_refused_risk_target_names_the_bound_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, answers = questions(75)  # a third wrong: no threshold gets its bound to 0.2
    monkeypatch.setattr(build, "backend", lambda *a: FakeBackend(answers))
    data, cache = write(tmp_path / "qa.jsonl", rows), tmp_path / "c.jsonl"
    result = calibrate("--data", str(data), "--alpha", "0.2", "--delta", "0.1",
                       "--out", str(tmp_path / "t.json"), "--cache", str(cache))  # fmt: skip
    assert result.exit_code == 1, result.output
    message = flat(result.stderr)
    best = best_test(cache, 0.2, 0.1)
    assert best.accepted >= min_accepted(0.2, 0.1, risk_tests(75)) and best.bound > 0.2
    assert (
        "no threshold keeps the upper confidence bound of the accepted error rate at or below "
        f"alpha=0.2 with delta=0.1 on these 75 examples: the best bound is {best.bound:.3f} "
        f"at {best.accepted} accepted ({best.errors} wrong, error rate "
        f"{best.errors / best.accepted:.3f})"
    ) in message
    assert "needs at least" not in message and "no threshold file written" in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "1.5"], "--alpha and --delta must be in (0, 1)"),
        (["--select", "coverage", "--coverage", "0"], "--coverage must be in (0, 1]"),
        (["--chat-template", "missing.jinja"], "cannot read the chat template"),
    ],
)
def test_bad_options_fail_on_stderr_before_loading(
    tmp_path: Path, loads: list[FakeBackend], args: list[str], message: str
) -> None:
    data = write(tmp_path / "qa.jsonl", questions(5)[0])
    result = calibrate("--data", str(data), "--out", str(tmp_path / "t.json"), *args)
    assert result.exit_code == 2 and message in flat(result.stderr) and result.stdout == ""
    assert loads == []


def test_data_errors_go_to_stderr_with_code_2(tmp_path: Path, loads: list[FakeBackend]) -> None:
    odd = write(tmp_path / "odd.jsonl", [{"prompt": "q", "gold": "a"}])
    result = calibrate("--data", str(odd), "--out", str(tmp_path / "t.json"))
    assert result.exit_code == 2 and result.stdout == ""
    assert "error: unknown format (fields ['gold', 'prompt'])" in flat(result.stderr)


def test_csv_answers_are_split_on_the_separator_given(
    tmp_path: Path, loads: list[FakeBackend]
) -> None:
    data = tmp_path / "qa.csv"
    data.write_text("q,a\nHow many legs has a spider?,8|eight\n", encoding="utf-8")
    cache = tmp_path / "c.jsonl"
    common = ["--data", str(data), "--question-field", "q", "--answers-field", "a",
              "--select", "coverage", "--out", str(tmp_path / "t.json")]  # fmt: skip
    result = calibrate(*common, "--answers-sep", "|", "--cache", str(cache))
    assert result.exit_code == 0, result.output
    assert json.loads(cache.read_text().splitlines()[1])["answers"] == ["8", "eight"]


def test_the_command_silences_other_libraries_progress_bars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environment = {k: v for k, v in os.environ.items() if k not in cli_module.QUIET}
    environment["TQDM_DISABLE"] = "0"  # the user's own choice stands
    monkeypatch.setattr(os, "environ", environment)
    monkeypatch.setattr(sys, "argv", ["esi-guard", "--help"])
    with pytest.raises(SystemExit) as exited:
        cli_module.main()
    assert exited.value.code == 0
    assert environment["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert environment["TQDM_DISABLE"] == "0"


def test_a_missing_extra_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def backend(*args: Any) -> FakeBackend:
        raise ImportError("LlamaCppBackend needs llama-cpp-python: pip install esi-guard[llamacpp]")

    monkeypatch.setattr(build, "backend", backend)
    data = write(tmp_path / "qa.jsonl", questions(5)[0])
    result = calibrate("--data", str(data), "--out", str(tmp_path / "t.json"),
                       "--cache", str(tmp_path / "c.jsonl"))  # fmt: skip
    assert result.exit_code == 2 and "pip install esi-guard[llamacpp]" in flat(result.stderr)


@pytest.mark.parametrize(
    ("command", "args", "hidden"),
    [
        ("calibrate", [], "scipy"),
        ("calibrate", ["--plot", "cal.png"], "matplotlib"),
        ("calibrate", ["--score", "combined"], "sklearn"),
        ("calibrate", ["--labels", "semantic"], "sentence_transformers"),
        ("evaluate", ["--threshold", "t.json"], "scipy"),
        ("distill", [], "sklearn"),
    ],
)
def test_a_missing_cli_extra_ends_the_command_before_any_model_loads(
    tmp_path: Path,
    loads: list[FakeBackend],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    args: list[str],
    hidden: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, hidden, None)  # as if it were not installed
    data = write(tmp_path / "qa.jsonl", questions(5)[0])
    out = [] if command == "evaluate" else ["--out", "out.json"]
    result = CliRunner().invoke(cli_module.app, [command, "--data", str(data), *out, *args])
    assert result.exit_code == 2, result.output
    assert flat(result.stderr) == (
        f"error: esi-guard {command} needs the cli extra: pip install 'esi-guard[cli]' "
        f"(no module named '{hidden}')"
    )
    assert loads == [] and result.stdout == ""
