"""Sequential ESI: the pure stopping rule, its calibration, and the guard's rounds."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.calibration.thresholds import fit_stop_constant
from esi_guard.sequential import schedule, settled, variants_used

SURE = "What is two plus two, written as a number?"
UNSURE = "Who won the international chess tournament held in 1911?"
MIDDLE = "Name a lake."
ANSWERS = {SURE: "four", UNSURE: "maybe Karl Schlechter of Vienna", MIDDLE: "Lake Geneva"}


def test_rounds_double_up_to_all_variants() -> None:
    assert schedule(2, 10) == [2, 4, 8, 10]
    assert schedule(3, 10) == [3, 6, 10]
    assert schedule(10, 10) == [10]


def test_settled_when_the_mean_is_clear_of_the_threshold_by_its_spread() -> None:
    assert settled([0.10, 0.12], threshold=0.5, constant=3.0)
    assert not settled([0.10, 0.90], threshold=0.5, constant=1.0)  # too spread to tell
    assert not settled([0.10], threshold=0.5, constant=0.0)  # one score has no spread
    scores = [0.1, 0.12, 0.6, 0.65, 0.4, 0.45, 0.5, 0.55, 0.3, 0.2]
    assert variants_used(scores, 0.5, 3.0, 2) == 2  # 0.11 vs 0.5 at spread 0.014
    assert variants_used(scores, 0.5, 1000.0, 2) == 10  # never settled: all of them


def test_the_fitted_constant_keeps_early_decisions_within_the_bound() -> None:
    rng = np.random.default_rng(0)
    rows = [list(rng.normal(rng.uniform(0, 1), 0.15, size=10)) for _ in range(400)]
    rule = fit_stop_constant(rows, 0.5, min_variants=2, max_disagreement=0.05, delta=0.1)
    assert rule is not None
    assert rule.bound <= 0.05 and rule.disagreement <= rule.bound
    assert 2 <= rule.variants_used_mean < 10  # it saves variants on clear answers
    early = [np.mean(r[: variants_used(r, 0.5, rule.constant, 2)]) > 0.5 for r in rows]
    differ = np.mean([e != (np.mean(r) > 0.5) for e, r in zip(early, rows, strict=True)])
    assert differ == rule.disagreement
    # Too few answers for any constant to carry the bound: nothing is fitted.
    assert fit_stop_constant(rows[:20], 0.5, min_variants=2, max_disagreement=0.01,
                             delta=0.1) is None  # fmt: skip


def guard(**kwargs: object) -> ESIGuard:
    backend = FakeBackend(ANSWERS, sensitivity={SURE: 0.05, UNSURE: 3.0, MIDDLE: 0.8})
    settings = {"threshold": 0.3, "n_variants": 8, "max_new_tokens": 8, "seed": 1}
    return ESIGuard(backend=backend, **{**settings, **kwargs})  # type: ignore[arg-type]


def test_clear_answers_stop_early_and_report_the_mean_of_what_they_used() -> None:
    full = [m.response_metadata["esi"] for m in guard().batch([SURE, UNSURE])]
    quick = [
        m.response_metadata["esi"]
        for m in guard(min_variants=2, stop_constant=1.0).batch([SURE, UNSURE])
    ]
    for esi, whole in zip(quick, full, strict=True):
        k = esi["variants_used"]
        assert esi["stopped_early"] == (k < len(whole["variants"]))
        assert len(esi["variant_scores"]) == k
        assert esi["variants"] == whole["variants"][:k]  # the same variants, in order
        assert esi["score"] == pytest.approx(math.fsum(whole["variant_scores"][:k]) / k)
        assert esi["decision"] == whole["decision"]
        assert esi["work"]["forced_variants"] <= whole["work"]["forced_variants"]
    assert any(esi["stopped_early"] for esi in quick)
    assert full[0]["variants_used"] == len(full[0]["variants"]) and not full[0]["stopped_early"]


def test_a_constant_that_never_settles_scores_every_variant_as_before() -> None:
    full = guard().invoke(MIDDLE).response_metadata["esi"]
    slow = guard(min_variants=2, stop_constant=1e9).invoke(MIDDLE).response_metadata["esi"]
    assert slow["variants_used"] == len(full["variants"]) and not slow["stopped_early"]
    assert slow["score"] == pytest.approx(full["score"])
    assert slow["work"]["forced_variants"] == full["work"]["forced_variants"]


async def test_async_rounds_match_sync() -> None:
    sync = guard(min_variants=2, stop_constant=1.0).batch([SURE, UNSURE, MIDDLE])
    done = await guard(min_variants=2, stop_constant=1.0).abatch([SURE, UNSURE, MIDDLE])
    assert [m.response_metadata["esi"]["score"] for m in done] == [
        m.response_metadata["esi"]["score"] for m in sync
    ]


def test_sequential_needs_a_calibrated_constant() -> None:
    with pytest.raises(ConfigurationError, match="stop_constant"):
        guard(min_variants=2)


def test_from_calibration_turns_on_the_files_stopping_rule(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "threshold.json"
    rule = {"constant": 1.5, "min_variants": 3, "disagreement": 0.0, "bound": 0.02,
            "max_disagreement": 0.05, "delta": 0.1, "variants_used_mean": 4.2}  # fmt: skip
    threshold_file(sequential=rule).write(path)
    assert ThresholdFile.read(path).sequential == rule
    backend = FakeBackend(ANSWERS)
    made = ESIGuard.from_calibration(path, backend=backend)
    assert (made.min_variants, made.stop_constant) == (3, 1.5)
    assert ESIGuard.from_calibration(path, backend=backend, min_variants=None).min_variants is None


def test_a_question_with_fewer_variants_than_n_is_decided_when_they_run_out() -> None:
    # "Name a lake." allows three SOC variants ("Nam", "lak", both): no round waits for more.
    quick = guard(min_variants=2, stop_constant=1e9).invoke(MIDDLE).response_metadata["esi"]
    assert len(quick["variants"]) == quick["variants_used"] == 3
    assert not quick["stopped_early"] and quick["scored"]
