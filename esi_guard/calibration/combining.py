"""``esi-guard calibrate --score combined``: fit on one part of the data, choose on the other.

The combined score (:mod:`esi_guard.combined`) is fitted on a stratified share of the
scored answers (``fraction``); the threshold is then chosen, by the same rules as for
ESI (the risk guarantee included), on the ``p_wrong`` of the other answers, which the
model never saw, and the calibration error (ECE) is measured there too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, NamedTuple

from esi_guard.calibration.metrics import auroc, bootstrap, expected_calibration_error
from esi_guard.combined import CombinedScore, fit_combined
from esi_guard.exceptions import ConfigurationError

__all__ = ["Combined", "fit_on_part"]


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


def fit_on_part(
    records: Sequence[dict[str, Any]], wrong: Sequence[int], *, fraction: float, seed: int
) -> Combined:
    """Fit on ``fraction`` of the scored ``records`` (labels ``wrong``), hold out the rest.

    Raises:
        ConfigurationError: ``fraction`` outside (0, 1), records without signals (a
            cache written before esi-guard recorded them), or too few answers of a class.
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
    signals = [{"esi": float(r["score"]), **r["signals"]} for r in records]
    try:
        fit, held = train_test_split(list(range(len(records))), train_size=fraction,
                                     stratify=list(wrong), random_state=seed)  # fmt: skip
    except ValueError as exc:  # a class too small to split
        msg = f"cannot split {len(records)} answers for a combined score: {exc}"
        raise ConfigurationError(msg) from exc
    model = fit_combined([signals[i] for i in fit], [wrong[i] for i in fit], seed=seed)
    p_wrong = [model.p_wrong(signals[i]) for i in held]
    labels = [int(wrong[i]) for i in held]
    esi = [signals[i]["esi"] for i in held]
    report = {
        "n_fit": len(fit), "n_select": len(held),
        "ece": expected_calibration_error(p_wrong, labels),
        "auroc_p_wrong": asdict(bootstrap(auroc, p_wrong, labels)),
        "auroc_esi": asdict(bootstrap(auroc, esi, labels)),
        "weights": dict(zip(model.features, model.weights, strict=True)),
    }  # fmt: skip
    return Combined(model, p_wrong, labels, report)
