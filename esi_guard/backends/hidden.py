"""Hidden states a white-box backend reads from an answer's own forward passes, for probes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from esi_guard.exceptions import ConfigurationError

__all__ = [
    "FINAL",
    "POSITIONS",
    "HiddenSpec",
    "HiddenStates",
    "Position",
    "merged",
    "reduce_hidden",
]

Position = Literal["prompt_last", "answer_mean", "answer_last"]
POSITIONS: tuple[Position, ...] = ("prompt_last", "answer_mean", "answer_last")
"""Where a hidden state is read, among the states behind the answer's ``n`` top-k rows.

Row ``t`` comes from the position that chose token ``t`` (the last prompt token for ``t = 0``).
``prompt_last`` is row 0's state, ``answer_mean`` the mean of the ``n`` rows', ``answer_last``
row ``n - 1``'s; an empty answer gives ``prompt_last`` for all three."""

FINAL = -1
"""The layer index of the final norm's output (the LM head's input); ``0..n_layers-1`` are the
blocks' outputs (transformers' ``hidden_states[L + 1]``, llama.cpp's ``l_out-L``)."""


@dataclass(frozen=True)
class HiddenSpec:
    """Which residual-stream states a backend reads from the answer's own pass."""

    layers: tuple[int, ...]
    """Block indices ``0..n_layers-1``, or :data:`FINAL`."""
    positions: tuple[Position, ...] = ("prompt_last", "answer_mean")

    def __post_init__(self) -> None:
        if not self.layers or not self.positions:
            msg = "a HiddenSpec needs at least one layer and one position"
            raise ConfigurationError(msg)
        unknown = [p for p in self.positions if p not in POSITIONS]
        if unknown:
            msg = f"unknown hidden-state positions {unknown}; known: {list(POSITIONS)}"
            raise ConfigurationError(msg)


def merged(*specs: HiddenSpec | None) -> HiddenSpec | None:
    """One spec reading every layer and position of ``specs`` (None: none asked)."""
    given = [spec for spec in specs if spec is not None]
    if not given:
        return None
    layers = tuple(dict.fromkeys(layer for spec in given for layer in spec.layers))
    positions = tuple(dict.fromkeys(p for spec in given for p in spec.positions))
    return HiddenSpec(layers, positions)


@dataclass(frozen=True)
class HiddenStates:
    """One answer's states: ``values[i, j]`` is ``layers[i]`` at ``positions[j]``.

    ``values``: float32, shape ``(len(layers), len(positions), d_model)``.
    """

    layers: tuple[int, ...]
    positions: tuple[Position, ...]
    values: np.ndarray

    @property
    def finite(self) -> bool:
        """Whether every value is finite (an overflow gives inf, a broken kernel NaN)."""
        return bool(np.isfinite(np.asarray(self.values, dtype=np.float64)).all())

    def features(self) -> np.ndarray:
        """The values as one flat float64 vector (layer-major), a probe's input."""
        return np.asarray(self.values, dtype=np.float64).reshape(-1)

    def select(self, spec: HiddenSpec) -> HiddenStates:
        """The states of ``spec``'s layers and positions (a subset of these)."""
        try:
            li = [self.layers.index(layer) for layer in spec.layers]
            pi = [self.positions.index(position) for position in spec.positions]
        except ValueError as exc:
            msg = f"hidden states of {spec} asked from those of {self.layers} x {self.positions}"
            raise ConfigurationError(msg) from exc
        return HiddenStates(spec.layers, spec.positions, self.values[np.ix_(li, pi)])


def reduce_hidden(spec: HiddenSpec, rows: dict[int, np.ndarray], n: int) -> HiddenStates:
    """Reduce each layer's states at the answer's top-k rows to ``spec``'s positions.

    ``rows[layer]`` holds the states behind ``m >= 1`` rows (``m`` may exceed ``n``); the first
    ``max(n, 1)`` are used.
    """
    out = []
    for layer in spec.layers:
        states = np.asarray(rows[layer], dtype=np.float32)
        kept = states[: max(n, 1)]
        by_position = {
            "prompt_last": kept[0],
            "answer_mean": kept.mean(axis=0, dtype=np.float64).astype(np.float32),
            "answer_last": kept[-1],
        }
        out.append(np.stack([by_position[p] for p in spec.positions]))
    return HiddenStates(spec.layers, spec.positions, np.stack(out))
