"""Cross-fitting and selection on synthetic answers whose signals carry known information."""

from __future__ import annotations

import numpy as np
import pytest

from esi_guard.backends.hidden import HiddenStates
from esi_guard.calibration.combined_fit import average
from esi_guard.calibration.crossfit import Candidate, candidates, select
from esi_guard.combined import CombinedScore, HiddenProbe
from esi_guard.exceptions import ConfigurationError


def answers(n: int, seed: int = 0) -> tuple[list[dict[str, float]], list[int]]:
    """``nll`` tells wrong answers apart, ``esi`` a little, ``entropy`` nothing."""
    rng = np.random.default_rng(seed)
    wrong = (rng.random(n) < 0.4).astype(int)
    signals = [{"nll": float(2.0 * w + rng.normal()), "esi": float(0.3 * w + rng.normal()),
                "entropy": float(rng.normal())} for w in wrong]  # fmt: skip
    return signals, wrong.tolist()


def test_the_candidates_are_every_single_signal_and_the_sets_with_and_without_esi() -> None:
    names = [c.name for c in candidates(("esi", "nll", "entropy", "hidden"))]
    assert set(names) == {"esi", "nll", "entropy", "hidden", "esi+nll+entropy", "nll+entropy",
                          "esi+nll+entropy+hidden", "nll+entropy+hidden"}  # fmt: skip
    costs = [c.cost for c in candidates(("esi", "nll", "entropy", "hidden"))]
    assert costs == sorted(costs) and names[-1] == "esi+nll+entropy+hidden"
    assert Candidate(("esi", "nll"), hidden=True).without("esi") == Candidate(("nll",), True)


def test_selection_keeps_the_cheapest_near_the_best_and_says_what_esi_adds() -> None:
    signals, wrong = answers(400)
    found = select(signals, wrong, requested=("esi", "nll", "entropy"), resamples=200)
    best = max(e.value for e in found.table.values())
    assert found.table[found.chosen.name].value >= best - 0.005
    assert "esi" not in found.chosen.features  # ESI's little does not pay its cost
    assert found.table["nll"].value > found.table["esi"].value > found.table["entropy"].value
    assert set(found.contributions) >= {"esi"}
    assert len(found.p_wrong) == 400 and found.folds.max() == 4
    report = found.report()
    assert report["fit"] == "cross" and report["chosen"] == found.chosen.name
    assert report["contributions"]["esi"]["verdict"] in {"gain", "tie", "loss"}
    # out of fold, the kept score ranks answers as well as its best single signal
    assert found.table[found.chosen.name].value >= found.table["nll"].value - 0.005


def test_too_few_answers_of_a_class_are_refused_by_name() -> None:
    signals, _ = answers(40)
    with pytest.raises(ConfigurationError, match="at least 5 wrong and 5 right"):
        select(signals, [1, 1, 1] + [0] * 37, requested=("nll",))
    with pytest.raises(ConfigurationError, match="no states"):
        select(signals, [1, 0] * 20, requested=("nll", "hidden"))


def _states(n: int, wrong: list[int], seed: int) -> list[HiddenStates]:
    """Two layers, two positions, width 6; layer 3's ``answer_mean`` leans with the label."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n, 2, 2, 6)).astype(np.float32)
    values[:, 1, 1, 0] += 1.5 * np.asarray(wrong)
    return [HiddenStates((1, 3), ("prompt_last", "answer_mean"), v) for v in values]


def test_the_kept_score_is_its_fold_models_averaged_on_the_logit_scale() -> None:
    signals, wrong = answers(200, seed=2)
    states = _states(200, wrong, seed=3)
    found = select(signals, wrong, requested=("nll", "entropy", "hidden"), states=states,
                   resamples=20, explain=False)  # fmt: skip
    members = found.members[found.chosen.name]
    assert len(members) == 5 and found.model.n_fit == 200
    new_signals, new_wrong = answers(30, seed=9)
    for s, h in zip(new_signals, _states(30, new_wrong, seed=10), strict=True):
        expected = np.mean([m.logit(s, h) for m in members])
        assert found.model.logit(s, h) == pytest.approx(expected, abs=1e-9)
    assert all(w >= 0 for w in found.model.weights)
    assert found.report()["run_time"] == "fold_average"


def test_probes_over_different_layers_average_over_their_union() -> None:
    rng = np.random.default_rng(0)
    common = {"features": ("nll",), "strength": 1.0, "n_fit": 10}
    a = CombinedScore(**common, mean=(1.0,), scale=(2.0,), weights=(0.5,), intercept=-1.0,
                      hidden=HiddenProbe(layers=(3,), positions=("answer_mean",), hidden_size=4,
                                         weights=tuple(rng.normal(size=4)),
                                         components=2))  # fmt: skip
    b = CombinedScore(**common, mean=(0.0,), scale=(1.0,), weights=(1.5,), intercept=0.3,
                      hidden=HiddenProbe(layers=(1,), positions=("prompt_last", "answer_mean"),
                                         hidden_size=4, weights=tuple(rng.normal(size=8)),
                                         components=3))  # fmt: skip
    both = average([a, b])
    assert both.hidden is not None and both.hidden.layers == (3, 1)
    assert both.n_fit == 20 and both.hidden.components == 3
    for _ in range(5):
        h = HiddenStates((1, 3), ("prompt_last", "answer_mean"),
                         rng.normal(size=(2, 2, 4)).astype(np.float32))  # fmt: skip
        s = {"nll": float(rng.normal())}
        assert both.logit(s, h) == pytest.approx((a.logit(s, h) + b.logit(s, h)) / 2, abs=1e-9)
    with pytest.raises(ConfigurationError, match="same signals"):
        average([a, a.model_copy(update={"features": ("entropy",)})])


def test_the_nested_estimate_runs_the_selection_without_each_fold() -> None:
    signals, wrong = answers(150, seed=4)
    calls: list[str] = []
    found = select(signals, wrong, requested=("esi", "nll"), resamples=50, explain=False,
                   nested=True, progress=calls.append)  # fmt: skip
    assert found.nested is not None
    assert abs(found.nested.value - found.table[found.chosen.name].value) < 0.1
    assert sum("nested" in line for line in calls) == 5 and "cross-fitting" in calls[0]
    assert found.report()["auroc_nested"]["value"] == found.nested.value
