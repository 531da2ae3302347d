r"""Decisions worth their cost (issue 50): calibration at a user's sizes, the value cascade, cost.

    OMP_NUM_THREADS=1 python -m benchmarks.results.decisions calibration \
        --cache .bench-cache/probe --name triviaqa-smollm2 --name sciq-smollm2 \
        --sizes 150 300 --repeats 3 --json cal.json
    OMP_NUM_THREADS=1 python -m benchmarks.results.decisions coverage --cache .bench-cache/probe \
        --name triviaqa-smollm2 --sizes 300 --repeats 5 --json coverage.json
    OMP_NUM_THREADS=1 python -m benchmarks.results.decisions cascade --cache .bench-cache/probe \
        --name triviaqa-smollm2 --name sciq-smollm2 --json cascade.json
    OMP_NUM_THREADS=1 python -m benchmarks.results.decisions cost --cache .bench-cache/probe \
        --name triviaqa-smollm2 --data triviaqa/subset.jsonl --limit 24 --json cost.json

All four read the runs ``python -m benchmarks.probe collect`` left (the embedded model on
llama.cpp: each question's greedy answer, its free signals, ESI(SOC) L=10 k=100, its
hidden states, containment labels); ``repetition`` comes from the answer's text.

``calibration``: what ``esi-guard calibrate --score combined`` (cross-fitted, the
features selected out of fold, :func:`esi_guard.calibration.crossfit.select`) gives a user
with ``n`` labelled questions. ``--repeats`` times: a stratified random ``n`` of the set
are the user's calibration questions, the rest measure. On the held-out questions, AUROC
of the selected score against ESI alone, the best free signal (chosen on the
calibration questions by their AUROC), and the full combined + hidden score fitted on the
same ``n`` without selection; paired differences with 95% bootstrap intervals per repeat,
and their mean over repeats. ``--sizes all``: 5-fold outer cross-fitting on every
question instead (each fold's selection on the other four). ``--label unanswerable`` (a SQuAD 2.0
run): the same for telling unanswerable questions from answerable ones. ``--plot``: the
learning curve (held-out AUROC against the calibration labels, a panel per set) as a PNG.

``coverage``: whether a threshold chosen for 80% coverage holds it on questions it never
saw (:func:`coverage`): ESI's, and the combined score's with the fold models averaged
(what the guard runs) and refitted (what it ran before), with the AUROC the calibration
reported beside the one the unseen questions give.

``cascade``: the value-of-information cascade against always running ESI. Out-of-fold
``p_wrong`` (5 folds) of the full combined + hidden score (``esi,nll,entropy,max_nll``
and the probe) and of the same without ESI; for each fold, the threshold (the full
score's value accepting 80% of the other folds' questions) and the band
(:func:`esi_guard.calibration.cascade_fit.fit_band`: decisions within 2% of the full score's with
probability 0.9, logit scale) are fitted on the other folds and applied to it. Reported:
the share of questions that run ESI, decision agreement with the full score, and the
AUROC of the cascade's score (the no-ESI ``p_wrong`` outside the band, the full one
inside) against the full score's, paired.

``cost``: guarded/plain side by side on the run's model (``--model``; llama.cpp, one
thread), each arm on its own backend: ``plain`` (the answer and its top-k), ``esi`` (the
full combined + hidden guard: every answer runs ESI), ``free`` (the no-ESI guard: the
answer, its signals and states, no variant) and ``cascade`` (the value cascade). The
scores are fitted on all of ``--name``'s questions; the questions timed are others of the
same set. One at a time (each question through every arm in turn) and in ``batch`` (8 at
a time), mean seconds per question and the ratios.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.probe.data import Run, usable, window
from esi_guard.calibration.cascade_fit import fit_band
from esi_guard.calibration.combined_fit import fit_combined
from esi_guard.calibration.crossfit import Candidate, cross_fit, select
from esi_guard.calibration.metrics import Estimate, auroc, bootstrap, paired_difference
from esi_guard.combined import CombinedScore

__all__ = ["main"]

FREE = ("nll", "entropy", "max_nll")
FULL = Candidate(("esi", *FREE), hidden=True)
"""The full combined + hidden score: the reference decisions (issue 50's goal)."""
NO_ESI = Candidate(FREE, hidden=True)
REQUESTED = ("esi", *FREE, "repetition", "hidden")
"""What the calibration's selection may choose from."""
COVERAGE = 0.8
RESAMPLES = 1000


def _states(run: Run) -> list[Any]:
    spec = window(run.spec, "window")
    return [h.select(spec) for h in run.states]


def _interval(e: Estimate) -> dict[str, float]:
    return {"value": e.value, "low": e.low, "high": e.high}


def _p(model: CombinedScore, signals: list[dict[str, float]], states: list[Any],
       rows: Sequence[int]) -> np.ndarray:  # fmt: skip
    return np.array([model.p_wrong(signals[i], states[i] if model.hidden else None) for i in rows])


def _fit(signals: list[dict[str, float]], y: np.ndarray, states: list[Any],
         candidate: Candidate, rows: Sequence[int], seed: int = 0) -> CombinedScore:  # fmt: skip
    return fit_combined([signals[i] for i in rows], y[list(rows)].astype(int).tolist(),
                        features=candidate.features, seed=seed,
                        hidden=[states[i] for i in rows] if candidate.hidden else None)  # fmt: skip


def calibration(
    run: Run, size: int | str, repeats: int, seed: int, label: str = "wrong"
) -> dict[str, Any]:
    """The selected score at ``size`` calibration questions against its rivals, held out.

    ``label``: what is detected, ``wrong`` answers or (a SQuAD 2.0 run) ``unanswerable``
    questions.
    """
    from sklearn.model_selection import StratifiedKFold, train_test_split

    y = run.labels[label].astype(np.float64)
    states, signals = _states(run), run.signals
    if size == "all":
        splits = list(StratifiedKFold(5, shuffle=True, random_state=seed).split(y, y))
    else:
        splits = []
        for r in range(repeats):
            cal, test = train_test_split(np.arange(len(y)), train_size=int(size), stratify=y,
                                         random_state=seed + r)  # fmt: skip
            splits.append((np.asarray(cal), np.asarray(test)))
    rounds = []
    for cal, test in splits:
        start = time.perf_counter()
        chosen = select([signals[i] for i in cal], y[cal].astype(int).tolist(),
                        requested=REQUESTED, states=[states[i] for i in cal], seed=seed,
                        resamples=200, explain=False)  # fmt: skip
        selected = np.array([chosen.model.p_wrong(signals[i], states[i] if chosen.model.hidden
                                                  else None) for i in test])  # fmt: skip
        full = _p(_fit(signals, y, states, FULL, cal, seed), signals, states, test)
        free_auc = {name: auroc([signals[i][name] for i in cal], y[cal]) for name in FREE}
        best_free = max(free_auc, key=free_auc.__getitem__)
        scores = {"selected": selected, "full": full,
                  "esi": np.array([signals[i]["esi"] for i in test]),
                  "best_free": np.array([signals[i][best_free] for i in test])}  # fmt: skip
        yt = y[test]
        rounds.append({
            "n_cal": len(cal), "n_test": len(test), "wrong_cal": int(y[cal].sum()),
            "chosen": chosen.chosen.name, "best_free": best_free,
            "auroc": {k: _interval(bootstrap(auroc, v, yt, n_resamples=RESAMPLES))
                      for k, v in scores.items()},
            "difference": {f"selected - {k}": _interval(paired_difference(
                auroc, scores["selected"], scores[k], yt, n_resamples=RESAMPLES))
                for k in ("esi", "best_free", "full")},
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
        print(f"  {run.name} at {size}: chose {chosen.chosen.name}, "
              f"{rounds[-1]['seconds']:.0f} s", flush=True)  # fmt: skip
    mean = {key: float(np.mean([r["difference"][key]["value"] for r in rounds]))
            for key in rounds[0]["difference"]}  # fmt: skip
    return {"dataset": run.name, "label": label, "size": size, "n": len(y), "rounds": rounds,
            "mean_difference": mean,
            "never_below_best_single": all(
                r["difference"][f"selected - {k}"]["high"] >= 0
                for r in rounds for k in ("esi", "best_free"))}  # fmt: skip


def coverage(run: Run, size: int, repeats: int, seed: int, target: float = COVERAGE,
             nested: bool = True) -> dict[str, Any]:  # fmt: skip
    """Does a threshold chosen for ``target`` coverage hold it on questions it never saw?

    ``repeats`` stratified splits: ``size`` calibration questions, the rest unseen. On the
    calibration questions, as ``esi-guard calibrate --select coverage`` does: ESI's
    threshold (:func:`by_coverage` on their scores), and the selected combined score's
    (:func:`select`). On the unseen questions, the share accepted: ESI's; the combined
    score as the guard runs it now (``after``: the fold models averaged, the threshold
    the coverage quantile of that score on the calibration questions), as it ran before
    (``before``: the kept candidate refitted on every calibration question, the threshold
    on the out-of-fold ``p_wrong``), and between the two (``average_oof_threshold``: the
    average with the out-of-fold threshold); and the AUROC the calibration reported (out
    of fold; nested) against the one the unseen questions give.
    """
    from sklearn.model_selection import train_test_split

    from esi_guard.calibration.thresholds import by_coverage

    y = run.labels["wrong"].astype(np.float64)
    states, signals = _states(run), run.signals
    esi = np.array([s["esi"] for s in signals])
    rounds = []
    for r in range(repeats):
        cal, test = (np.asarray(part) for part in train_test_split(
            np.arange(len(y)), train_size=size, stratify=y, random_state=seed + r))  # fmt: skip
        start = time.perf_counter()
        chosen = select([signals[i] for i in cal], y[cal].astype(int).tolist(),
                        requested=REQUESTED, states=[states[i] for i in cal], seed=seed,
                        resamples=200, explain=False, nested=nested)  # fmt: skip
        threshold = by_coverage(chosen.p_wrong, y[cal], target).threshold
        own = by_coverage(_p(chosen.model, signals, states, cal), y[cal], target).threshold
        refit = _fit(signals, y, states, chosen.chosen, cal, seed)
        after, before = _p(chosen.model, signals, states, test), _p(refit, signals, states, test)
        esi_threshold = by_coverage(esi[cal], y[cal], target).threshold
        yt = y[test]
        rounds.append({
            "n_cal": len(cal), "n_test": len(test), "wrong_cal": int(y[cal].sum()),
            "chosen": chosen.chosen.name, "target": target,
            "coverage": {"esi": float(np.mean(esi[test] <= esi_threshold)),
                         "after": float(np.mean(after <= own)),
                         "average_oof_threshold": float(np.mean(after <= threshold)),
                         "before": float(np.mean(before <= threshold))},
            "auroc": {"reported_oof": _interval(chosen.table[chosen.chosen.name]),
                      "reported_nested": None if chosen.nested is None
                      else _interval(chosen.nested),
                      "unseen_after": _interval(bootstrap(auroc, after, yt,
                                                          n_resamples=RESAMPLES)),
                      "unseen_before": _interval(bootstrap(auroc, before, yt,
                                                           n_resamples=RESAMPLES)),
                      "unseen_esi": _interval(bootstrap(auroc, esi[test], yt,
                                                        n_resamples=RESAMPLES))},
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
        c = rounds[-1]["coverage"]
        print(f"  {run.name} split {r}: {chosen.chosen.name}; coverage at {target}: "
              f"esi {c['esi']:.3f} after {c['after']:.3f} before {c['before']:.3f} "
              f"({rounds[-1]['seconds']:.0f} s)", flush=True)  # fmt: skip
    mean = {k: float(np.mean([r["coverage"][k] for r in rounds])) for k in rounds[0]["coverage"]}
    spread = {k: float(np.std([r["coverage"][k] for r in rounds])) for k in mean}
    return {"dataset": run.name, "size": size, "n": len(y), "target": target,
            "rounds": rounds, "mean_coverage": mean, "sd_coverage": spread}  # fmt: skip


def cascade(run: Run, seed: int) -> dict[str, Any]:
    """The value cascade against the full score, out of fold (see the module's text)."""
    from sklearn.model_selection import StratifiedKFold

    y = run.labels["wrong"].astype(np.float64)
    states, signals = _states(run), run.signals
    splits = list(StratifiedKFold(5, shuffle=True, random_state=seed).split(y, y))
    full = cross_fit(signals, y, states, FULL, splits, seed=seed)[0]
    cheap = cross_fit(signals, y, states, NO_ESI, splits, seed=seed)[0]
    folds = np.empty(len(y), dtype=np.int_)
    ran = np.zeros(len(y), dtype=bool)
    agree = np.zeros(len(y), dtype=bool)
    score = np.empty(len(y))
    bands = []
    for k, (other, fold) in enumerate(splits):
        folds[fold] = k
        threshold = float(np.quantile(full[other], COVERAGE))
        band = fit_band(cheap[other], full[other], threshold, max_disagreement=0.02, delta=0.1,
                        logit=True)  # fmt: skip
        low, high = (band.low, band.high) if band is not None else (-np.inf, np.inf)
        bands.append({"threshold": threshold, "low": low, "high": high,
                      "fitted": None if band is None else band.fitted})  # fmt: skip
        inside = (cheap[fold] >= low) & (cheap[fold] <= high)
        ran[fold] = inside
        score[fold] = np.where(inside, full[fold], cheap[fold])
        mine = np.where(inside, full[fold] > threshold, cheap[fold] > threshold)
        agree[fold] = mine == (full[fold] > threshold)
    return {
        "dataset": run.name, "n": len(y), "wrong": int(y.sum()), "bands": bands,
        "esi_share": float(ran.mean()), "agreement": float(agree.mean()),
        "auroc": {name: _interval(bootstrap(auroc, v, y, groups=folds, n_resamples=RESAMPLES))
                  for name, v in (("full", full), ("no_esi", cheap), ("cascade", score))},
        "difference": {f"{name} - full": _interval(paired_difference(
            auroc, v, full, y, groups=folds, n_resamples=RESAMPLES))
            for name, v in (("no_esi", cheap), ("cascade", score))},
    }  # fmt: skip


def cost(
    run: Run, cache: Path, data: Path, limit: int, seed: int, model: str = "default"
) -> dict[str, Any]:
    """Guarded/plain side by side on the run's model (see the module's text)."""
    from benchmarks.common import Answering, llamacpp_backend, side_by_side
    from esi_guard import ESIGuard
    from esi_guard.calibration.data import load_examples

    y = run.labels["wrong"].astype(np.float64)
    states, signals = _states(run), run.signals
    every = range(len(y))
    from sklearn.model_selection import StratifiedKFold

    full_model = _fit(signals, y, states, FULL, every, seed)
    free_model = _fit(signals, y, states, NO_ESI, every, seed)
    splits = list(StratifiedKFold(5, shuffle=True, random_state=seed).split(y, y))
    full_oof = cross_fit(signals, y, states, FULL, splits, seed=seed)[0]
    threshold = float(np.quantile(full_oof, COVERAGE))  # as the CLI chooses: out of fold
    band = fit_band(cross_fit(signals, y, states, NO_ESI, splits, seed=seed)[0], full_oof,
                    threshold, max_disagreement=0.02, delta=0.1, logit=True)  # fmt: skip
    if band is None:
        msg = "no band certifies 2% disagreement on this run"
        raise SystemExit(msg)
    from benchmarks.probe.data import load

    asked = {r["question"] for r in load(cache, run.name).records}  # timed: the set's others
    examples = [e for e in load_examples(data, seed=7) if e.question not in asked][:limit]
    answering = Answering()
    prompts = [answering.messages(e.question) for e in examples]
    settings = {"n_variants": 10, "top_k": 100, "max_new_tokens": answering.max_new_tokens,
                "threshold": threshold, "action": "flag"}  # fmt: skip
    plain = llamacpp_backend(model)
    guards = {
        "esi": ESIGuard(backend=llamacpp_backend(model), combined=full_model, **settings),
        "free": ESIGuard(backend=llamacpp_backend(model), combined=free_model, **settings),
        "cascade": ESIGuard(backend=llamacpp_backend(model), combined=full_model,
                            free_score=free_model, probe_band=band, **settings),
    }  # fmt: skip
    timed = side_by_side(plain, guards, prompts, max_new_tokens=answering.max_new_tokens)
    one, batched, metas = timed
    decisions = {k: [m["decision"] for m in metas[k]] for k in guards}
    return {
        "dataset": run.name, "n": len(prompts), "threshold": threshold,
        "band": [band.low, band.high], "band_fitted": band.fitted,
        "one_at_a_time": one, "batched": batched, **timed.ratios(),
        "batch_over_one": {k: batched[k] / one[k] for k in one},
        "esi_share": float(np.mean([m["decided_by"] == "esi" for m in metas["cascade"]])),
        "agreement_with_esi": {k: float(np.mean([a == b for a, b in zip(decisions["esi"], v,
                                                                         strict=True)]))
                               for k, v in decisions.items() if k != "esi"},
    }  # fmt: skip


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """The learning curve: held-out AUROC against calibration labels, one panel per set.

    Each calibration record's rounds (``--repeats`` random draws at each size): the
    selected score, ESI alone and the best free signal, each round's point with its 95%
    bootstrap interval (sizes offset a little so the bars do not hide each other), and
    the mean over rounds as a line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [r for r in records if "rounds" in r and "mean_difference" in r]
    panels = list(dict.fromkeys((r["dataset"], r.get("label", "wrong")) for r in curves))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    series = (
        ("selected", "calibrate --score combined", "C0", 0),
        ("best_free", "best free signal", "C1", 1),
        ("esi", "ESI alone", "C2", 2),
    )
    for ax, (name, label) in zip(axes[0], panels, strict=True):
        ours = sorted((r for r in curves if (r["dataset"], r.get("label", "wrong")) ==
                       (name, label)), key=lambda r: r["rounds"][0]["n_cal"])  # fmt: skip
        sizes = [r["rounds"][0]["n_cal"] for r in ours]
        step = 0.012 * (max(sizes) - min(sizes) or max(sizes))
        for key, legend, colour, shift in series:
            means = []
            for r in ours:
                points = [one["auroc"][key] for one in r["rounds"]]
                means.append(np.mean([p["value"] for p in points]))
                for j, p in enumerate(points):
                    x = r["rounds"][0]["n_cal"] + step * (3 * j + shift - 1)
                    ax.errorbar(x, p["value"], yerr=[[p["value"] - p["low"]],
                                [p["high"] - p["value"]]], fmt="o", ms=3, color=colour,
                                alpha=0.6, lw=1)  # fmt: skip
            ax.plot(sizes, means, "-", color=colour, label=legend)
        versus = "right" if label == "wrong" else "answerable"
        ax.set_title(f"{name}\n({label} vs {versus})", fontsize=9)
        ax.set_xlabel("calibration questions (labels)")
        ax.set_xticks(sizes)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("AUROC on the other questions")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _ci(e: dict[str, float], signed: bool = False) -> str:
    if signed:
        verdict = "tie" if e["low"] <= 0 <= e["high"] else ("gain" if e["low"] > 0 else "loss")
        return f"{e['value']:+.3f} [{e['low']:+.2f}, {e['high']:+.2f}] {verdict}"
    return f"{e['value']:.3f} [{e['low']:.2f}, {e['high']:.2f}]"


def markdown(records: list[dict[str, Any]]) -> str:
    """The records as the results page's tables (one row per set and size, or per set)."""
    lines: list[str] = []
    for r in records:
        if "mean_coverage" in r:
            m, sd = r["mean_coverage"], r["sd_coverage"]
            first = r["rounds"][0]["auroc"]
            nested = first["reported_nested"]
            lines.append(
                f"| {r['dataset']} | {r['size']} / {r['n'] - r['size']} | {len(r['rounds'])} | "
                f"{r['target']:.2f} | {m['esi']:.3f} ± {sd['esi']:.3f} | "
                f"{m['before']:.3f} ± {sd['before']:.3f} | {m['after']:.3f} ± {sd['after']:.3f} | "
                f"{_ci(first['reported_oof'])} | {'n/a' if nested is None else _ci(nested)} | "
                f"{_ci(first['unseen_after'])} |")  # fmt: skip
        elif "rounds" in r:
            for i, one in enumerate(r["rounds"]):
                a, d = one["auroc"], one["difference"]
                lines.append(
                    f"| {r['dataset']} | {one['n_cal']} ({one['wrong_cal']} wrong) | {i} | "
                    f"{one['chosen']} | {_ci(a['selected'])} | {_ci(a['esi'])} | "
                    f"{_ci(a['best_free'])} ({one['best_free']}) | {_ci(a['full'])} | "
                    f"{_ci(d['selected - esi'], True)} | {_ci(d['selected - best_free'], True)} "
                    f"| {_ci(d['selected - full'], True)} |")  # fmt: skip
        elif "bands" in r:
            a, d = r["auroc"], r["difference"]
            lines.append(
                f"| {r['dataset']} | {r['n']} ({r['wrong']} wrong) | {_ci(a['full'])} | "
                f"{_ci(a['no_esi'])} | {_ci(a['cascade'])} | {_ci(d['no_esi - full'], True)} | "
                f"{_ci(d['cascade - full'], True)} | {r['esi_share']:.1%} | "
                f"{r['agreement']:.3f} |")  # fmt: skip
        else:
            one, b = r["one_at_a_time"], r["batched"]
            for arm in ("plain", "esi", "free", "cascade"):
                ratio = "1" if arm == "plain" else (
                    f"{r['ratio_one'][arm]:.2f}x / {r['ratio_batched'][arm]:.2f}x")  # fmt: skip
                lines.append(f"| {arm} | {one[arm]:.3f} | {b[arm]:.3f} | {ratio} | "
                             f"{r['batch_over_one'][arm]:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``calibration``, ``coverage``, ``cascade`` or ``cost``: print the records, write them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("calibration", "coverage", "cascade", "cost"))
    parser.add_argument("--cache", type=Path, default=Path(".bench-cache/probe"))
    parser.add_argument("--name", action="append", default=[])
    parser.add_argument("--sizes", nargs="+", default=["150", "300"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default="triviaqa/subset.jsonl")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--model", default="default",
                        help="cost: the run's model: 'default', a known name, a .gguf")  # fmt: skip
    parser.add_argument(
        "--label",
        choices=("wrong", "unanswerable"),
        default="wrong",
        help="calibration: what is detected (unanswerable: a SQuAD 2.0 run)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="write the table rows here")
    parser.add_argument("--plot", type=Path, help="calibration: draw the learning curve here")
    args = parser.parse_args(argv)
    records: list[dict[str, Any]] = []
    for name in args.name or ["triviaqa-smollm2"]:
        run = usable(args.cache, name)
        if args.what == "calibration":
            for size in args.sizes:
                records.append(calibration(run, size if size == "all" else int(size),
                                           args.repeats, args.seed, args.label))  # fmt: skip
        elif args.what == "coverage":
            for size in args.sizes:
                records.append(coverage(run, int(size), args.repeats, args.seed))
        elif args.what == "cascade":
            records.append(cascade(run, args.seed))
        else:
            from benchmarks.common import data_file

            path = data_file(args.data)
            records.append(cost(run, args.cache, path, args.limit, args.seed, args.model))
        print(json.dumps(records[-1], indent=1, default=str), flush=True)
        if args.json:
            args.json.write_text(json.dumps(records, indent=1, default=str))
        if args.markdown:
            args.markdown.write_text(markdown(records) + "\n")
    if args.plot:
        plot(records, args.plot)


if __name__ == "__main__":
    main()
