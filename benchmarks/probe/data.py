"""A collected probe run read back: what ``collect`` wrote, as ``report`` and the others read it.

:func:`load` reads a run's records and states (every shard's), :func:`runs` lists the runs
in a cache folder, :func:`usable` keeps the questions every method scores, and
:func:`window` names the candidate states of a fitted score. Both halves of the probe use
this module; neither imports the other.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchmarks.cache import Cache
from esi_guard.backends import FINAL, HiddenSpec, HiddenStates
from esi_guard.combined import repetition

__all__ = ["RAW", "Collected", "Run", "load", "run_header", "runs", "usable", "window"]

RAW = {"ESI(SOC) L=10": "esi", "NLL (greedy)": "nll", "mean token entropy": "entropy",
       "max token NLL": "max_nll"}  # fmt: skip
"""The raw signals by method name (higher = more likely wrong)."""


class Collected(NamedTuple):
    """A run read back by :func:`load`, in question order (the questions with states)."""

    records: list[dict[str, Any]]
    """The cached records (``scores``: ``nll``, ``entropy``, ``max_nll``, and ``esi`` where
    SOC changed the question; ``labels``; ``seconds``; ``answer``...)."""
    hidden: np.ndarray
    """float32, (questions, layers, positions, d)."""
    labels: dict[str, np.ndarray]
    """``wrong`` (and ``unanswerable`` on SQuAD 2.0): 0/1 per question."""
    spec: HiddenSpec
    """The layers and positions of ``hidden``'s axes 1 and 2."""

    def states(self) -> list[HiddenStates]:
        """Each question's states as the backends return them (a probe's input)."""
        layers, positions = self.spec.layers, self.spec.positions
        return [HiddenStates(layers, positions, values) for values in self.hidden]


def load(cache_dir: Path, name: str) -> Collected:
    """Every shard's records of run ``name`` (``sciq-smollm2``...) with their states."""
    rows = _done(cache_dir, name)
    records = [rows[i] for i in sorted(rows) if "hidden" in rows[i]]
    files: dict[str, dict[int, np.ndarray]] = {}
    hidden = []
    for record in records:
        file = record["hidden"]
        if file not in files:
            with np.load(cache_dir / f"{name}-hidden" / file) as data:
                files[file] = dict(zip(data["index"].tolist(), data["values"], strict=True))
        hidden.append(files[file][record["index"]].astype(np.float32))
    header = run_header(cache_dir, name)
    spec = HiddenSpec(tuple(header["layers"]), tuple(header["positions"]))
    keys = records[0]["labels"] if records else {}
    labels = {key: np.array([r["labels"][key] for r in records]) for key in keys}
    return Collected(records, np.stack(hidden) if hidden else np.zeros((0,)), labels, spec)


def _done(cache_dir: Path, name: str) -> dict[int, dict[str, Any]]:
    """Every shard's records, as :meth:`Cache.done` reads them (header of the first file)."""
    return Cache(cache_dir, name, run_header(cache_dir, name)).done()


def runs(cache_dir: Path) -> list[str]:
    """The runs in ``cache_dir`` with every shard's file and their states' folder."""
    shards: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for path in cache_dir.glob("*-*of*.jsonl"):
        found = re.fullmatch(r"(.+)-(\d+)of(\d+)\.jsonl", path.name)
        if found:
            shards[found[1]].add((int(found[2]), int(found[3])))
    return sorted(name for name, have in shards.items()
                  if (cache_dir / f"{name}-hidden").is_dir()
                  and all((k, n) in have for _, n in have for k in range(n)))  # fmt: skip


def run_header(cache_dir: Path, name: str) -> dict[str, Any]:
    """The header of run ``name``'s first shard file."""
    first = next(iter(cache_dir.glob(f"{name}-*of*.jsonl")), None)
    if first is None:
        msg = f"no run {name!r} in {cache_dir}"
        raise SystemExit(msg)
    with first.open(encoding="utf-8") as lines:
        return dict(json.loads(lines.readline()))


def window(spec: HiddenSpec, which: str) -> HiddenSpec:
    """The candidate states of a :class:`Method`: collected blocks at 40-80% depth, FINAL.

    Depth is block / blocks (blocks: the last collected block + 1): on the embedded
    model's 30 blocks, 12, 15, 18, 21, 24; on Gemma-3-270M's 18, 9, 11, 13, 14.
    """
    if which == "final":
        return HiddenSpec((FINAL,), spec.positions)
    blocks = [layer for layer in spec.layers if layer != FINAL]
    depth = max(blocks) + 1
    mid = tuple(b for b in blocks if 4 * depth <= 10 * b <= 8 * depth)
    positions = ("prompt_last",) if which == "prompt" else spec.positions
    return HiddenSpec((*mid, FINAL), positions)


class Run(NamedTuple):
    """A collected run's questions that every method scores (ESI defined)."""

    name: str
    header: dict[str, Any]
    signals: list[dict[str, float]]
    states: list[HiddenStates]
    labels: dict[str, np.ndarray]
    generate: np.ndarray
    """Each question's ``seconds.generate`` (its batch's, per question)."""
    spec: HiddenSpec


def usable(cache_dir: Path, name: str) -> Run:
    """Run ``name``'s questions with all four raw signals.

    ESI is absent where SOC changed nothing: those questions are left out of every method.
    """
    c = load(cache_dir, name)
    keep = [i for i, r in enumerate(c.records) if all(k in r["scores"] for k in RAW.values())]
    states = c.states()
    signals = [{**c.records[i]["scores"], "repetition": repetition(c.records[i].get("answer", ""))}
               for i in keep]  # fmt: skip
    return Run(name, run_header(cache_dir, name), signals,
               [states[i] for i in keep], {k: v[keep] for k, v in c.labels.items()},
               np.array([c.records[i]["seconds"].get("generate", 0.0) for i in keep]),
               c.spec)  # fmt: skip
