r"""The hidden-state probe's search: every candidate's fits in one batched call, or one call each.

    python -m benchmarks.timing probe-search --answers 200 --rounds 3

:func:`~esi_guard.calibration.probe_search.search_states` fits every (layer, positions)
candidate x fold x PCA size x strength. It hands all of them to the fit at once, which
takes them in batches of one data width and at most ``_BATCH_BYTES``; before, it called the
fit once per (layer, positions) with that candidate's folds. Both arms run here on the
same answers, round after round: ``batched``, the search as it is; ``per candidate``, the
same search whose fit is called once per candidate (the problems split by the data they
were fitted on). On synthetic answers: standard-normal hidden states (``--hidden`` wide,
``--layers`` layers, three positions), three free signals, labels from a few state
coordinates and noise; the combined score's search (its monotone logistic fit, 5 folds, as
``fit_combined`` runs it). Reported, after a first round untimed: each arm's median
seconds per search over the rounds, their ratio, and whether both chose the same probe,
weights and errors, to the bit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from esi_guard.backends.hidden import HiddenStates, Position
from esi_guard.calibration import probe_search

__all__ = ["add_arguments", "measure"]

FOLDS = 5
Problem = tuple[int, int, float]  # (data, width, strength), as probe_search.Fit takes them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=64, help="hidden state width")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)


def _answers(n: int, width: int, layers: int) -> tuple[list[HiddenStates], list[dict[str, float]],
                                                       np.ndarray]:  # fmt: skip
    rng = np.random.default_rng(0)
    names = (*range(layers - 1), -1)
    positions: tuple[Position, ...] = ("prompt_last", "answer_mean", "answer_last")
    hidden = [HiddenStates(names, positions, rng.normal(size=(layers, 3, width)).astype(np.float32))
              for _ in range(n)]  # fmt: skip
    signals = [{"nll": float(rng.normal()), "entropy": float(rng.normal()),
                "esi": float(rng.random())} for _ in range(n)]  # fmt: skip
    truth = np.array([h.values[1, 1, :4].sum() for h in hidden])
    return hidden, signals, (truth + rng.normal(size=n) > 0).astype(int)


def _per_candidate(fit: probe_search.Fit, folds: int) -> probe_search.Fit:
    """``fit`` called once per candidate: the problems split by the data they use."""

    def split(
        xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], problems: Sequence[Problem]
    ) -> list[tuple[np.ndarray, float]]:
        out: list[Any] = [None] * len(problems)
        for first in range(0, len(xs), folds):
            mine = [n for n, (at, _, _) in enumerate(problems) if first <= at < first + folds]
            asked = [(problems[n][0] - first, *problems[n][1:]) for n in mine]
            found = fit(xs[first : first + folds], ys[first : first + folds], asked)
            for n, one in zip(mine, found, strict=True):
                out[n] = one
        return out

    return split


def _search(hidden: list[HiddenStates], signals: list[dict[str, float]], wrong: np.ndarray,
            fit: probe_search.Fit) -> probe_search.StateFit:  # fmt: skip
    """The combined score's probe search, as ``fit_combined`` runs it, with ``fit``."""
    from sklearn.model_selection import StratifiedKFold

    from esi_guard.calibration.combined_fit import STRENGTHS

    raw = np.array([[s["nll"], s["entropy"], s["esi"]] for s in signals])
    mean, scale = probe_search.standard(raw)
    x, y = (raw - mean) / scale, wrong.astype(np.float64)
    splits = list(StratifiedKFold(FOLDS, shuffle=True, random_state=0).split(x, y))
    return probe_search.search_states(
        x, y, splits, hidden, strengths=STRENGTHS, fit=fit,
        error=lambda held, z: np.logaddexp(0.0, z) - held * z,
        score=lambda r: float(np.sum(r)) / len(y),
    )  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time both arms on the same answers, round after round; print and return it."""
    from esi_guard.calibration.combined_fit import fit_path

    hidden, signals, wrong = _answers(args.answers, args.hidden, args.layers)
    batched = lambda xs, ys, problems: fit_path(xs, ys, problems, 3)  # noqa: E731
    arms = {"batched": batched, "per candidate": _per_candidate(batched, FOLDS)}
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    found: dict[str, probe_search.StateFit] = {}
    for round_ in range(args.rounds + 1):  # the first round warms up, untimed
        for name, fit in arms.items():
            start = time.perf_counter()
            found[name] = _search(hidden, signals, wrong, fit)
            if round_:
                seconds[name].append(time.perf_counter() - start)
    a, b = found["batched"], found["per candidate"]
    same = (a.probe == b.probe and a.intercept == b.intercept and a.strength == b.strength
            and np.array_equal(a.weights, b.weights)
            and np.array_equal(a.errors, b.errors))  # fmt: skip
    record = {
        "answers": args.answers, "hidden": args.hidden, "layers": args.layers,
        "rounds": args.rounds, "candidates": args.layers * len(probe_search.POSITION_SETS),
        "batched_s": statistics.median(seconds["batched"]),
        "per_candidate_s": statistics.median(seconds["per candidate"]),
        "identical": bool(same),
    }  # fmt: skip
    record["ratio"] = record["per_candidate_s"] / record["batched_s"]
    print(f"{args.answers} answers, {record['candidates']} candidates, {args.rounds} rounds "
          f"(median): per candidate {record['per_candidate_s']:.2f} s, batched "
          f"{record['batched_s']:.2f} s, {record['ratio']:.2f}x; the same fit: {same}")  # fmt: skip
    return record
