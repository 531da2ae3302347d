"""Non-finite numbers never decide an answer: they leave it unscored (``on_error``).

A backend whose generation's top-k holds NaN, or whose hidden states hold NaN or inf,
gives a stage before ESI (a combined score without ESI, the value cascade's free stage,
the ESI probe) or a combined score's ``p_wrong`` nothing it can decide on. Found by an
audit of fail-open paths: the NaN rows' entropy read as 0 (certain), and accepted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends import FINAL
from esi_guard.backends.hidden import HiddenSpec, HiddenStates
from esi_guard.cascade import Band, ESIProbe
from esi_guard.combined import CombinedScore, HiddenProbe
from esi_guard.scoring import TopK

QUESTION = "Where is the Eiffel Tower?"
ANSWERS = {QUESTION: "Paris in France"}


class NaNGeneration(FakeBackend):
    """Its answers' own top-k hold NaN (a backend that does not check its logits)."""

    def generate(self, prompts: Any, **kwargs: Any) -> Any:
        gens = super().generate(prompts, **kwargs)
        return [replace(g, topk=TopK(g.topk.ids, np.full_like(g.topk.values, np.nan)))
                for g in gens]  # fmt: skip


class BadStates(FakeBackend):
    """Its hidden states hold ``value`` (NaN, or an overflow's inf)."""

    def __init__(self, value: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.value = value

    def _hidden(self, question: str, spec: HiddenSpec, n: int) -> HiddenStates:
        states = super()._hidden(question, spec, n)
        return replace(states, values=np.full_like(states.values, self.value))


def score(features: tuple[str, ...], *, esi: bool = False, hidden: bool = False) -> CombinedScore:
    n = len(features)
    probe = None
    if hidden:
        probe = HiddenProbe(layers=(FINAL,), positions=("answer_last",), hidden_size=8,
                            weights=(0.1,) * 8, components=1)  # fmt: skip
    return CombinedScore(features=features, mean=(0.5,) * n if esi else (0.0,) * n,
                         scale=(0.1,) * n if esi else (1.0,) * n, weights=(1.0,) * n,
                         intercept=-3.0 if hidden else 0.0, strength=1.0, n_fit=10,
                         hidden=probe)  # fmt: skip


def entropy_probe(backend: FakeBackend) -> ESIProbe:
    return ESIProbe(model=backend.model_id, features=("entropy",), mean=(0.0,), scale=(1.0,),
                    weights=(1.0,), intercept=0.0, strength=1.0, band=0.1, coverage=0.9,
                    n_fit=10)  # fmt: skip


def test_a_guard_without_esi_never_accepts_an_answer_whose_top_k_is_nan() -> None:
    guard = ESIGuard(backend=NaNGeneration(answers=ANSWERS), threshold=0.5,
                     combined=score(("entropy",)))  # fmt: skip
    (result,) = guard.assess([QUESTION])
    assert not result.scored and result.decision == "abstain"
    assert (result.reason or "").startswith("scoring_error")


def test_the_esi_probe_never_accepts_an_answer_whose_top_k_is_nan() -> None:
    backend = NaNGeneration(answers=ANSWERS, default_sensitivity=0.9)
    guard = ESIGuard(backend=backend, threshold=0.5, esi_probe=entropy_probe(backend),
                     probe_band=Band(low=0.4, high=0.6), n_variants=4)  # fmt: skip
    (result,) = guard.assess([QUESTION])
    assert not result.scored and result.decision == "abstain"
    assert (result.reason or "").startswith("scoring_error")


@pytest.mark.parametrize("value", [np.nan, -np.inf])
@pytest.mark.parametrize("esi", [False, True])
def test_a_p_wrong_on_non_finite_states_leaves_the_answer_unscored(value: float, esi: bool) -> None:
    features = ("esi",) if esi else ("nll",)
    backend = BadStates(value, answers=ANSWERS, default_sensitivity=0.9)
    guard = ESIGuard(backend=backend, threshold=0.5, n_variants=4,
                     combined=score(features, esi=esi, hidden=True))  # fmt: skip
    (result,) = guard.assess([QUESTION])
    assert not result.scored and result.decision == "abstain"  # on_error, not the action
    assert (result.reason or "").startswith("scoring_error")
    assert guard.invoke(QUESTION).content == guard.abstain_message
