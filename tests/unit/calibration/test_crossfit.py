"""Cross-fitting and selection on synthetic answers whose signals carry known information."""

from __future__ import annotations

import numpy as np
import pytest

from esi_guard.calibration.crossfit import Candidate, candidates, select
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
