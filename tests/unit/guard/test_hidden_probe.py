"""A combined score with a hidden-state probe, on the fake backend (whose states carry each
question's sensitivity): the guard reads the probe's states from the answer's own pass,
reports the probe's term and ``p_wrong``, never decides without the states, refuses an API
backend, and the threshold file and the CLI carry the probe."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends import FINAL, POSITIONS, Generation, HiddenSpec, Messages
from esi_guard.backends.openai import OpenAIBackend
from esi_guard.calibration.combined_fit import fit_combined
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli import commands as cli_module
from esi_guard.combined import CombinedScore, probe_window
from esi_guard.exceptions import BackendError, ConfigurationError

SPEC = HiddenSpec((1, 3, FINAL), POSITIONS)


def bank(n: int) -> tuple[list[str], dict[str, float], list[int]]:
    """Questions, their sensitivities, and labels: the sensitive half is wrong."""
    rng = np.random.default_rng(0)
    questions = [f"What is the name of thing number {i}?" for i in range(n)]
    levels = {q: float(rng.uniform(0.0, 1.0)) for q in questions}
    return questions, levels, [int(levels[q] > 0.5) for q in questions]


@pytest.fixture(scope="module")
def fitted() -> tuple[FakeBackend, CombinedScore, list[str]]:
    questions, levels, wrong = bank(80)
    backend = FakeBackend(sensitivity=levels)
    gens = backend.generate([[{"role": "user", "content": q}] for q in questions],
                            max_new_tokens=8, top_k=10, hidden=SPEC)  # fmt: skip
    states = [g.hidden for g in gens if isinstance(g, Generation) and g.hidden is not None]
    signals = [{"esi": 0.0, "nll": 1.0, "entropy": 1.0} for _ in questions]
    model = fit_combined(signals[:60], wrong[:60], features=("nll",), hidden=states[:60])
    return backend, model, questions


def test_the_probe_learns_what_the_states_carry(
    fitted: tuple[FakeBackend, CombinedScore, list[str]],
) -> None:
    backend, model, questions = fitted
    assert model.hidden is not None
    assert model.hidden.layers[0] in SPEC.layers and model.hidden.hidden_size == 8
    guard = ESIGuard(backend=backend, combined=model, threshold=0.5, n_variants=3)
    results = [guard.score(q, "I do not know.") for q in questions[60:]]
    _, _, wrong = bank(80)
    assert all(r.scored and r.p_wrong is not None for r in results)
    p = [float(r.p_wrong or 0.0) for r in results]
    auroc = np.mean([a > b for a, wa in zip(p, wrong[60:], strict=True) if wa
                     for b, wb in zip(p, wrong[60:], strict=True) if not wb])  # fmt: skip
    assert auroc > 0.9


def test_the_guard_reports_the_probe_term_and_the_same_p_wrong_on_every_path(
    fitted: tuple[FakeBackend, CombinedScore, list[str]],
) -> None:
    backend, model, questions = fitted
    assert model.hidden is not None
    guard = ESIGuard(backend=backend, combined=model, threshold=0.5, n_variants=3)
    question = questions[70]
    esi = guard.invoke(question).response_metadata["esi"]
    (gen,) = backend.generate([[{"role": "user", "content": question}]], max_new_tokens=64,
                              top_k=100, hidden=model.hidden.spec)  # fmt: skip
    assert isinstance(gen, Generation) and gen.hidden is not None
    assert esi["signals"]["hidden"] == model.hidden.term(gen.hidden)
    signals = {k: v for k, v in esi["signals"].items() if k != "hidden"}
    assert esi["p_wrong"] == model.p_wrong({"esi": esi["score"], **signals}, gen.hidden)
    assert "hidden" not in esi  # states stay out of the metadata unless asked for
    scored = guard.score(question, esi["answer"])  # the original row, forced: same states
    assert scored.p_wrong == esi["p_wrong"]


class NoStates(FakeBackend):
    """A backend that says it reads hidden states, and drops them."""

    def generate(
        self, prompts: Sequence[Messages], **kwargs: Any
    ) -> list[Generation | BackendError]:
        return [g if isinstance(g, BackendError) else Generation(g.text, g.token_ids, g.topk,
                g.finish_reason) for g in super().generate(prompts, **kwargs)]  # fmt: skip


def test_an_answer_without_the_probe_states_is_never_decided_on_the_rest(
    fitted: tuple[FakeBackend, CombinedScore, list[str]],
) -> None:
    _, model, questions = fitted
    guard = ESIGuard(backend=NoStates(), combined=model, threshold=0.99, n_variants=3)
    result = guard.invoke(questions[0]).response_metadata["esi"]
    assert not result["scored"] and result["reason"].startswith("hidden_states_missing")
    assert result["decision"] == "abstain" and result["p_wrong"] is None
    assert result["work"]["forced_variants"] == 0  # known before forcing: nothing forced


def test_with_esi_in_the_score_an_answer_without_states_is_decided_before_forcing() -> None:
    questions, levels, wrong = bank(40)
    gens = FakeBackend(sensitivity=levels).generate(
        [[{"role": "user", "content": q}] for q in questions], max_new_tokens=8, top_k=10,
        hidden=SPEC)  # fmt: skip
    states = [g.hidden for g in gens if isinstance(g, Generation) and g.hidden is not None]
    signals = [{"esi": levels[q], "nll": 1.0, "entropy": 1.0} for q in questions]
    model = fit_combined(signals, wrong, features=("esi", "nll"), hidden=states)
    assert model.uses_esi and model.hidden is not None
    guard = ESIGuard(backend=NoStates(sensitivity=levels), combined=model, threshold=0.99,
                     n_variants=3)  # fmt: skip
    result = guard.assess([questions[0]])[0]
    assert not result.scored and result.reason is not None
    assert result.reason.startswith("hidden_states_missing") and result.decision == "abstain"
    assert result.work["forced_variants"] == 0 and result.p_wrong is None
    # Scoring a given answer forces its original row with the states: scored.
    assert guard.score(questions[0], "I do not know.").scored


def test_an_api_backend_or_a_model_of_another_width_is_refused_at_construction(
    fitted: tuple[FakeBackend, CombinedScore, list[str]],
) -> None:
    _, model, _ = fitted
    api = OpenAIBackend("some-model", base_url="http://127.0.0.1:9/v1", mode="chat")
    with pytest.raises(ConfigurationError, match=r"OpenAIBackend .* gives no hidden states"):
        ESIGuard(backend=api, combined=model, threshold=0.5)
    with pytest.raises(ConfigurationError, match="gives no hidden states"):
        ESIGuard(backend=api, threshold=0.5, hidden_states=SPEC)
    assert model.hidden is not None
    wider = model.model_copy(update={"hidden": model.hidden.model_copy(
        update={"hidden_size": 16})})  # fmt: skip
    with pytest.raises(ConfigurationError, match="width 16"):
        ESIGuard(backend=FakeBackend(), combined=wider, threshold=0.5)
    with pytest.raises(ConfigurationError, match="no layers \\[7\\]"):
        ESIGuard(backend=FakeBackend(), threshold=0.5, hidden_states=HiddenSpec((7,)))


def test_kept_states_travel_in_the_metadata_as_json(
    fitted: tuple[FakeBackend, CombinedScore, list[str]],
) -> None:
    backend, _, questions = fitted
    guard = ESIGuard(backend=backend, threshold=0.5, n_variants=3, hidden_states=SPEC)
    esi = guard.invoke(questions[1]).response_metadata["esi"]
    hidden = json.loads(json.dumps(esi["hidden"]))
    assert hidden["layers"] == [1, 3, FINAL] and hidden["positions"] == list(POSITIONS)
    assert np.asarray(hidden["values"]).shape == (3, 3, 8)


def test_the_threshold_file_round_trips_the_probe_exactly(
    fitted: tuple[FakeBackend, CombinedScore, list[str]],
    threshold_file: Callable[..., ThresholdFile],
    tmp_path: Path,
) -> None:
    backend, model, questions = fitted
    path = tmp_path / "probe.json"
    threshold_file(combined=model, threshold=0.5, engine="fake").write(path)
    guard = ESIGuard.from_calibration(path, backend=backend)
    direct = ESIGuard(backend=backend, combined=model, threshold=0.5, n_variants=10)
    for question in questions[60:64]:
        assert guard.score(question, "x y").p_wrong == direct.score(question, "x y").p_wrong


def test_the_probe_window_spans_the_middle_of_the_model_and_the_final_norm() -> None:
    assert probe_window([*range(30), FINAL]).layers == (12, 15, 17, 20, 23, FINAL)
    assert probe_window([0, 1, 2, 3, FINAL]).layers == (1, 2, FINAL)
    assert probe_window([FINAL]).layers == (FINAL,)


def test_calibrate_fits_a_probe_with_features_hidden_and_refuses_bad_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    questions, levels, wrong = bank(60)
    answers = {q: ("Atlantis" if w else f"city{i}") for i, (q, w) in
               enumerate(zip(questions, wrong, strict=True))}  # fmt: skip
    monkeypatch.setattr(build, "backend",
                        lambda *args: FakeBackend(answers, sensitivity=levels))  # fmt: skip
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answers": [f"city{i}"]}) + "\n"
                            for i, q in enumerate(questions)))  # fmt: skip
    out, cache = tmp_path / "t.json", tmp_path / "c.jsonl"
    common = ["calibrate", "--data", str(data), "--n-variants", "2", "--resamples", "20",
              "--select", "coverage", "--out", str(out), "--cache", str(cache)]  # fmt: skip
    result = CliRunner().invoke(cli_module.app, [*common, "--score", "combined",
                                                 "--features", "nll,hidden"])  # fmt: skip
    assert result.exit_code == 0, result.output
    written = ThresholdFile.read(out)
    assert written.combined is not None and written.combined.hidden is not None
    report = written.combined_report or {}
    # The fake's answers carry nothing in their nll: cross-fitting keeps the states only.
    assert set(report["candidates"]) == {"nll", "hidden", "nll+hidden"}
    assert report["chosen"] == "hidden" and written.combined.features == ()
    assert "probe" in report and "kept: hidden" in result.output
    header = json.loads(cache.read_text().splitlines()[0])
    assert header["hidden_states"]["layers"] == [1, 2, FINAL]
    bad = CliRunner().invoke(cli_module.app, [*common, "--score", "combined",
                                              "--features", "esi,vibes"])  # fmt: skip
    assert bad.exit_code == 2 and "--features takes" in " ".join(bad.output.split())
    lone = CliRunner().invoke(cli_module.app, [*common, "--features", "esi,hidden"])
    assert lone.exit_code == 2 and "--features is for --score combined" in lone.output
