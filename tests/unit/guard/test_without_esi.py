"""Guards that decide without ESI where they can, on the fake backend.

A combined score fitted without ``esi`` gives a guard that forces no variant: one answer,
its free signals (and states), ``p_wrong``, the decision, on every entry point. A
value-of-information cascade (``free_score`` + ``probe_band``) decides on the no-ESI
``p_wrong`` outside its band and runs ESI inside it; both travel in a threshold file.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends import FINAL
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cascade import Band
from esi_guard.combined import CombinedScore, HiddenProbe
from esi_guard.exceptions import ConfigurationError, ScoringError

QUESTION = "Where is the Eiffel Tower?"


def free(logit: float, *, hidden: HiddenProbe | None = None) -> CombinedScore:
    """A no-ESI combined score whose ``p_wrong`` is ``sigmoid(logit)`` whatever the signals."""
    return CombinedScore(features=("nll", "entropy"), mean=(0.0, 0.0), scale=(1.0, 1.0),
                         weights=(0.0, 0.0), intercept=logit, strength=1.0, n_fit=10,
                         hidden=hidden)  # fmt: skip


def with_esi(weight: float = 1.0) -> CombinedScore:
    """A combined score on ESI alone: ``p_wrong = sigmoid(weight * (esi - 0.5) / 0.1)``."""
    return CombinedScore(features=("esi",), mean=(0.5,), scale=(0.1,), weights=(weight,),
                         intercept=0.0, strength=1.0, n_fit=10)  # fmt: skip


def forced(backend: FakeBackend) -> list[int]:
    return [size for method, size in backend.calls if method == "teacher_force"]


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


@pytest.mark.parametrize("call", ["invoke", "batch", "stream", "ainvoke", "astream"])
@pytest.mark.parametrize(("logit", "decision"), [(-2.0, "accept"), (2.0, "abstain")])
async def test_a_combined_score_without_esi_forces_no_variant(
    call: str, logit: float, decision: str
) -> None:
    backend = FakeBackend(default_sensitivity=0.9)
    guard = ESIGuard(backend=backend, threshold=0.5, combined=free(logit), action="abstain")
    if call == "invoke":
        message = guard.invoke(QUESTION)
    elif call == "batch":
        message = guard.batch([QUESTION, "Who wrote Hamlet?"])[0]
    elif call == "stream":
        message = list(guard.stream(QUESTION))[-1]
    elif call == "ainvoke":
        message = await guard.ainvoke(QUESTION)
    else:
        message = [chunk async for chunk in guard.astream(QUESTION)][-1]
    esi = message.response_metadata["esi"]
    assert not forced(backend)  # no teacher-forcing call at all
    assert esi["decided_by"] == "free" and esi["scored"] and esi["score"] is None
    assert esi["p_wrong"] == pytest.approx(sigmoid(logit))
    assert esi["decision"] == decision
    assert esi["variants"] == [] and esi["work"] == {"forced_variants": 0, "forced_tokens": 0}
    assert set(esi["signals"]) >= {"nll", "entropy", "max_nll", "repetition"}


def test_an_answer_the_user_has_is_forced_once_after_the_prompt_alone() -> None:
    backend = FakeBackend()
    guard = ESIGuard(backend=backend, threshold=0.5, combined=free(-1.0))
    result = guard.score(QUESTION, "Paris, France.")
    assert result.decided_by == "free" and result.decision == "accept"
    assert forced(backend) == [1]  # one request: the original row, no variant


class NoTopK(FakeBackend):
    """Answers without their distributions."""

    def generate(self, prompts, **kwargs):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        return [replace(g, topk=None) for g in super().generate(prompts, **kwargs)]


def test_an_answer_it_cannot_score_without_esi_is_never_passed() -> None:
    guard = ESIGuard(backend=NoTopK(), threshold=0.5, combined=free(-3.0), on_error="abstain")
    esi = guard.invoke(QUESTION).response_metadata["esi"]
    assert not esi["scored"] and esi["decision"] == "abstain"
    assert esi["reason"].startswith("no_distributions")
    raising = ESIGuard(backend=NoTopK(), threshold=0.5, combined=free(-3.0), on_error="raise")
    with pytest.raises(ScoringError, match="no_distributions"):
        raising.invoke(QUESTION)


def cascade_guard(backend: FakeBackend, logit: float, band: Band) -> ESIGuard:
    return ESIGuard(backend=backend, threshold=0.5, combined=with_esi(), free_score=free(logit),
                    probe_band=band, n_variants=4, action="flag")  # fmt: skip


@pytest.mark.parametrize(("logit", "path", "decision"),
                         [(-3.0, "free", "accept"), (3.0, "free", "flag"),
                          (0.1, "esi", None)])  # fmt: skip
def test_the_value_cascade_runs_esi_only_inside_its_band(
    logit: float, path: str, decision: str | None
) -> None:
    backend = FakeBackend(default_sensitivity=0.8)  # ESI high: full decisions flag
    guard = cascade_guard(backend, logit, Band(low=0.3, high=0.7))
    (esi,) = [m.response_metadata["esi"] for m in guard.batch([QUESTION])]
    assert esi["decided_by"] == path
    if path == "free":
        assert not forced(backend) and esi["variants_used"] == 0
        assert esi["decision"] == decision and esi["p_wrong"] == pytest.approx(sigmoid(logit))
    else:
        assert forced(backend) and esi["variants_used"] == 4
        assert esi["score"] > 0.5 and esi["p_wrong"] > 0.5 and esi["decision"] == "flag"


def test_the_threshold_file_round_trips_the_value_cascade(tmp_path: Path) -> None:
    backend = FakeBackend(default_sensitivity=0.8)
    plain = ESIGuard(backend=backend, threshold=0.5)
    file = ThresholdFile(threshold=0.5, method="youden", calibration_coverage=0.5,
                         calibration_selective_risk=None, model=backend.model_id,
                         scoring=plain.scoring_config, label_method="containment",
                         dataset={"path": "x", "sha256": "0", "n": 1}, metrics={},
                         created="now", esi_guard_version="0", combined=with_esi(),
                         free_score=free(-3.0), probe_band=Band(low=0.3, high=0.7))  # fmt: skip
    file.write(tmp_path / "t.json")
    assert ThresholdFile.read(tmp_path / "t.json") == file
    guard = ESIGuard.from_calibration(tmp_path / "t.json", backend=backend)
    assert guard.free_score == free(-3.0) and guard.probe_band == Band(low=0.3, high=0.7)
    assert guard.invoke(QUESTION).response_metadata["esi"]["decided_by"] == "free"
    assert not forced(backend)
    inside = ESIGuard.from_calibration(tmp_path / "t.json", backend=backend,
                                       free_score=free(0.0))  # fmt: skip
    assert inside.invoke(QUESTION).response_metadata["esi"]["decided_by"] == "esi"
    assert forced(backend)


def test_misfit_cascades_are_refused() -> None:
    backend = FakeBackend()
    with pytest.raises(ConfigurationError, match="needs combined"):
        ESIGuard(backend=backend, threshold=0.5, free_score=free(0.0),
                 probe_band=Band(low=0.3, high=0.7))  # fmt: skip
    with pytest.raises(ConfigurationError, match="must hold the threshold"):
        cascade_guard(backend, 0.0, Band(low=0.6, high=0.7))
    with pytest.raises(ConfigurationError, match="reads no ESI"):
        ESIGuard(backend=backend, threshold=0.5, combined=free(0.0), free_score=free(0.0),
                 probe_band=Band(low=0.3, high=0.7))  # fmt: skip


def test_a_no_esi_probe_on_states_reads_them_from_the_answers_own_pass() -> None:
    backend = FakeBackend(default_sensitivity=0.5)
    probe = HiddenProbe(layers=(FINAL,), positions=("answer_mean",), hidden_size=8,
                        weights=(1.0,) * 8, components=1)  # fmt: skip
    guard = ESIGuard(backend=backend, threshold=0.5, combined=free(0.0, hidden=probe))
    esi = guard.invoke(QUESTION).response_metadata["esi"]
    assert esi["decided_by"] == "free" and "hidden" in esi["signals"] and not forced(backend)
    assert ("generate", 1) in backend.calls
