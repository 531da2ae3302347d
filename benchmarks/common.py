"""What the benchmark scripts share: stage timing and the greedy tokens' log-probabilities."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from esi_guard.backends import Generation

__all__ = ["Clock", "token_logprobs"]


class Clock:
    """Wall seconds per named stage, summed over a data set."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the block's wall time to ``name``."""
        start = time.perf_counter()
        yield
        self.seconds[name] += time.perf_counter() - start


def token_logprobs(gen: Generation) -> list[float]:
    """The greedy tokens' log-probabilities, normalised over the top-100 logits."""
    values = gen.topk.values
    norm = np.logaddexp.reduce(values, axis=1)
    return [float(values[t, 0] - norm[t]) for t in range(len(gen.token_ids))]
