"""The decision policy: every guard's mode is an ordered list of stages, checked in one place.

(The guard decides through it on every entry point: tests/unit/test_cascade.py and
tests/unit/guard; here the policy alone, on small scores the tests build.)
"""

from __future__ import annotations

import numpy as np
import pytest

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends.hidden import HiddenSpec, HiddenStates
from esi_guard.cascade import Band, Cascade, ESIProbe
from esi_guard.combined import CombinedScore, HiddenProbe
from esi_guard.exceptions import ConfigurationError
from esi_guard.policy import Policy, Stage


def combined(*features: str, probe: HiddenProbe | None = None) -> CombinedScore:
    """p_wrong = sigmoid(sum of the features' values [+ the probe's term])."""
    n = len(features)
    return CombinedScore(features=features, mean=(0.0,) * n, scale=(1.0,) * n,
                         weights=(1.0,) * n, intercept=0.0, strength=1.0, n_fit=0,
                         hidden=probe)  # fmt: skip


def probe(value: float) -> ESIProbe:
    """An ESI probe whose estimate is always ``value``."""
    return ESIProbe(features=(), mean=(), scale=(), weights=(), intercept=value,
                    strength=0.0, band=0.1, coverage=0.9, n_fit=0)  # fmt: skip


def states_probe(layer: int) -> HiddenProbe:
    """A probe term reading one 2-wide state at ``layer``'s last position (weights 1)."""
    return HiddenProbe(layers=(layer,), positions=("answer_last",), hidden_size=2,
                       weights=(1.0, 1.0), components=2)  # fmt: skip


WITH_ESI, FREE = combined("esi", "nll"), combined("nll")


@pytest.mark.parametrize(
    ("policy", "names", "shown"),
    [
        (Policy.of(0.3), ["esi"], "esi (threshold 0.3)"),
        (Policy.of(0.3, combined=WITH_ESI), ["esi"], "esi + p_wrong (threshold 0.3)"),
        (Policy.of(0.3, combined=FREE), ["free"], "free (threshold 0.3)"),
        (
            Policy.of(
                0.3, cascade=Cascade(free=FREE, band=Band(low=0.2, high=0.4), combined=WITH_ESI)
            ),
            ["free", "esi"],
            "free (band [0.2, 0.4]) -> esi + p_wrong (threshold 0.3)",
        ),
        (
            Policy.of(0.3, cascade=Cascade(probe=probe(0.1), band=Band(low=0.25, high=0.35))),
            ["probe", "esi"],
            "probe (band [0.25, 0.35]) -> esi (threshold 0.3)",
        ),
    ],
)
def test_each_mode_is_a_list_of_stages(policy: Policy, names: list[str], shown: str) -> None:
    assert [stage.name for stage in policy.stages] == names
    assert policy.describe() == shown
    assert policy.uses_esi == (names[-1] == "esi")
    assert policy.decides_early == (names[0] != "esi")
    assert policy.decided_by_esi == ("esi" if len(names) > 1 else None)


def test_an_early_stage_decides_outside_its_band_and_passes_on_inside() -> None:
    band = Band(low=0.4, high=0.6)
    policy = Policy.of(0.5, cascade=Cascade(free=FREE, band=band, combined=WITH_ESI))
    for nll, route in ((-2.0, "accept"), (2.0, "untrusted"), (0.0, None)):
        (read,) = policy.early({"nll": nll}, None)
        assert read.stage.name == "free" and read.route == route
        assert read.value == pytest.approx(1 / (1 + np.exp(-nll)))
    # The last stage has no band: the threshold decides.
    (alone,) = Policy.of(0.5, combined=FREE).early({"nll": 0.01}, None)
    assert alone.route == "untrusted" and alone.term is None
    assert Policy.of(0.5).early({"nll": 0.0}, None) == []  # ESI alone: nothing early


def test_a_stage_whose_states_are_missing_passes_the_answer_on() -> None:
    free = combined("nll", probe=states_probe(3))
    policy = Policy.of(0.5, cascade=Cascade(free=free, band=Band(low=0.4, high=0.6),
                                            combined=WITH_ESI))  # fmt: skip
    assert policy.needs_hidden == HiddenSpec((3,), ("answer_last",))
    assert policy.early({"nll": 5.0}, None) == []
    states = HiddenStates((3,), ("answer_last",), np.array([[[1.0, 1.0]]]))
    (read,) = policy.early({"nll": 5.0}, states)
    assert read.route == "untrusted" and read.term == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("stages", "threshold", "granularity", "error"),
    [
        ((), 0.3, "answer", "at least one stage"),
        ((Stage("free", FREE), Stage("esi")), 0.3, "answer", "every stage but the last"),
        ((Stage("esi", band=Band(low=0, high=1)),), 0.3, "answer", "every stage but the last"),
        ((Stage("free", FREE, Band(low=0.4, high=0.6)), Stage("esi")), 0.3, "answer",
         "must hold the threshold 0.3"),
        ((Stage("free", FREE, Band(low=0.2, high=0.6)), Stage("esi")), 0.3, "sentence",
         "its policy is ESI alone"),
        ((Stage("esi", combined("esi", probe=states_probe(1))),), 0.3, "sentence",
         "its policy is ESI alone"),
    ],
)  # fmt: skip
def test_a_policy_that_cannot_decide_is_refused_naming_why(
    stages: tuple[Stage, ...], threshold: float, granularity: str, error: str
) -> None:
    with pytest.raises(ConfigurationError, match=error):
        Policy(stages, threshold, granularity)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "score", "error"),
    [
        ("free", None, "combined score without ESI"),
        ("free", WITH_ESI, "combined score without ESI"),
        ("probe", FREE, "an ESI probe"),
        ("esi", FREE, "reads it"),
    ],
)
def test_a_stage_with_the_wrong_score_is_refused(name: str, score: object, error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        Stage(name, score)  # type: ignore[arg-type]


def test_the_guard_shows_its_policy() -> None:
    backend = FakeBackend()
    assert ESIGuard(backend=backend, threshold=0.3).policy.describe() == "esi (threshold 0.3)"
    distilled = probe(0.1).model_copy(update={"model": backend.model_id})
    cascade = ESIGuard(backend=backend, threshold=0.5, esi_probe=distilled)
    assert [stage.name for stage in cascade.policy.stages] == ["probe", "esi"]
