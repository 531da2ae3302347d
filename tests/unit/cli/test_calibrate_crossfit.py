"""``calibrate --score combined`` cross-fitted on every answer, on the fake backend.

Wrong answers are sensitive to the question's wording (ESI sees them), their states carry
it (a probe sees them), and half of them loop ("Atlantis Atlantis ..."; ``repetition``
sees those). A file whose features leave ESI out gives a guard that forces no variant;
``--cascade`` gives one that forces variants only inside its band; both are evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard, FakeBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module
from esi_guard.cli._combined import kept_rule

LOOP = "Atlantis Atlantis Atlantis Atlantis Atlantis"


@pytest.fixture
def setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeBackend, Path, list[str]]:
    questions, answers, levels, rows = [], {}, {}, []
    for i in range(90):
        question = f"Which capital city does the country number {i} have today?"
        wrong = i % 3 == 0
        answers[question] = (LOOP if i % 2 else "Atlantis") if wrong else f"city{i}"
        levels[question] = 0.9 if wrong else 0.1
        rows.append({"question": question, "answer": f"city{i}"})
        questions.append(question)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    backend = FakeBackend(answers, sensitivity=levels)
    monkeypatch.setattr(build, "backend", lambda *args: backend)
    return backend, data, questions


def calibrate(data: Path, out: Path, *options: str) -> str:
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--n-variants", "4", "--resamples", "50",
        "--score", "combined", "--select", "youden", "--out", str(out),
        "--cache", str(out.with_suffix(".jsonl")), *options,
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def forced_requests(backend: FakeBackend) -> int:
    return sum(size for method, size in backend.calls if method == "teacher_force")


def test_a_file_without_esi_gives_a_guard_that_forces_no_variant(
    setting: tuple[FakeBackend, Path, list[str]], tmp_path: Path
) -> None:
    backend, data, questions = setting
    out = tmp_path / "free.json"
    said = calibrate(data, out, "--features", "nll,entropy,max_nll,hidden")
    assert "cross-fitted on all 90 answers" in said and "out-of-fold AUROC" in said
    written = ThresholdFile.read(out)
    assert written.combined is not None and not written.combined.uses_esi
    report = written.combined_report or {}
    assert report["fit"] == "cross" and report["chosen"].endswith("hidden")
    backend.calls.clear()
    guard = ESIGuard.from_calibration(out, backend=backend)
    results = [m.response_metadata["esi"] for m in guard.batch(questions[:30])]
    assert forced_requests(backend) == 0
    assert {r["decided_by"] for r in results} == {"free"}
    assert all(r["score"] is None and r["p_wrong"] is not None for r in results)
    decisions = [r["decision"] != "accept" for r in results]
    assert decisions == [i % 3 == 0 for i in range(30)]  # the states tell them apart
    evaluated = CliRunner().invoke(cli_module.app, [
        "evaluate", "--threshold", str(out), "--data", str(data), "--resamples", "50",
        "--cache", str(tmp_path / "e.jsonl"),
    ])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert "no variant forced" in evaluated.output and "P(wrong): AUROC" in evaluated.output


def test_selection_keeps_what_pays_and_says_what_each_feature_adds(
    setting: tuple[FakeBackend, Path, list[str]], tmp_path: Path
) -> None:
    _, data, _ = setting
    out = tmp_path / "t.json"
    said = calibrate(data, out, "--features", "esi,nll,repetition")
    report = ThresholdFile.read(out).combined_report or {}
    # ESI alone tells every wrong answer apart: nothing else is kept beside it.
    assert report["chosen"] == "esi"
    assert set(report["candidates"]) == {"esi", "nll", "repetition", "esi+nll+repetition",
                                         "nll+repetition"}  # fmt: skip
    assert report["candidates"]["esi"]["value"] == pytest.approx(1.0)
    assert report["candidates"]["repetition"]["value"] > 0.7  # the loops
    assert "kept: esi, the best out of fold (AUROC 1.000 [" in said
    assert "left out: nll, repetition" in said


def estimate(value: float) -> dict[str, float]:
    return {"value": value, "low": value - 0.05, "high": value + 0.05}


@pytest.mark.parametrize(
    ("chosen", "best", "saved"),
    [("nll+entropy", "esi+nll+entropy", "no ESI"), ("nll", "esi+nll+hidden", "no ESI, no states"),
     ("esi+nll", "esi+nll+hidden", "no states")],
)  # fmt: skip
def test_the_kept_line_says_which_rule_kept_a_cheaper_score(
    chosen: str, best: str, saved: str
) -> None:
    report = {"chosen": chosen, "candidates": {"esi": estimate(0.62), chosen: estimate(0.701),
                                               best: estimate(0.704)}}  # fmt: skip
    assert kept_rule(report) == (
        f"kept: {chosen} (AUROC 0.701 [0.651, 0.751]): it is cheaper ({saved}) and within "
        f"0.005 of the best out of fold, which was {best} at AUROC 0.704 [0.654, 0.754]"
    )


def test_the_kept_line_says_when_the_kept_score_was_the_best() -> None:
    report = {"chosen": "nll", "candidates": {"nll": estimate(0.71), "esi+nll": estimate(0.7)}}
    assert kept_rule(report) == "kept: nll, the best out of fold (AUROC 0.710 [0.660, 0.760])"


def test_the_kept_score_s_metrics_come_first_and_progress_goes_to_stderr(
    setting: tuple[FakeBackend, Path, list[str]], tmp_path: Path
) -> None:
    _, data, _ = setting
    out = tmp_path / "t.json"
    result = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--n-variants", "4", "--resamples", "50",
        "--score", "combined", "--features", "nll,repetition", "--select", "youden",
        "--out", str(out), "--cache", str(tmp_path / "c.jsonl"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    stdout, stderr = " ".join(result.stdout.split()), " ".join(result.stderr.split())
    report = ThresholdFile.read(out).combined_report or {}
    kept = f"P(wrong) of the kept score ({report['chosen']}) on qa.jsonl, out of fold: n=90"
    assert stdout.index(kept) < stdout.index("ESI on qa.jsonl: n=90")
    auroc = report["auroc_p_wrong"]
    headline = stdout[stdout.index(kept) : stdout.index("ESI on qa.jsonl")]
    assert f"auroc │ {auroc['value']:.3f} │ [{auroc['low']:.3f}, {auroc['high']:.3f}]" in headline
    assert (
        "fitting 3 candidate combined scores on 5 folds of 90 answers, then each kept "
        "feature's contribution, then the whole selection again within each fold (the nested "
        "estimate)..."
    ) in stderr
    assert "nested estimate: the selection again without fold 5 of 5..." in stderr
    assert "on new questions expect AUROC" in stdout
    assert report["run_time"] == "fold_average" and "auroc_nested" in report
    assert "fitting" not in stdout and "bootstrapping" not in stdout and "scoring" not in stdout


def test_the_value_cascade_forces_variants_only_inside_its_band(
    setting: tuple[FakeBackend, Path, list[str]], tmp_path: Path
) -> None:
    backend, data, questions = setting
    out = tmp_path / "cascade.json"
    said = calibrate(data, out, "--features", "esi,nll,repetition", "--cascade",
                     "--max-disagreement", "0.1")  # fmt: skip
    assert "cascade: ESI runs where the no-ESI P(wrong) is in" in said
    written = ThresholdFile.read(out)
    assert written.free_score is not None and not written.free_score.uses_esi
    band = written.probe_band
    assert band is not None and band.fitted is not None and band.fitted["bound"] <= 0.1
    backend.calls.clear()
    guard = ESIGuard.from_calibration(out, backend=backend)
    results = [m.response_metadata["esi"] for m in guard.batch(questions[:30])]
    paths = [r["decided_by"] for r in results]
    assert forced_requests(backend) == paths.count("esi")
    assert "free" in paths and "esi" in paths
    for i, r in enumerate(results):
        if r["decided_by"] == "free":  # outside the band: the loops, on the free signals
            assert not band.low <= r["p_wrong"] <= band.high and r["variants_used"] == 0
        assert (r["decision"] != "accept") == (i % 3 == 0)


def test_a_run_with_states_reuses_the_answers_and_scores_of_one_without(
    setting: tuple[FakeBackend, Path, list[str]], tmp_path: Path
) -> None:
    backend, data, _ = setting
    cache = tmp_path / "run.jsonl"
    first = CliRunner().invoke(cli_module.app, [
        "calibrate", "--data", str(data), "--n-variants", "4", "--resamples", "50",
        "--select", "youden", "--out", str(tmp_path / "esi.json"), "--cache", str(cache),
    ])  # fmt: skip
    assert first.exit_code == 0, first.output
    backend.calls.clear()
    out = tmp_path / "probe.json"
    command = ["calibrate", "--data", str(data), "--n-variants", "4", "--resamples", "50",
               "--select", "youden", "--out", str(out), "--cache", str(cache),
               "--score", "combined", "--features", "esi,nll,hidden"]  # fmt: skip
    second = CliRunner().invoke(cli_module.app, command)
    assert second.exit_code == 0, second.output
    said = " ".join(second.output.split())
    assert "90 answers and their scores reused from" in said and "run-hidden.jsonl" in said
    assert forced_requests(backend) == 0  # only the answers again, with their states
    assert ThresholdFile.read(out).combined is not None
    esi = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    both = [json.loads(line) for line in
            (tmp_path / "run-hidden.jsonl").read_text().splitlines()[1:]]  # fmt: skip
    assert [r["score"] for r in both] == [r["score"] for r in esi]
    assert all(r["hidden"]["layers"] for r in both)
    third = CliRunner().invoke(cli_module.app, command)
    assert third.exit_code == 0 and "no model loaded" in " ".join(third.output.split())
    # and the finished run with states serves a run without them (its answers and scores)
    free = ["calibrate", "--data", str(data), "--n-variants", "4", "--resamples", "50",
            "--select", "youden", "--out", str(tmp_path / "free.json"),
            "--cache", str(tmp_path / "run-hidden.jsonl"), "--score", "combined",
            "--features", "esi,nll"]  # fmt: skip
    fourth = CliRunner().invoke(cli_module.app, free)
    assert fourth.exit_code == 0, fourth.output
    assert "no model loaded" in " ".join(fourth.output.split())
    assert ThresholdFile.read(tmp_path / "free.json").combined.hidden is None  # type: ignore[union-attr]


def test_evaluate_reuses_calibrate_s_cache_and_computes_p_wrong_from_its_signals(
    setting: tuple[FakeBackend, Path, list[str]], tmp_path: Path
) -> None:
    _, data, _ = setting
    out = tmp_path / "combined.json"
    calibrate(data, out, "--features", "esi,nll,entropy", "--select", "coverage")
    evaluated = CliRunner().invoke(cli_module.app, [
        "evaluate", "--threshold", str(out), "--data", str(data), "--resamples", "50",
        "--cache", str(out.with_suffix(".jsonl")),
    ])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    said = " ".join(evaluated.output.split())
    assert "P(wrong): AUROC" in said and "coverage" in said
    # the threshold is the 0.8 quantile of the guard's own score on these very answers
    coverage = float(said.split("): coverage ")[1].split(",")[0])
    assert coverage == pytest.approx(0.8, abs=0.012)
