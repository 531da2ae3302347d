"""Fitting a cascade's parts: the ESI probe learns ESI back from the fake backend's states
(which carry each question's sensitivity), or from the free signals alone, and the band is the
narrowest one its certificate allows."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends import FINAL, POSITIONS, Generation, HiddenSpec
from esi_guard.calibration.cascade_fit import fit_band, fit_esi_probe, held_out
from esi_guard.exceptions import ConfigurationError

SPEC = HiddenSpec((1, 3, FINAL), POSITIONS)


@pytest.fixture(scope="module")
def scored() -> tuple[FakeBackend, list[dict[str, float]], list[float], list[object]]:
    """80 questions' free signals, full ESI (L=4) and states on the fake backend."""
    rng = np.random.default_rng(0)
    questions = [f"What is the name of thing number {i}?" for i in range(80)]
    backend = FakeBackend(sensitivity={q: float(rng.uniform(0.0, 1.0)) for q in questions})
    guard = ESIGuard(backend=backend, threshold=0.5, n_variants=4, hidden_states=SPEC)
    metas = [m.response_metadata["esi"] for m in guard.batch(questions)]
    signals = [{k: v for k, v in m["signals"].items() if k != "hidden"} for m in metas]
    gens = backend.generate([[{"role": "user", "content": q}] for q in questions],
                            max_new_tokens=64, top_k=100, hidden=SPEC)  # fmt: skip
    states = [g.hidden for g in gens if isinstance(g, Generation)]
    esi = [m["score"] for m in metas]
    return backend, signals, esi, states


def test_the_probe_learns_esi_from_the_states(scored) -> None:  # type: ignore[no-untyped-def]
    _, signals, esi, states = scored
    probe = fit_esi_probe(signals[:60], esi[:60], hidden=states[:60])
    assert probe.hidden is not None and probe.hidden.hidden_size == 8
    estimates = [probe.estimate(s, h) for s, h in zip(signals[60:], states[60:], strict=True)]
    assert spearmanr(estimates, esi[60:])[0] > 0.8
    assert 0 < probe.band < max(esi)
    oof = held_out(signals, esi, hidden=states)
    assert spearmanr(oof, esi)[0] > 0.8


def test_a_probe_without_states_fits_on_the_signals_alone() -> None:
    rng = np.random.default_rng(1)
    entropy = rng.uniform(0, 2, 60)
    signals = [{"nll": 1.0, "entropy": float(e), "max_nll": 0.5} for e in entropy]
    probe = fit_esi_probe(signals, 0.2 * entropy + 0.01 * rng.normal(size=60))
    assert probe.hidden is None and probe.needs_hidden is None
    assert probe.estimate({"nll": 1.0, "entropy": 1.0, "max_nll": 0.5}) == pytest.approx(
        0.2, abs=0.02
    )
    with pytest.raises(ConfigurationError, match="needs the signals"):
        probe.estimate({"nll": 1.0})
    with pytest.raises(ConfigurationError, match="at least 20"):
        fit_esi_probe(signals[:10], list(entropy[:10]))


def test_the_band_is_the_narrowest_its_certificate_allows() -> None:
    rng = np.random.default_rng(2)
    full = rng.uniform(0, 1, 2000)
    band_of = {}
    for noise in (0.02, 0.1):
        cheap = full + rng.normal(0, noise, full.size)
        band = fit_band(cheap, full, 0.5, max_disagreement=0.02, delta=0.1)
        assert band is not None and band.fitted is not None
        assert band.low <= 0.5 <= band.high
        assert band.fitted["bound"] <= 0.02
        outside = (cheap < band.low) | (cheap > band.high)
        disagree = outside & ((cheap > 0.5) != (full > 0.5))
        assert disagree.mean() == pytest.approx(band.fitted["disagreement"])
        assert band.fitted["esi_share"] == pytest.approx(1 - outside.mean())
        band_of[noise] = band.high - band.low
    assert band_of[0.02] < band_of[0.1]  # a better probe runs ESI less
    assert fit_band(full[:10], full[:10], 0.5) is None  # 10 answers cannot certify 2%
    p = fit_band(full * 0.9, full, 0.5, logit=True)
    assert p is not None and 0 < p.low <= 0.5 <= p.high < 1
