"""Properties that must hold for every input: the ESI estimator and the guard's interventions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from esi_guard import ESIGuard, FakeBackend, SkipOneChar, Typo, esi_score
from esi_guard.backends import Forced, ForcingRequest
from esi_guard.scoring import TopK

# Any finite float, from subnormals to +-1e300, in logits or log-probabilities.
anything = st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_infinity=False)


@st.composite
def distributions(draw: st.DrawFn) -> tuple[TopK, list[TopK], str]:
    """An original top-k and L variants' top-k over T answer tokens."""
    k = draw(st.integers(1, 6))
    n_tokens = draw(st.integers(1, 4))
    n_variants = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["logits", "logprobs"]))
    values = st.lists(anything, min_size=k, max_size=k)
    if kind == "logprobs":
        values = st.lists(st.floats(-1e300, 0.0, allow_nan=False), min_size=k, max_size=k)

    def one() -> TopK:
        ids = [draw(st.lists(st.integers(0, 20), min_size=k, max_size=k, unique=True))
               for _ in range(n_tokens)]  # fmt: skip
        vals = [draw(values) for _ in range(n_tokens)]
        return TopK(np.array(ids), np.array(vals, dtype=np.float64))

    return one(), [one() for _ in range(n_variants)], kind


@settings(max_examples=300, deadline=None)
@given(distributions(), st.sampled_from(["hellinger", "squared_hellinger", "bhattacharyya", "kl"]))
def test_every_finite_input_scores_a_finite_bounded_number(
    case: tuple[TopK, list[TopK], str], distance: str
) -> None:
    original, variants, kind = case
    result = esi_score(original, variants, distance=distance, kind=kind)  # type: ignore[arg-type]
    assert math.isfinite(result.score) and result.score >= 0.0
    assert np.isfinite(result.token_scores).all() and (result.token_scores >= 0).all()
    assert result.score == pytest.approx(float(np.mean(result.token_scores)), rel=1e-9, abs=1e-12)
    if distance in ("hellinger", "squared_hellinger"):
        # alpha_t is the entropy of a k-token distribution (<= ln k) and D <= 1.
        k = original.ids.shape[1]
        assert result.score <= math.log(k) + 1e-9


@settings(max_examples=150, deadline=None)
@given(distributions())
def test_a_variant_identical_to_the_original_adds_nothing(
    case: tuple[TopK, list[TopK], str],
) -> None:
    original, variants, kind = case
    alone = esi_score(original, [original], kind=kind)  # type: ignore[arg-type]
    assert alone.score == pytest.approx(0.0, abs=1e-7)
    # Averaging in an unmoved variant scales the score by L / (L + 1).
    moved = esi_score(original, variants, kind=kind)  # type: ignore[arg-type]
    diluted = esi_score(original, [*variants, original], kind=kind)  # type: ignore[arg-type]
    expected = moved.score * len(variants) / (len(variants) + 1)
    assert diluted.score == pytest.approx(expected, rel=1e-7, abs=1e-9)


class Recording(FakeBackend):
    """Keeps every forcing request the guard sends."""

    def __init__(self) -> None:
        super().__init__(default_sensitivity=1.0)
        self.requests: list[ForcingRequest] = []

    def teacher_force(self, requests: Any, *, top_k: int) -> list[Forced | Any]:
        self.requests += list(requests)
        return super().teacher_force(requests, top_k=top_k)


text = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=80)


@settings(max_examples=150, deadline=None)
@given(
    system=text,
    earlier=text,
    question=text.filter(str.strip),
    seed=st.integers(0, 2**31),
    typo=st.booleans(),
)
def test_the_guard_only_ever_changes_the_last_question_and_is_deterministic(
    system: str, earlier: str, question: str, seed: int, typo: bool
) -> None:
    prompt = [("system", system), ("human", earlier), ("ai", "Noted."), ("human", question)]
    intervention = Typo() if typo else SkipOneChar()
    backend = Recording()
    guard = ESIGuard(backend=backend, threshold=0.1, seed=seed, intervention=intervention)
    first = guard.invoke(prompt).response_metadata["esi"]
    again = ESIGuard(backend=Recording(), threshold=0.1, seed=seed, intervention=intervention)
    assert again.invoke(prompt).response_metadata["esi"]["variants"] == first["variants"]
    assert first["variants"] == intervention.variants(question, 10, seed=seed)
    for request in backend.requests:
        for variant in request.variants:
            assert list(variant[:-1]) == list(request.prompt[:-1])  # protected text untouched
            assert variant[-1]["role"] == "user"
    assert first["scored"] or first["reason"]
