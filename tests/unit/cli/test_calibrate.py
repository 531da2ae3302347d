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
    assert result.exit_code == 2 and "1 wrong and 0 right" in flat(result.stderr)  # one answer
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


def test_a_library_warning_reads_as_one_warning_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import warnings

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after
    cli_module.one_line_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # not pytest's "error": shown, as a user sees it
        warnings.warn("No positive samples in y_true", UserWarning, stacklevel=1)
    said = capsys.readouterr()
    assert said.out == "" and flat(said.err) == (
        "warning: UserWarning: No positive samples in y_true"
    )


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


def one_kind(monkeypatch: pytest.MonkeyPatch, n: int, *, right: bool) -> list[dict[str, Any]]:
    """Rows whose every answer is right (or every one wrong) on the fake model."""
    rows, answers = questions(n)
    answers = {q: row["answers"][0] if right else "Atlantis"
               for q, row in zip(answers, rows, strict=True)}  # fmt: skip
    sensitivity = {q: 0.1 + 0.8 * i / n for i, q in enumerate(answers)}  # scores that differ
    monkeypatch.setattr(
        build, "backend", lambda *a: DigestBackend(answers, sensitivity=sensitivity)
    )
    return rows


@pytest.mark.parametrize("right", [True, False], ids=["no-wrong", "no-right"])
@pytest.mark.parametrize(
    "how",
    [
        ["--select", "risk"],
        ["--select", "coverage"],
        ["--select", "f1"],
        ["--select", "youden", "--plot", "cal.png"],
        ["--score", "combined", "--select", "youden"],
        ["--score", "combined", "--fit-fraction", "0.5", "--select", "coverage"],
    ],
    ids=["risk", "coverage", "f1", "youden-plot", "combined", "combined-split"],
)
def test_a_set_of_one_kind_of_answer_is_refused_before_any_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, right: bool, how: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    data = write(tmp_path / "qa.jsonl", one_kind(monkeypatch, 20, right=right))
    out = tmp_path / "t.json"
    result = calibrate("--data", str(data), "--out", str(out), "--cache", "c.jsonl", *how)
    assert result.exit_code == 2, result.output
    counts = "0 wrong and 20 right" if right else "20 wrong and 0 right"
    assert flat(result.stderr).endswith(
        f"error: {counts} of 20 labelled answers: a threshold tells wrong answers from right "
        "ones and cannot be calibrated on one kind alone; no threshold file written. "
        f"Calibrate on {'a harder' if right else 'an easier'} or larger set, or on more "
        "questions (a larger --limit)"
        + ("" if right else ", and check that --labels fits how the model answers")
    )
    assert not out.exists() and not (tmp_path / "cal.png").exists()
    assert "nan" not in result.output.lower()  # no metric printed as NaN, no raw warning


def test_few_of_a_kind_warns_with_the_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, answers = questions(24)
    answers = {q: ("Atlantis" if i in (0, 5, 11) else row["answers"][0])
               for i, (q, row) in enumerate(zip(answers, rows, strict=True))}  # fmt: skip
    monkeypatch.setattr(build, "backend", lambda *a: FakeBackend(answers))
    data, out = write(tmp_path / "qa.jsonl", rows), tmp_path / "t.json"
    result = calibrate("--data", str(data), "--select", "coverage", "--out", str(out),
                       "--cache", str(tmp_path / "c.jsonl"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        "warning: only 3 wrong and 21 right of 24 labelled answers: with fewer than 10 "
        "wrong ones the threshold and the metrics rest on a handful of them and move a lot "
        "from one sample to the next; calibrate on more questions (a harder or larger set)."
    ) in flat(result.stderr)
    assert out.exists() and "warning" not in result.stdout


def test_evaluate_on_one_kind_of_answer_prints_n_a_not_nan(
    tmp_path: Path, loads: list[FakeBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write(tmp_path / "qa.jsonl", questions(30)[0])
    out = tmp_path / "t.json"
    made = calibrate("--data", str(data), "--select", "coverage", "--out", str(out),
                     "--cache", str(tmp_path / "c.jsonl"))  # fmt: skip
    assert made.exit_code == 0, made.output
    rows = one_kind(monkeypatch, 12, right=True)
    held = write(tmp_path / "held.jsonl", rows)
    result = CliRunner().invoke(cli_module.app, [
        "evaluate", "--threshold", str(out), "--data", str(held), "--resamples", "20",
        "--cache", str(tmp_path / "e.jsonl"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows_of = {line.split()[1]: line for line in result.stdout.splitlines() if "│" in line}
    for metric in ("auroc", "prr"):
        cells = [cell.strip() for cell in rows_of[metric].split("│")]
        assert cells[2:4] == ["n/a (no wrong answer)", "n/a"], rows_of
    assert "nan" not in result.output.lower()


def test_results_alone_go_to_stdout(tmp_path: Path, loads: list[FakeBackend]) -> None:
    data = write(tmp_path / "qa.jsonl", questions(30)[0])
    out = tmp_path / "t.json"
    result = calibrate("--data", str(data), "--select", "coverage", "--out", str(out),
                       "--cache", str(tmp_path / "c.jsonl"))  # fmt: skip
    assert result.exit_code == 0, result.output
    for said in ("loading the model...", "scoring", "bootstrapping 95% intervals"):
        assert said in result.stderr and said not in result.stdout
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0].strip().startswith("per-example results:")
    assert lines[-1] == f"wrote {out}"
    threshold = ThresholdFile.read(out).threshold
    assert lines[-2] == f"decision policy: esi (threshold {threshold:g})"
