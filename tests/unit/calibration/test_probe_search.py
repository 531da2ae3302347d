"""The hidden-state candidate search both fits share: it finds the layer and positions that
carry the signal, folds the chosen candidate onto the raw states, and says each candidate's
held-out error."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from esi_guard.backends.hidden import FINAL, POSITIONS, HiddenStates
from esi_guard.calibration import probe_search
from esi_guard.calibration.probe_search import POSITION_SETS, search_states, standard
from esi_guard.exceptions import ConfigurationError


def least_squares(
    xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], problems: Sequence[tuple[int, int, float]]
) -> list[tuple[np.ndarray, float]]:
    """Ridge on centred data, each problem's data and first columns: the smallest model."""
    fits = []
    for which, width, strength in problems:
        x, y = xs[which][:, :width], ys[which]
        mx, my = x.mean(axis=0), y.mean()
        w = np.linalg.solve((x - mx).T @ (x - mx) + strength * np.eye(width),
                            (x - mx).T @ (y - my))  # fmt: skip
        fits.append((w, float(my - mx @ w)))
    return fits


def test_the_search_finds_the_states_that_carry_the_signal() -> None:
    rng = np.random.default_rng(0)
    n, width, layers = 100, 6, (2, 5, FINAL)
    values = rng.normal(size=(n, len(layers), len(POSITIONS), width))
    direction = rng.normal(size=width)
    y = values[:, 1, POSITIONS.index("answer_last"), :] @ direction
    states = [HiddenStates(layers, POSITIONS, values[i]) for i in range(n)]
    x = rng.normal(size=(n, 1))  # a free signal that carries nothing
    splits = [(np.flatnonzero(np.arange(n) % 4 != k), np.flatnonzero(np.arange(n) % 4 == k))
              for k in range(4)]  # fmt: skip
    found = search_states(x, y, splits, states, strengths=(1e-3, 1.0), fit=least_squares,
                          error=lambda held, z: held - z,
                          score=lambda r: float(np.mean(r**2)))  # fmt: skip
    assert found.probe.layers == (5,) and found.probe.positions == ("answer_last",)
    assert found.strength == 1e-3 and found.weights.shape == (1,)
    assert set(found.probe.selection) == {f"{layer}/{'+'.join(p)}" for layer in layers
                                          for p in POSITION_SETS}  # fmt: skip
    assert min(found.probe.selection.values()) == pytest.approx(float(np.mean(found.errors**2)))
    # Folded onto the raw states: the estimate is intercept + w . x + v . states.
    estimate = [found.intercept + float(found.weights @ x[i]) + found.probe.term(states[i])
                for i in range(n)]  # fmt: skip
    assert np.corrcoef(estimate, y)[0, 1] > 0.99


def test_states_of_different_shapes_are_refused() -> None:
    one = HiddenStates((1,), ("prompt_last",), np.zeros((1, 1, 4)))
    other = HiddenStates((2,), ("prompt_last",), np.zeros((1, 1, 4)))
    with pytest.raises(ConfigurationError, match="same layers and positions"):
        search_states(np.zeros((2, 1)), np.zeros(2), [], [one, other], strengths=(1.0,),
                      fit=least_squares, error=np.subtract, score=np.mean)  # fmt: skip


def test_a_constant_column_is_left_unscaled() -> None:
    mean, scale = standard(np.array([[1.0, 3.0], [1.0, 7.0]]))
    assert mean.tolist() == [1.0, 5.0] and scale.tolist() == [1.0, 2.0]


def test_kept_reductions_give_the_same_search_and_are_fitted_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(1)
    n, width, layers = 60, 5, (2, FINAL)
    values = rng.normal(size=(n, len(layers), len(POSITIONS), width))
    y = values[:, 0, 0, :] @ rng.normal(size=width)
    states = [HiddenStates(layers, POSITIONS, values[i]) for i in range(n)]
    x = rng.normal(size=(n, 2))
    splits = [(np.flatnonzero(np.arange(n) % 3 != k), np.flatnonzero(np.arange(n) % 3 == k))
              for k in range(3)]  # fmt: skip
    fitted: list[int] = []
    real = probe_search.Reduced.__init__

    def counted(self: probe_search.Reduced, raw: np.ndarray, components: int) -> None:
        fitted.append(len(raw))
        real(self, raw, components)

    monkeypatch.setattr(probe_search.Reduced, "__init__", counted)

    def search(signals: np.ndarray) -> probe_search.StateFit:
        return search_states(signals, y, splits, states, strengths=(1e-3, 1.0),
                             fit=least_squares, error=lambda held, z: held - z,
                             score=lambda r: float(np.mean(r**2)))  # fmt: skip

    alone = search(x)
    once = len(fitted)
    with probe_search.reductions_kept():
        first, again = search(x), search(x[:, :1])  # another candidate, the same answers
    assert len(fitted) == 2 * once  # the second search fitted none of its own
    assert np.array_equal(first.probe.weights, alone.probe.weights)
    assert first.probe.selection == alone.probe.selection
    assert np.array_equal(first.errors, alone.errors)
    assert again.probe.hidden_size == width
    with probe_search.reductions_kept():
        other = [HiddenStates(layers, POSITIONS, values[i].copy()) for i in range(n)]
        search(x)
        before = len(fitted)
        search_states(x, y, splits, other, strengths=(1.0,), fit=least_squares,
                      error=np.subtract, score=lambda r: float(np.mean(r**2)))  # fmt: skip
        assert len(fitted) > before  # other answers' states (equal values): fitted anew
