"""``calibrate --score combined``: fit, say what each feature adds, fit a cascade's band.

The fitting is :mod:`esi_guard.calibration.calibrate_combined`'s; this prints what it found.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esi_guard.calibration.calibrate_combined import Combined, fit_all, fit_on_part
from esi_guard.calibration.cascade_fit import fit_band
from esi_guard.calibration.crossfit import TOLERANCE, candidates
from esi_guard.calibration.metrics import Estimate
from esi_guard.cli.output import console, data_name, fail, progress, shown
from esi_guard.cli.run import Run, metrics_table, summary
from esi_guard.combined import HIDDEN
from esi_guard.exceptions import ESIGuardError

__all__ = ["CROSS_FITTED", "FOLDS", "explain", "fit_run", "headline", "kept_rule", "value_band"]

CROSS_FITTED = (
    " (the threshold chosen on out-of-fold p_wrong; the guard runs the fold models' average, "
    "which sits where they did, so it holds approximately; --fit-fraction keeps a split that "
    "holds exactly)"
)
"""Appended to a cross-fitted combined score's guarantee statement (docs/calibration.md)."""

FOLDS = 5
"""Folds of the cross-fit."""


def fit_run(
    run: Run, fraction: float | None, seed: int, features: tuple[str, ...], *,
    cascade: bool = False, resamples: int = 1000,
) -> Combined:  # fmt: skip
    """Fit the combined score on the run's answers, saying first (on stderr) what it fits."""
    scored = [r for r in run.records if r["scored"]]
    progress(_fitting(features, fraction, len(scored), cascade))
    try:
        if fraction is None:
            return fit_all(scored, run.wrong, seed=seed, features=features, folds=FOLDS,
                           cascade=cascade, resamples=resamples,
                           progress=lambda line: progress(f"  {line}..."))  # fmt: skip
        return fit_on_part(scored, run.wrong, fraction=fraction, seed=seed, features=features)
    except ESIGuardError as exc:
        fail(str(exc))


def _fitting(features: Sequence[str], fraction: float | None, n: int, cascade: bool) -> str:
    """The line said before the fit: how many models, and what makes it slow."""
    probe = (
        " (hidden-state probe: minutes; 7 on one core for 600 answers of a 1.5B model)"
        if HIDDEN in features
        else ""
    )
    if fraction is not None:
        return f"fitting the combined score on {fraction:g} of the {n} answers{probe}..."
    then = ", then the cascade's score without ESI" if cascade else ""
    return (
        f"fitting {len(candidates(features))} candidate combined scores on {FOLDS} folds of "
        f"{n} answers{probe}, then each kept feature's contribution{then}, then the whole "
        f"selection again within each fold (the nested estimate)..."
    )


def _kept_name(combined: Combined) -> str:
    """The kept score's features, ``hidden`` for the probe (``nll+entropy+hidden``)."""
    chosen = combined.report.get("chosen")
    if chosen is not None:
        return str(chosen)
    model = combined.model
    return "+".join((*model.features, *((HIDDEN,) if model.hidden is not None else ())))


def headline(combined: Combined, run: Run, data: Sequence[Path], resamples: int) -> None:
    """The kept score's metrics table, printed first; cross-fitted, AUROC is per fold, averaged."""
    p_wrong, wrong, report = combined.p_wrong, combined.wrong, combined.report
    metrics = summary(p_wrong, wrong, resamples)
    cross = report["fit"] == "cross"
    if cross:
        metrics["auroc"] = Estimate(**report["auroc_p_wrong"])
    accuracy = 1 - sum(wrong) / len(wrong)
    where = "out of fold" if cross else f"held out (fitted on {report['n_fit']} others)"
    title = (
        f"P(wrong) of the kept score ({_kept_name(combined)}) on {data_name(data)}, {where}: "
        f"n={len(wrong)}, accuracy {accuracy:.3f}, labels {run.labeller.name}"
    )
    table = metrics_table(metrics, title, wrong)
    table.caption = (
        "the threshold is chosen on this score; AUROC within each fold, averaged"
        if cross else "the threshold is chosen on this score, on these answers"
    )  # fmt: skip
    console.print(table)


def explain(combined: Combined, features: tuple[str, ...]) -> None:
    """How the score was chosen and fitted, and how it does out of sample (after the tables)."""
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
        f"[95% CI] P(wrong) {shown(Estimate(**report['auroc_p_wrong']))} vs ESI "
        f"{shown(Estimate(**report['auroc_esi']))}"
    )
    if "auroc_nested" in report:
        console.print(
            f"on new questions expect AUROC {shown(Estimate(**report['auroc_nested']))}: the "
            "whole selection run again without each fold, the fold scored by what it kept "
            "(the figure above is the best of the candidates on the same folds); the guard "
            f"runs the {report['n_folds']} fold models' average"
        )


def kept_rule(report: dict[str, Any]) -> str:
    """Which rule kept the score: the best out of fold, or one near it, cheaper (no ESI/states)."""
    table = {name: Estimate(**e) for name, e in report["candidates"].items()}
    chosen = report["chosen"]
    best = max(table, key=lambda name: table[name].value)
    kept = table[chosen]
    if kept.value >= table[best].value:
        return f"kept: {chosen}, the best out of fold (AUROC {kept})"
    parts, best_parts = chosen.split("+"), best.split("+")
    saved = [
        what
        for name, what in (("esi", "no ESI"), (HIDDEN, "no states"))
        if name in best_parts and name not in parts
    ]
    cheaper = ", ".join(saved) or "fewer features"
    return (
        f"kept: {chosen} (AUROC {kept}): it is cheaper ({cheaper}) and within {TOLERANCE:g} "
        f"of the best out of fold, which was {best} at AUROC {table[best]}"
    )


def _selection(report: dict[str, Any], features: tuple[str, ...]) -> None:
    """The candidates' out-of-fold AUROC, the kept one, each feature's contribution."""
    rows = ", ".join(f"{name} {Estimate(**e)}" for name, e in report["candidates"].items())
    console.print(f"out-of-fold AUROC [95% CI] of each candidate: {rows}")
    for name, why in report["skipped"].items():
        console.print(f"not fitted: {name} ({why})")
    left = [f for f in features if f not in report["chosen"].split("+")]
    console.print(kept_rule(report) + (f"; left out: {', '.join(left)}" if left else ""))
    for name, e in report["contributions"].items():
        estimate = Estimate(e["value"], e["low"], e["high"])
        console.print(
            f"contribution of {name}: {estimate.value:+.3f} [{estimate.low:+.3f}, "
            f"{estimate.high:+.3f}] AUROC, paired, out of fold: {e['verdict']}"
        )


def value_band(combined: Combined, threshold: float, most: float, delta: float) -> dict[str, Any]:
    """The threshold file's ``free_score`` and ``probe_band``; the command ends if none fits."""
    assert combined.free is not None  # fit_run(..., cascade=True)
    progress("fitting the cascade's band (where ESI can change the decision)...")
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
