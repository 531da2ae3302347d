"""``esi-guard calibrate --score combined``: fit on the user's labelled answers, choose on them.

:func:`fit_all` (default) cross-fits (:mod:`esi_guard.calibration.crossfit`); :func:`fit_on_part`
(``--fit-fraction``) fits on a stratified share and chooses the threshold on the unseen rest, the
split the risk guarantee holds for exactly (docs/calibration.md).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, NamedTuple

import numpy as np

from esi_guard.backends.hidden import HiddenStates
from esi_guard.calibration.combined_fit import fit_combined
from esi_guard.calibration.crossfit import Candidate, Selection, cross_fit, select
from esi_guard.calibration.metrics import auroc, bootstrap, expected_calibration_error
from esi_guard.combined import FEATURES, HIDDEN, SIGNALS, CombinedScore, repetition
from esi_guard.exceptions import ConfigurationError

__all__ = [
    "Combined",
    "decode_states",
    "encode_states",
    "fit_all",
    "fit_on_part",
    "parse_features",
]


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
    """``n_fit``, ``n_select``, ``ece``, held-out AUROC of ``p_wrong`` and ESI (95% bootstrap)."""
    held: list[int] = []  # noqa: RUF012 - a NamedTuple default, never mutated
    """Held-out answers' indices among the records (``p_wrong``'s order); all when cross-fitted."""
    free: CombinedScore | None = None
    """``--cascade``: the value-of-information cascade's score without ESI, fold models averaged."""
    free_p_wrong: list[float] = []  # noqa: RUF012 - a NamedTuple default, never mutated
    """Its out-of-fold ``p_wrong``, in ``p_wrong``'s order."""
    run_time_p: list[float] = []  # noqa: RUF012 - a NamedTuple default, never mutated
    """Cross-fitted: ``model``'s own ``p_wrong`` of these answers, in ``p_wrong``'s order (a
    coverage is chosen on the score the guard runs: it needs no label)."""


def _inputs(
    records: Sequence[dict[str, Any]], features: Sequence[str]
) -> tuple[list[dict[str, float]], list[HiddenStates] | None]:
    """Each record's signals and, if ``hidden`` is asked for, states; refuses what is missing."""
    if any(not r.get("signals") for r in records):
        msg = (
            "these results have no free signals (a cache from an older esi-guard?): "
            "score them again with a new --cache to fit a combined score"
        )
        raise ConfigurationError(msg)
    signals = [{"esi": float(r["score"]), "repetition": repetition(r.get("prediction") or ""),
                **r["signals"]} for r in records]  # fmt: skip
    names = [name for name in features if name != HIDDEN]
    lacking = sorted({n for s in signals for n in names if n not in s})
    if lacking:
        msg = f"these results have no signals {lacking}: score them again with a new --cache"
        raise ConfigurationError(msg)
    if HIDDEN not in features:
        return signals, None
    if any(not r.get("hidden") for r in records):
        msg = (
            "these results have no hidden states: calibrate with --features ...,hidden "
            "on a white-box backend (transformers or llama.cpp) and a new --cache"
        )
        raise ConfigurationError(msg)
    return signals, [decode_states(r["hidden"]) for r in records]


