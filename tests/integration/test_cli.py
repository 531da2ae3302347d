"""The esi-guard CLI on the embedded model and a 20-question slice of ../shared/data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard, HFBackend
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def flat(text: str) -> str:
    """The text with rich's line wrapping undone."""
    return " ".join(text.split())


def test_calibrate_resume_and_evaluate(
    tmp_path: Path, shared_data: Path, hf_backend: HFBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "backend", lambda *args: hf_backend)  # loaded once
    runner = CliRunner()
    data = shared_data / "nq_open" / "dev.jsonl"
    out, plot, cache = tmp_path / "threshold.json", tmp_path / "cal.png", tmp_path / "run.jsonl"
    scoring = ["--n-variants", "4", "--max-new-tokens", "12", "--resamples", "100"]
    common = ["--data", str(data), "--limit", "20", "--cache", str(cache), *scoring,
              "--select", "coverage", "--coverage", "0.7", "--top-k", "20"]  # fmt: skip
    first = runner.invoke(
        cli_module.app, ["calibrate", *common, "--out", str(out), "--plot", str(plot)]
    )
    assert first.exit_code == 0, first.output
    assert "auroc" in first.output and "selective_accuracy@80%" in first.output
    written = ThresholdFile.read(out)
    assert written.method == "coverage=0.7" and written.dataset.n == 20
    assert written.model == hf_backend.model_id and written.scoring.top_k == 20
    assert plot.stat().st_size > 10_000
    lines = cache.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 21  # header + 20 examples

    # A run killed halfway: keep the header and 10 examples (the last one cut short).
    cache.write_text("\n".join(lines[:11]) + "\n" + lines[11][:25], encoding="utf-8")
    second = runner.invoke(cli_module.app, ["calibrate", *common, "--out", str(out)])
    assert second.exit_code == 0, second.output
    records = [json.loads(line) for line in cache.read_text(encoding="utf-8").splitlines()[1:]
               if line.endswith("}")]  # fmt: skip
    assert sorted(r["index"] for r in records) == list(range(20))  # each example once
    assert ThresholdFile.read(out).metrics["aurc"] == written.metrics["aurc"]  # same results

    # The file drives a guard and the evaluate command.
    guard = ESIGuard.from_calibration(out, backend=hf_backend)
    assert guard.threshold == ThresholdFile.read(out).threshold
    evaluated = runner.invoke(
        cli_module.app,
        [
            "evaluate",
            "--threshold",
            str(out),
            "--data",
            str(data),
            "--limit",
            "20",
            "--cache",
            str(cache),
            "--resamples",
            "100",
        ],
    )
    assert evaluated.exit_code == 0, evaluated.output
    assert "coverage" in evaluated.output and "selective risk" in evaluated.output

    # A risk target this model cannot meet on 20 answers: said plainly, no file written.
    strict = tmp_path / "strict.json"
    refused = runner.invoke(
        cli_module.app,
        ["calibrate", *common, "--select", "risk", "--alpha", "0.05", "--out", str(strict)],
    )
    assert refused.exit_code == 1 and "no threshold file written" in flat(refused.stderr)
    assert not strict.exists()

    # Another scoring configuration must not reuse the cache.
    clash = runner.invoke(
        cli_module.app, ["calibrate", *common, "--top-k", "10", "--out", str(out)]
    )
    assert clash.exit_code == 2 and "another run" in flat(clash.stderr)


def test_the_default_engine_runs_the_embedded_gguf_and_a_rerun_needs_no_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    out, cache = tmp_path / "threshold.json", tmp_path / "c.jsonl"
    data = Path(__file__).resolve().parents[2] / "docs" / "examples" / "my_qa.jsonl"
    common = ["--data", str(data), "--limit", "6", "--n-variants", "2", "--max-new-tokens",
              "8", "--resamples", "50", "--cache", str(cache), "--select", "coverage",
              "--coverage", "0.7"]  # fmt: skip
    result = runner.invoke(cli_module.app, ["calibrate", *common, "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = ThresholdFile.read(out)
    assert (written.model, written.engine) == (EMBEDDED_MODEL_ID, "llamacpp-f16")  # auto
    assert written.model_sha256 is not None and len(written.model_sha256) == 64

    def no_model(*args: object) -> None:
        raise AssertionError("a rerun from a complete cache loaded the model")

    monkeypatch.setattr(build, "backend", no_model)
    again = runner.invoke(cli_module.app, ["calibrate", *common, "--select", "f1",
                                           "--out", str(tmp_path / "f1.json")])  # fmt: skip
    assert again.exit_code == 0, again.output
    rerun = ThresholdFile.read(tmp_path / "f1.json")
    assert (rerun.model_sha256, rerun.engine, rerun.scoring) == (
        written.model_sha256, written.engine, written.scoring)  # fmt: skip
    monkeypatch.undo()
    other = ["--model", "org/model", "--backend", "llamacpp", "--out", str(out)]
    refused = runner.invoke(cli_module.app, ["calibrate", *common, *other])
    assert refused.exit_code == 2
    assert "runs a .gguf file or 'default'" in flat(refused.stderr)
