"""``esi-guard calibrate --score combined``: fit on one part of the data, choose on the other.

The combined score (:mod:`esi_guard.combined`) is fitted on a stratified share of the
scored answers (``fraction``); the threshold is then chosen, by the same rules as for
ESI (the risk guarantee included), on the ``p_wrong`` of the other answers, which the
model never saw, and the calibration error (ECE) is measured there too.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, NamedTuple

import numpy as np

from esi_guard.backends.base import HiddenStates
from esi_guard.calibration.metrics import auroc, bootstrap, expected_calibration_error
from esi_guard.combined import FEATURES, HIDDEN, SIGNALS, CombinedScore, fit_combined
from esi_guard.exceptions import ConfigurationError

__all__ = ["Combined", "decode_states", "encode_states", "fit_on_part", "parse_features"]


def parse_features(text: str) -> tuple[str, ...]:
    """``esi,nll,entropy,hidden`` as names, checked against :data:`SIGNALS` and ``hidden``."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in (*SIGNALS, HIDDEN)]
    if not names or unknown:
        msg = (
            f"--features takes a comma-separated list of {', '.join((*SIGNALS, HIDDEN))}; "
            f"got {text!r}"
        )
        raise ConfigurationError(msg)
    return names


def encode_states(states: dict[str, Any]) -> dict[str, Any]:
    """``ESIResult.as_dict()["hidden"]`` made compact for a cache line (float32, base64)."""
    values = np.asarray(states["values"], dtype=np.float32)
    return {"layers": list(states["layers"]), "positions": list(states["positions"]),
            "shape": list(values.shape),
            "float32": base64.b64encode(values.tobytes()).decode("ascii")}  # fmt: skip


def decode_states(record: dict[str, Any]) -> HiddenStates:
    """The :class:`HiddenStates` of a cache line written by :func:`encode_states`."""
    raw = np.frombuffer(base64.b64decode(record["float32"]), dtype=np.float32)
    return HiddenStates(tuple(record["layers"]), tuple(record["positions"]),
                        raw.reshape(record["shape"]).copy())  # fmt: skip


class Combined(NamedTuple):
    """A fitted combined score and the held-out answers to choose its threshold on."""

    model: CombinedScore
    p_wrong: list[float]
    """``p_wrong`` of the held-out answers."""
    wrong: list[int]
    """Their labels."""
    report: dict[str, Any]
    """``n_fit``, ``n_select``, ``ece`` and the held-out AUROC of ``p_wrong`` and of ESI
    (``value``, ``low``, ``high``: 95% bootstrap)."""
    held: list[int] = []  # noqa: RUF012 - a NamedTuple default, never mutated
    """The held-out answers' indices among the records given (``p_wrong``'s order)."""


def fit_on_part(
    records: Sequence[dict[str, Any]],
    wrong: Sequence[int],
    *,
    fraction: float,
    seed: int,
    features: Sequence[str] = FEATURES,
) -> Combined:
    """Fit on ``fraction`` of the scored ``records`` (labels ``wrong``), hold out the rest.

    ``features``: the signals, and ``hidden`` for a hidden-state probe (the records then
    carry the states, ``hidden``, as :func:`encode_states` wrote them).

    Raises:
        ConfigurationError: ``fraction`` outside (0, 1), records without signals (a
            cache written before esi-guard recorded them) or without the hidden states
            asked for, or too few answers of a class.
    """
    from sklearn.model_selection import train_test_split

    if not 0.0 < fraction < 1.0:
        msg = f"--fit-fraction must lie strictly between 0 and 1, got {fraction}"
        raise ConfigurationError(msg)
    if any(not r.get("signals") for r in records):
        msg = (
            "these results have no free signals (a cache from an older esi-guard?): "
            "score them again with a new --cache to fit a combined score"
        )
        raise ConfigurationError(msg)
    names = [name for name in features if name != HIDDEN]
    lacking = sorted({n for r in records for n in names if n != "esi" and n not in r["signals"]})
    if lacking:
        msg = f"these results have no signals {lacking}: score them again with a new --cache"
        raise ConfigurationError(msg)
    states = None
    if HIDDEN in features:
        if any(not r.get("hidden") for r in records):
            msg = (
                "these results have no hidden states: calibrate with --features ...,hidden "
                "on a white-box backend (transformers or llama.cpp) and a new --cache"
            )
            raise ConfigurationError(msg)
        states = [decode_states(r["hidden"]) for r in records]
    signals = [{"esi": float(r["score"]), **r["signals"]} for r in records]
    try:
        fit, held = train_test_split(list(range(len(records))), train_size=fraction,
                                     stratify=list(wrong), random_state=seed)  # fmt: skip
    except ValueError as exc:  # a class too small to split
        msg = f"cannot split {len(records)} answers for a combined score: {exc}"
        raise ConfigurationError(msg) from exc
    model = fit_combined([signals[i] for i in fit], [wrong[i] for i in fit], seed=seed,
                         features=names, hidden=None if states is None else
                         [states[i] for i in fit])  # fmt: skip
    p_wrong = [model.p_wrong(signals[i], None if states is None else states[i]) for i in held]
    labels = [int(wrong[i]) for i in held]
    esi = [signals[i]["esi"] for i in held]
    report = {
        "n_fit": len(fit), "n_select": len(held),
        "ece": expected_calibration_error(p_wrong, labels),
        "auroc_p_wrong": asdict(bootstrap(auroc, p_wrong, labels)),
        "auroc_esi": asdict(bootstrap(auroc, esi, labels)),
        "weights": dict(zip(model.features, model.weights, strict=True)),
    }  # fmt: skip
    if model.hidden is not None:
        probe = model.hidden
        report["probe"] = {"layers": list(probe.layers), "positions": list(probe.positions),
                           "components": probe.components, "strength": model.strength,
                           "selection": probe.selection}  # fmt: skip
    return Combined(model, p_wrong, labels, report, list(held))
