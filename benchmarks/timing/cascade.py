r"""Guarded/plain, side by side in one run: no guard, full-L ESI, the ESI cascade.

    OMP_NUM_THREADS=1 python -m benchmarks.timing cascade --cache .bench-cache/probe \\
        --name sciq-smollm2 --data sciq/test.jsonl --limit 40 --json timing.json

The embedded model on llama.cpp, one thread, three backends of their own (so none pays
for another's hidden-state taps): ``plain`` (the backend's greedy answer with its top-k,
no guard), ``esi`` (``ESIGuard``, L=10, k=100, SOC) and ``cascade`` (the same guard with
``esi_probe``). The probe is distilled from the run ``benchmarks/probe/`` collected
(``--name``: its questions' ESI and states; no label), its label-free band certified on
its held-out estimates; the threshold is ESI's value accepting 80% of those questions.
The questions timed are others from the same set (``--data``, not among the collected).
One at a time, each question goes through the three in turn; then each runs ``batch``
over all of them (batches of 8). Reported: mean seconds per question, guarded/plain
ratios, the share of answers the cascade sent to ESI and its decision agreement with the
full guard on these questions. ``--probe FILE`` takes a probe ``esi-guard distill`` wrote
instead of a collected run (on the guard's own engine; threshold: the 80% quantile of its
held-out ESI values); the questions timed are then ``--data``'s after the first ``--skip``
(in ``--seed`` order: pass the distillation's ``--limit`` and ``--seed``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Answering, data_file, side_by_side
from benchmarks.probe.data import load, usable, window
from esi_guard import ESIGuard
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.calibration.cascade_fit import fit_esi_probe, held_out
from esi_guard.calibration.data import load_examples
from esi_guard.cascade import ESIProbe

__all__ = ["add_arguments", "distilled", "measure"]

BATCH = 8


def distilled(cache: Path, name: str) -> tuple[ESIProbe, float, set[str]]:
    """A probe on a collected run (no label), its guard's threshold, the run's questions."""
    run = usable(cache, name)
    esi = np.array([s["esi"] for s in run.signals])
    states = [h.select(window(run.spec, "window")) for h in run.states]
    probe = fit_esi_probe(run.signals, esi, hidden=states)
    oof = held_out(run.signals, esi, hidden=states)
    probe = probe.model_copy(update={"held_out_estimates": tuple(map(float, oof)),
                                     "held_out_esi": tuple(map(float, esi)),
                                     "model": run.header["model"],
                                     "engine": run.header["engine"]})  # fmt: skip
    questions = {r["question"] for r in _records(cache, name)}
    return probe, float(np.quantile(esi, 0.8)), questions


def _records(cache: Path, name: str) -> list[dict[str, Any]]:
    return load(cache, name).records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--cache", type=Path, help="a collected run's folder (or --probe)")
    parser.add_argument("--probe", type=Path, help="a probe file `esi-guard distill` wrote")
    parser.add_argument("--skip", type=int, default=0, help="with --probe: questions it saw")
    parser.add_argument("--seed", type=int, default=0, help="with --probe: the distill's seed")
    parser.add_argument("--name", default="sciq-smollm2")
    parser.add_argument("--data", default="sciq/test.jsonl")
    parser.add_argument("--limit", type=int, default=40)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time the three side by side; print the figures and return them."""
    path = data_file(args.data)
    if args.probe is not None:
        probe = ESIProbe.read(args.probe)
        threshold = float(np.quantile(probe.held_out_esi, 0.8))
        examples = load_examples(path, seed=args.seed)[args.skip : args.skip + args.limit]
    elif args.cache is not None:
        probe, threshold, seen = distilled(args.cache, args.name)
        examples = [e for e in load_examples(path, seed=7) if e.question not in seen]
        examples = examples[: args.limit]
    else:
        sys.exit("give --cache (a collected run) or --probe (a distilled probe file)")
    answering = Answering()
    prompts = [answering.messages(e.question) for e in examples]
    settings = {"n_variants": 10, "top_k": 100, "max_new_tokens": answering.max_new_tokens,
                "threshold": threshold, "action": "flag"}  # fmt: skip
    plain = LlamaCppBackend.default(n_threads=1)
    full = ESIGuard(backend=LlamaCppBackend.default(n_threads=1), **settings)
    cascade = ESIGuard(backend=LlamaCppBackend.default(n_threads=1), esi_probe=probe, **settings)
    guards = {"esi": full, "cascade": cascade}
    timed = side_by_side(plain, guards, prompts, max_new_tokens=answering.max_new_tokens,
                         batch=BATCH)  # fmt: skip
    one, batched, metas = timed
    cascades = [key for key in guards if key != "esi"]
    ran = {k: float(np.mean([m["decided_by"] == "esi" for m in metas[k]])) for k in cascades}
    agree = {k: float(np.mean([a["decision"] == b["decision"]
                               for a, b in zip(metas["esi"], metas[k], strict=True)]))
             for k in cascades}  # fmt: skip
    out = {"n": len(prompts), "threshold": threshold, "one_at_a_time": one, "batched": batched,
           **timed.ratios(), "esi_share": ran, "agreement": agree,
           "probe": {"layer": probe.hidden.layers if probe.hidden else None,
                     "n_fit": probe.n_fit}}  # fmt: skip
    print(json.dumps(out, indent=1))
    return out
