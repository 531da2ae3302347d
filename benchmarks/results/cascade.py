r"""The ESI probe and the ESI cascade (issue 38), from the runs ``benchmarks/probe/`` collected.

    OMP_NUM_THREADS=1 python -m benchmarks.results.cascade --cache .bench-cache/probe \\
        --json cascade.json --markdown cascade.md

Every collected question holds its greedy answer's free signals and hidden states, its
full-L ESI (SOC, L=10, k=100; llama.cpp) and its label, so both rows are measured on the
same questions without running the model again. Cross-fitting, repeated: each set is
split in two halves (stratified on the label); on one half the ESI probe is distilled
(:func:`~esi_guard.calibration.cascade_fit.fit_esi_probe`, on the questions' ESI only, no
label), the guard's threshold chosen (ESI's value accepting ``--coverage`` of the half:
label-free, as ``calibrate --select coverage``) and the cascade's band fitted
(:func:`~esi_guard.calibration.cascade_fit.label_free_band` on the half's out-of-fold
estimates, at most 2% disagreement with probability 0.9); on the other half they are
measured, and the halves swap. Reported per set:

* "ESI probe": held-out Spearman and R^2 with ESI; its AUROC for wrong answers, paired
  against full-L ESI on the same questions;
* "ESI cascade": each question scored by the probe where it decided and by ESI where ESI
  ran; AUROC paired against ESI, decision agreement with full-L ESI at the threshold, the
  share of answers that ran ESI. Its band is the guard's label-free one
  (:func:`~esi_guard.calibration.cascade_fit.label_free_band`: certified on the half's
  held-out estimates); "(quantile band)" uses the threshold +- the probe's 98% quantile of
  ``|ESI - estimate|``;
* the cost: guarded/plain from the run's stage timings (``generate`` with the states,
  ``force``: ESI's teacher-forcing): full ESI ``(g + f) / g``, the cascade ``(g + share *
  f) / g``. ``python -m benchmarks.timing cascade`` times the guards themselves side by side.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from benchmarks.probe.data import load, runs, usable, window
from esi_guard.calibration.cascade_fit import fit_esi_probe, held_out, label_free_band
from esi_guard.calibration.metrics import auroc, bootstrap, paired_difference
from esi_guard.cascade import Band

__all__ = ["evaluate", "markdown"]

RESAMPLES = 2000
CERTIFIED, QUANTILE = "ESI cascade", "ESI cascade (quantile band)"
MAX_DISAGREEMENT, DELTA = 0.02, 0.1


def _interval(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    low, high = np.nanpercentile(values, [2.5, 97.5])
    return float(low), float(high)


def _rank_quality(estimate: np.ndarray, esi: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Spearman and R^2 with their 95% bootstrap intervals."""

    def both(picks: np.ndarray) -> tuple[float, float]:
        e, y = estimate[picks], esi[picks]
        r2 = 1 - float(np.sum((y - e) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-300)
        return float(spearmanr(e, y)[0]), r2

    rng = np.random.default_rng(seed)
    draws = np.array([both(rng.integers(0, esi.size, esi.size)) for _ in range(1000)])
    rho, r2 = both(np.arange(esi.size))
    (rl, rh), (ql, qh) = _interval(draws[:, 0]), _interval(draws[:, 1])
    return {"spearman": rho, "spearman_low": rl, "spearman_high": rh,
            "r2": r2, "r2_low": ql, "r2_high": qh}  # fmt: skip


def _halves(y: np.ndarray, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedKFold

    split = StratifiedKFold(2, shuffle=True, random_state=seed)
    return [(a, b) for a, b in split.split(np.zeros(len(y)), y)]


def evaluate(cache: Path, name: str, *, repeats: int, coverage: float) -> list[dict[str, Any]]:
    """One set's records: the probe's and the cascade's rows, pooled over the repeats."""
    run = usable(cache, name)
    y = run.labels["wrong"]
    esi = np.array([s["esi"] for s in run.signals])
    spec = window(run.spec, "window")
    states = [h.select(spec) for h in run.states]
    force = _seconds(cache, name, "force", len(esi))
    estimate = np.zeros(len(esi))
    paths = {CERTIFIED: np.zeros(len(esi)), QUANTILE: np.zeros(len(esi))}
    cascade_score = {k: np.zeros(len(esi)) for k in paths}
    agree = {k: np.zeros(len(esi)) for k in paths}
    chosen: list[str] = []
    for repeat in range(repeats):
        for fit, test in _halves(y, repeat):
            sig = [run.signals[i] for i in fit]
            probe = fit_esi_probe(sig, esi[fit], hidden=[states[i] for i in fit], seed=repeat)
            hidden = probe.hidden
            if hidden is not None:
                chosen.append(f"{hidden.layers[0]}/{'+'.join(hidden.positions)}")
            est = np.array([probe.estimate(run.signals[i], states[i]) for i in test])
            estimate[test] += est / repeats
            threshold = float(np.quantile(esi[fit], coverage))
            oof = held_out(sig, esi[fit], hidden=[states[i] for i in fit], seed=repeat)
            probe = probe.model_copy(update={"held_out_estimates": tuple(oof),
                                             "held_out_esi": tuple(esi[fit])})  # fmt: skip
            bands = {
                CERTIFIED: label_free_band(probe, threshold, max_disagreement=MAX_DISAGREEMENT,
                                           delta=DELTA),
                QUANTILE: Band(low=threshold - probe.band, high=threshold + probe.band),
            }  # fmt: skip
            for kind, b in bands.items():
                low, high = b.low, b.high
                ran = (est >= low) & (est <= high)
                mixed = np.where(ran, esi[test], est)
                paths[kind][test] += ran / repeats
                cascade_score[kind][test] += mixed / repeats
                agree[kind][test] += ((mixed > threshold) == (esi[test] > threshold)) / repeats
    common = {"dataset": name, "n": len(esi), "wrong": int(y.sum()), "repeats": repeats,
              "coverage": coverage, "engine": "llamacpp", "cascade": True}  # fmt: skip
    records = []
    for method, values in (("ESI(SOC) L=10", esi), ("ESI probe", estimate)):
        e = bootstrap(auroc, values, y, n_resamples=RESAMPLES)
        records.append({**common, "method": method, "auroc": e.value, "auroc_low": e.low,
                        "auroc_high": e.high})  # fmt: skip
    records[-1] |= _rank_quality(estimate, esi) | {"chosen": sorted(set(chosen))}
    diff = paired_difference(auroc, estimate, esi, y, n_resamples=RESAMPLES)
    records.append({**common, "method": "ESI probe - ESI", "paired": True,
                    "auroc_difference": diff.value, "low": diff.low,
                    "high": diff.high})  # fmt: skip
    generate = run.generate
    for kind in paths:
        e = bootstrap(auroc, cascade_score[kind], y, n_resamples=RESAMPLES)
        share = float(np.mean(paths[kind]))
        g, f = float(np.mean(generate)), float(np.mean(force))
        records.append({**common, "method": kind, "auroc": e.value,
                        "auroc_low": e.low, "auroc_high": e.high, "esi_share": share,
                        "agreement": float(np.mean(agree[kind])),
                        "guarded_over_plain": (g + share * f) / g,
                        "full_esi_over_plain": (g + f) / g})  # fmt: skip
        diff = paired_difference(auroc, cascade_score[kind], esi, y, n_resamples=RESAMPLES)
        records.append({**common, "method": f"{kind} - ESI", "paired": True,
                        "auroc_difference": diff.value, "low": diff.low,
                        "high": diff.high})  # fmt: skip
    return records


def _seconds(cache: Path, name: str, stage: str, n: int) -> np.ndarray:
    """Each usable question's ``seconds[stage]`` (in :func:`usable`'s order)."""
    records = [r for r in load(cache, name).records if "esi" in r["scores"]
               and all(k in r["scores"] for k in ("nll", "entropy", "max_nll"))]  # fmt: skip
    values = np.array([r["seconds"].get(stage, 0.0) for r in records])
    return values if values.size == n else np.full(n, float(np.mean(values)))


def markdown(records: Sequence[dict[str, Any]]) -> str:
    """The table: one line per set and row ("" without records)."""
    if not records:
        return ""
    lines = ["| set | n (wrong) | row | AUROC [95% CI] | paired vs ESI | Spearman w/ ESI | "
             "ran ESI | agreement | guarded/plain |", "|" + "---|" * 9]  # fmt: skip
    by = {(r["dataset"], r["method"]): r for r in records}
    for r in records:
        if r.get("paired"):
            continue
        pair = by.get((r["dataset"], f"{r['method']} - ESI"))
        paired = "" if pair is None else (f"{pair['auroc_difference']:+.3f} "
                                          f"[{pair['low']:+.3f}, {pair['high']:+.3f}]")  # fmt: skip
        rho = "" if "spearman" not in r else (f"{r['spearman']:.3f} [{r['spearman_low']:.3f}, "
                                              f"{r['spearman_high']:.3f}]")  # fmt: skip
        share = f"{r['esi_share']:.1%}" if "esi_share" in r else ""
        agreement = f"{r['agreement']:.3f}" if "agreement" in r else ""
        cost = (f"{r['guarded_over_plain']:.2f} (full {r['full_esi_over_plain']:.2f})"
                if "guarded_over_plain" in r else "")  # fmt: skip
        lines.append(f"| {r['dataset']} | {r['n']} ({r['wrong']}) | {r['method']} | "
                     f"{r['auroc']:.3f} [{r['auroc_low']:.3f}, {r['auroc_high']:.3f}] | "
                     f"{paired} | {rho} | {share} | {agreement} | {cost} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Every collected run (or ``--name``), its rows to stdout, ``--json`` and ``--markdown``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--name", action="append", help="a run (sciq-smollm2...); default all")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--coverage", type=float, default=0.8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    records = []
    for name in args.name or runs(args.cache):
        records += evaluate(args.cache, name, repeats=args.repeats, coverage=args.coverage)
        print(markdown([r for r in records if r["dataset"] == name]), flush=True)
    table = markdown(records)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
