"""How the CLI builds the local model it scores with: the options reach the backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from esi_guard import FakeBackend
from esi_guard.cli import commands as cli_module


def test_calibrate_and_evaluate_load_the_model_with_the_dtype_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"question": f"Which city is number {i} on the list?", "answer": f"city{i}"}
            for i in range(12)]  # fmt: skip
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loads: list[dict[str, Any]] = []

    def local_backend(model: str, **kwargs: Any) -> FakeBackend:
        loads.append({"model": model, **kwargs})
        return FakeBackend()

    monkeypatch.setattr(cli_module, "local_backend", local_backend)
    monkeypatch.chdir(tmp_path)  # where the default caches go
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
