"""A collected probe run as a calibrate cache: ``benchmarks.probe export``, then calibrate and
evaluate on it with no model call, on the embedded model's identity.

The run is synthetic (written as ``collect`` writes it: scalar records, float16 states
beside them) on 24 real SciQ questions; its scores are what the exported cache, the
threshold file and evaluate's figures are checked against.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.cache import Cache
from benchmarks.probe.collect import _save_hidden, hidden_spec
from benchmarks.probe.export import export
from esi_guard import SkipOneChar
from esi_guard.backends import Generation, HiddenStates, embedded_gguf
from esi_guard.calibration.data import load_examples
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import commands as cli_module
from esi_guard.scoring import TopK

pytestmark = [pytest.mark.integration]
pytest.importorskip("llama_cpp")

N = 24
SYSTEM = "Please directly answer the following question with one or few words."


def collected(folder: Path, data: Path, cut: bool = False) -> str:
    """A run of ``N`` SciQ questions as ``collect`` would write it for the embedded model."""
    spec = hidden_spec(30)
    header = {"data": str(data), "model": str(embedded_gguf()), "engine": "llamacpp-f16",
              "max_new_tokens": 24, "system": SYSTEM, "template": None, "chat_template": None,
              "L": 10, "k": 100, "soc": SkipOneChar().describe(), "labels": "containment",
              "layers": list(spec.layers), "positions": list(spec.positions)}  # fmt: skip
    name = "sciq-smollm2"
    cache = Cache(folder, name, header)
    rng = np.random.default_rng(0)
    examples = load_examples(data, limit=N, seed=0)
    wrong = np.arange(N) % 3 != 0
    values = rng.normal(size=(N, len(spec.layers), len(spec.positions), 576)).astype(np.float32)
    topk = TopK(np.zeros((1, 2), np.int64), np.zeros((1, 2)))
    gens = [Generation("a", (0,), topk, "stop", hidden=HiddenStates(spec.layers, spec.positions, v))
            for v in values]  # fmt: skip
    file = _save_hidden(folder / f"{name}-hidden", (0, 1), list(enumerate(examples)), gens)
    records = []
    for i, example in enumerate(examples):
        answer = example.answers[0] if not wrong[i] else "no idea"
        scores = {k: float(rng.normal() + wrong[i]) for k in ("esi", "nll", "entropy", "max_nll")}
        records.append({"index": i, "question": example.question, "answers": list(example.answers),
                        "answer": answer, "labels": {"wrong": int(wrong[i])}, "scores": scores,
                        "variants": [scores["esi"]] * 10, "hidden": file,
                        "finish_reason": "length" if cut and i == 0 else "stop",
                        "seconds": {"generate": 1.0}})  # fmt: skip
    cache.add((0, 1), records)
    return name


def test_calibrate_and_evaluate_read_an_exported_run_and_load_no_model(
    tmp_path: Path, shared_data: Path
) -> None:
    data = shared_data / "sciq" / "test.jsonl"
    name = collected(tmp_path / "probe", data)
    out = tmp_path / "run.jsonl"
    export(tmp_path / "probe", [name], model="default", out=out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, records = lines[0], lines[1:]
    assert header["request"]["max_new_tokens"] == 64  # every answer stopped before 24
    assert header["engine"] == "llamacpp-f16" and len(records) == N
    written_run = (tmp_path / "probe" / f"{name}-0of1.jsonl").read_text().splitlines()[1:]
    bench = {r["index"]: r for r in map(json.loads, written_run)}
    assert [r["score"] for r in records] == [bench[i]["scores"]["esi"] for i in range(N)]
    assert records[0]["hidden"]["shape"][0] == len(header["hidden_states"]["layers"])
    threshold = tmp_path / "t.json"
    runner = CliRunner()
    calibrated = runner.invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--limit", str(N), "--seed", "0", "--cache", str(out),
        "--select", "coverage", "--coverage", "0.5", "--resamples", "50", "--out", str(threshold),
    ])  # fmt: skip
    assert calibrated.exit_code == 0, calibrated.output
    said = " ".join(calibrated.output.split())
    assert f"all {N} examples found" in said and "no model loaded" in said
    written = ThresholdFile.read(threshold)
    scores = sorted(r["score"] for r in records)
    assert scores[N // 2 - 1] <= written.threshold <= scores[N // 2]  # half accepted
    evaluated_cache = tmp_path / "eval.jsonl"
    export(tmp_path / "probe", [name], model="default", out=evaluated_cache, threshold=threshold)
    evaluated = runner.invoke(cli_module.app, [
        "evaluate", "--threshold", str(threshold), "--data", str(data), "--limit", str(N),
        "--seed", "0", "--cache", str(evaluated_cache), "--resamples", "50",
    ])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert "no model loaded" in " ".join(evaluated.output.split())
    assert "coverage 0.500" in evaluated.output
    # --limit: the run's first questions only, a cache calibrate --limit finds whole
    first = tmp_path / "first.jsonl"
    export(tmp_path / "probe", [name], model="default", out=first, limit=N - 2)
    assert [json.loads(line)["index"] for line in first.read_text().splitlines()[1:]] == list(
        range(N - 2)
    )
    again = runner.invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--limit", str(N - 2), "--seed", "0", "--cache",
        str(first), "--select", "coverage", "--resamples", "50", "--out", str(tmp_path / "t2.json"),
    ])  # fmt: skip
    assert again.exit_code == 0, again.output
    assert f"all {N - 2} examples found" in " ".join(again.output.split())


def test_an_answer_cut_short_is_refused_unless_allowed(tmp_path: Path, shared_data: Path) -> None:
    name = collected(tmp_path / "probe", shared_data / "sciq" / "test.jsonl", cut=True)
    with pytest.raises(SystemExit, match="1 answers cut at 24 tokens"):
        export(tmp_path / "probe", [name], model="default", out=tmp_path / "run.jsonl")
    export(tmp_path / "probe", [name], model="default", out=tmp_path / "run.jsonl", allow_cut=True)
    assert len((tmp_path / "run.jsonl").read_text().splitlines()) == N + 1
