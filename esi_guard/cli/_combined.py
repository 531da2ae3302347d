"""``calibrate --score combined``: fit, say what each feature adds, fit a cascade's band.

Cross-fitted by default or on a split (``--fit-fraction``); the value-of-information
cascade's band with ``--cascade``.

The fitting is :mod:`esi_guard.calibration.calibrate_combined`'s; this module prints what it found
and turns refusals into the command's errors.
"""

from __future__ import annotations

from typing import Any

from esi_guard.calibration.calibrate_combined import Combined, fit_all, fit_on_part
from esi_guard.calibration.cascade_fit import fit_band
from esi_guard.calibration.metrics import Estimate
from esi_guard.cli.output import console, fail
from esi_guard.cli.run import Run
from esi_guard.exceptions import ESIGuardError

__all__ = ["CROSS_FITTED", "fit_run", "value_band"]

CROSS_FITTED = (
    " (the threshold chosen on out-of-fold p_wrong: exact for the fold models, approximate "
    "for the score refitted on all answers; --fit-fraction keeps a split that holds exactly)"
)
"""Appended to a cross-fitted combined score's guarantee statement (docs/calibration.md)."""


def fit_run(
    run: Run, fraction: float | None, seed: int, features: tuple[str, ...], *,
    cascade: bool = False, resamples: int = 1000,
) -> Combined:  # fmt: skip
    """Fit the combined score on the run's answers; print how it does out of sample."""
    scored = [r for r in run.records if r["scored"]]
    try:
        if fraction is None:
            combined = fit_all(scored, run.wrong, seed=seed, features=features, cascade=cascade,
                               resamples=resamples)  # fmt: skip
        else:
            combined = fit_on_part(scored, run.wrong, fraction=fraction, seed=seed,
                                   features=features)  # fmt: skip
    except ESIGuardError as exc:
        fail(str(exc))
    report = combined.report
    if report["fit"] == "cross":
        _selection(report, features)
    if "probe" in report:
        probe = report["probe"]
        console.print(
            f"hidden-state probe: layer {probe['layers'][0]} (-1: the final norm's output), "
            f"{'+'.join(probe['positions'])}, {probe['components']} PCA components, L2 "
            f"{probe['strength']:g}, chosen by cross-validation on the fitting answers"
        )
    where = (
        f"cross-fitted on all {report['n_fit']} answers ({report['n_folds']} folds); out of fold"
        if report["fit"] == "cross"
        else f"fitted on {report['n_fit']} answers; on the other {report['n_select']}"
    )
    console.print(
        f"combined score: {where} (threshold chosen there): ECE {report['ece']:.3f}, AUROC "
        f"[95% CI] P(wrong) {Estimate(**report['auroc_p_wrong'])} vs ESI "
        f"{Estimate(**report['auroc_esi'])}"
    )
    return combined


def _selection(report: dict[str, Any], features: tuple[str, ...]) -> None:
    """The candidates' out-of-fold AUROC, the kept one, each feature's contribution."""
    rows = ", ".join(f"{name} {Estimate(**e)}" for name, e in report["candidates"].items())
    console.print(f"out-of-fold AUROC [95% CI] of each candidate: {rows}")
    for name, why in report["skipped"].items():
        console.print(f"not fitted: {name} ({why})")
    chosen = report["chosen"]
    left = [f for f in features if f not in chosen.split("+")]
    console.print(
        f"kept: {chosen} (the best out of fold, or the best of a cheaper kind within 0.005 "
        "of it: no ESI, no states)" + (f"; left out: {', '.join(left)}" if left else "")
    )
    for name, e in report["contributions"].items():
        estimate = Estimate(e["value"], e["low"], e["high"])
        console.print(
            f"contribution of {name}: {estimate.value:+.3f} [{estimate.low:+.3f}, "
            f"{estimate.high:+.3f}] AUROC, paired, out of fold: {e['verdict']}"
        )


def value_band(combined: Combined, threshold: float, most: float, delta: float) -> dict[str, Any]:
    """The threshold file's ``free_score`` and ``probe_band``; the command ends if none fits."""
    assert combined.free is not None  # fit_run(..., cascade=True)
    band = fit_band(combined.free_p_wrong, combined.p_wrong, threshold, max_disagreement=most,
                    delta=delta, logit=True)  # fmt: skip
    n = len(combined.p_wrong)
    if band is None:
        fail(
            f"cascade: no band keeps its decisions within {most:g} of the full score's with "
            f"probability >= {1 - delta:g} on these {n} answers; raise --max-disagreement or "
            "calibrate on more examples"
        )
    info = band.fitted or {}
    console.print(
        f"cascade: ESI runs where the no-ESI P(wrong) is in [{band.low:.4f}, {band.high:.4f}] "
        f"({info['esi_share']:.1%} of {n} answers, out of fold); its decisions differ from "
        f"the full score's on {info['disagreement']:.3f} (<= {info['bound']:.3f} with "
        f"probability {1 - delta:g})"
    )
    return {"free_score": combined.free, "probe_band": band}