def fit_all(
    records: Sequence[dict[str, Any]],
    wrong: Sequence[int],
    *,
    seed: int,
    features: Sequence[str] = FEATURES,
    folds: int = 5,
    cascade: bool = False,
    resamples: int = 1000,
    nested: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Combined:
    """Cross-fit and select on every scored record (see the module docstring).

    ``cascade``: also cross-fit the kept score less ESI (a cascade's cheap score); ``nested``:
    also ``auroc_nested``, each fold out of its own selection; ``progress``: told each long step.

    Raises:
        ConfigurationError: Missing signals or states, a class too small, ``cascade`` on ESI alone.
    """
    signals, states = _inputs(records, features)
    selection = select(signals, wrong, requested=features, states=states, folds=folds,
                       seed=seed, resamples=resamples, nested=nested,
                       progress=progress)  # fmt: skip
    labels = [int(w) for w in wrong]
    p_wrong = [float(p) for p in selection.p_wrong]
    model = selection.model
    report = {
        "n_fit": len(labels), "n_select": len(labels),
        "ece": expected_calibration_error(p_wrong, labels),
        "auroc_p_wrong": asdict(bootstrap(auroc, p_wrong, labels, groups=selection.folds,
                                          n_resamples=resamples)),
        "auroc_esi": asdict(bootstrap(auroc, [s["esi"] for s in signals], labels,
                                      n_resamples=resamples)),
        "weights": dict(zip(model.features, model.weights, strict=True)),
        **selection.report(),
    }  # fmt: skip
    _probe_report(report, model)
    free: CombinedScore | None = None
    free_p: list[float] = []
    if cascade and model.uses_esi:  # else no variant is ever forced: nothing to cascade
        if progress is not None:
            progress("cross-fitting the cascade's score without ESI")
        free, free_p = _free(selection, features, signals, states, labels, seed)
        report["free"] = {"features": list(free.features) + ([HIDDEN] if free.hidden else []),
                          "auroc": asdict(bootstrap(auroc, free_p, labels, groups=selection.folds,
                                                    n_resamples=resamples))}  # fmt: skip
    run_time = [model.p_wrong(s, None if states is None else states[i])
                for i, s in enumerate(signals)]  # fmt: skip
    return Combined(model, p_wrong, labels, report, list(range(len(labels))), free, free_p,
                    run_time)  # fmt: skip


def _free(
    selection: Selection, features: Sequence[str], signals: list[dict[str, float]],
    states: list[HiddenStates] | None, labels: list[int], seed: int,
) -> tuple[CombinedScore, list[float]]:  # fmt: skip
    """The kept score (or requested features) less ESI, fold-averaged, and its OOF ``p_wrong``."""
    cheap = selection.chosen.without("esi")
    if cheap.empty:
        cheap = Candidate(tuple(f for f in features if f not in ("esi", HIDDEN)),
                          hidden=HIDDEN in features)  # fmt: skip
    if cheap.empty:
        msg = "--cascade needs a feature beside esi (e.g. --features esi,nll,entropy,max_nll)"
        raise ConfigurationError(msg)
    y = np.asarray(labels, dtype=np.float64)
    splits = [(np.flatnonzero(selection.folds != k), np.flatnonzero(selection.folds == k))
              for k in range(int(selection.folds.max()) + 1)]  # fmt: skip
    oof = selection.fit_more(cheap, lambda c: cross_fit(signals, y, states, c, splits,
                                                        seed=seed))  # fmt: skip
    return selection.averaged(cheap), [float(p) for p in oof]


def _probe_report(report: dict[str, Any], model: CombinedScore) -> None:
    if model.hidden is not None:
        probe = model.hidden
        report["probe"] = {"layers": list(probe.layers), "positions": list(probe.positions),
                           "components": probe.components, "strength": model.strength,
                           "selection": probe.selection}  # fmt: skip


def fit_on_part(
    records: Sequence[dict[str, Any]],
    wrong: Sequence[int],
    *,
    fraction: float,
    seed: int,
    features: Sequence[str] = FEATURES,
) -> Combined:
    """Fit on ``fraction`` of the scored ``records`` (labels ``wrong``), hold out the rest.

    ``features``: the signals, and ``hidden`` for a probe (states as :func:`encode_states` wrote).

    Raises:
        ConfigurationError: ``fraction`` not in (0, 1), missing signals or states, a small class.
    """
    from sklearn.model_selection import train_test_split

    if not 0.0 < fraction < 1.0:
        msg = f"--fit-fraction must lie strictly between 0 and 1, got {fraction}"
        raise ConfigurationError(msg)
    names = [name for name in features if name != HIDDEN]
    signals, states = _inputs(records, features)
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
    _probe_report(report, model)
    report["fit"] = "split"
    return Combined(model, p_wrong, labels, report, list(held))
