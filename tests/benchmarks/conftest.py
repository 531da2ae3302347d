"""What the benchmarks' tests share: a synthetic probe run, written as ``collect`` writes it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from benchmarks.cache import Cache
from benchmarks.probe.collect import _save_hidden
from esi_guard.backends import FINAL, POSITIONS, Generation, HiddenStates
from esi_guard.scoring import TopK

WriteRun = Callable[..., None]
"""``write_run(folder, name, rng, rag, n=36)``: see :func:`_write_run`."""


def _write_run(folder: Path, name: str, rng: np.random.Generator, rag: bool, n: int = 36) -> None:
    """A run as ``collect`` writes it: Cache records, states saved by ``_save_hidden``."""
    layers = (4, 8, 9, FINAL)
    header = {"labels": "containment", "model": "fake", "engine": "fake",
              "layers": list(layers), "positions": list(POSITIONS)}  # fmt: skip
    cache = Cache(folder, name, header)
    wrong = np.array([0, 1] * (n // 2) + [0])  # the last: SOC changed nothing, no ESI
    chunk = [(i, None) for i in range(n + 1)]
    topk = TopK(np.zeros((1, 2), np.int64), np.zeros((1, 2)))
    values = rng.normal(size=(n + 1, len(layers), len(POSITIONS), 4)) + wrong[:, None, None, None]
    gens = [Generation("a", (0,), topk, "stop", hidden=HiddenStates(layers, POSITIONS, v))
            for v in values.astype(np.float32)]  # fmt: skip
    file = _save_hidden(folder / f"{name}-hidden", (0, 1), chunk, gens)  # type: ignore[arg-type]
    records = []
    for i in range(n + 1):
        labels = {"wrong": int(wrong[i])} | ({"unanswerable": int(wrong[i])} if rag else {})
        signals = ("esi", "nll", "entropy", "max_nll") if i < n else ("nll", "entropy", "max_nll")
        scores = {k: float(rng.normal() + wrong[i]) for k in signals}
        records.append({"index": i, "hidden": file, "labels": labels, "scores": scores,
                        "seconds": {"generate": 1.0}})  # fmt: skip
    cache.add((0, 1), records)


@pytest.fixture
def write_run() -> WriteRun:
    """Writes a synthetic run (:func:`_write_run`) into a folder."""
    return _write_run
