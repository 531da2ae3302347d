"""A run's batches spread over Ray actors, one guard each (``--workers N``).

``esi-guard calibrate`` and ``evaluate`` hand N actors the batches one process would score, cut the
same way, and the function that scores one (nothing here imports the CLI), so the records, cache
and threshold file come out the same (cache lines in finishing order; a run reads them by index,
and a stopped run resumes from them). Ray restarts a worker that dies and reruns its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from esi_guard._imports import import_extra
from esi_guard.ray._cluster import connect

if TYPE_CHECKING:
    from esi_guard.calibration.data import Example
    from esi_guard.guard import ESIGuard

ray = import_extra("ray", needed_by="--workers", what="Ray", extra="ray")
actor_pool = import_extra("ray.util.actor_pool", needed_by="--workers", what="Ray", extra="ray")

__all__ = ["ScoringPool"]

Chunk = list[int]
"""The indices of one batch of examples."""

Score = Callable[["ESIGuard", dict[int, "Example"], Chunk], list[dict[str, Any]]]
"""A batch's records from a worker's guard, the batch's examples (by index) and its indices."""


class _Scorer:
    """One worker: its guard, built once, and what scores a batch with it."""

    def __init__(self, guard: Callable[[], ESIGuard], score: Score) -> None:
        self.guard = guard()
        self.score = score

    def call(self, function: Callable[[ESIGuard], Any]) -> Any:
        return function(self.guard)

    def records(
        self, chunk: Chunk, examples: dict[int, Example]
    ) -> tuple[Chunk, list[dict[str, Any]]]:
        """The batch's records; its examples come with it (a restarted worker needs them)."""
        return chunk, self.score(self.guard, examples, chunk)


class ScoringPool:
    """``workers`` Ray actors, each with a guard from ``guard``, scoring a run's batches.

    Joins the Ray cluster at ``address`` or starts a local one on loopback
    (:func:`~esi_guard.ray._cluster.connect`), which :meth:`close` stops (a joined one is left).

    Args:
        guard: Builds each worker's guard (pickled to it).
        workers: How many actors.
        examples: The run's examples (each batch's go with it).
        score: ``score(guard, examples, chunk)`` -> one batch's records, in a worker (pickled).
        worker_cpus: Ray's ``num_cpus`` per actor (give a llama.cpp model as many threads).
        address: The Ray cluster to join (None: ``RAY_ADDRESS``).
    """

    def __init__(
        self,
        guard: Callable[[], ESIGuard],
        workers: int,
        *,
        examples: Sequence[Example],
        score: Score,
        worker_cpus: float = 1.0,
        address: str | None = None,
    ) -> None:
        if workers < 1:
            msg = f"workers must be at least 1, got {workers}"
            raise ValueError(msg)
        self._connected = connect(address)
        scorer = ray.remote(num_cpus=worker_cpus, max_restarts=3, max_task_retries=3)(_Scorer)
        self.examples = examples
        self.actors = [scorer.remote(guard, score) for _ in range(workers)]

    def call(self, function: Callable[[ESIGuard], Any]) -> Any:
        """``function(guard)`` run on the first worker's guard (a run's header, say)."""
        return ray.get(self.actors[0].call.remote(function))

    def records(self, chunks: Sequence[Chunk]) -> Iterator[tuple[Chunk, list[dict[str, Any]]]]:
        """Each batch's records, as the batches finish (any order)."""
        pool = actor_pool.ActorPool(self.actors)
        examples = self.examples

        def send(actor: Any, chunk: Chunk) -> Any:
            return actor.records.remote(chunk, {i: examples[i] for i in chunk})

        yield from pool.map_unordered(send, chunks)

    def close(self) -> None:
        """Stop the workers (and a Ray started here)."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self._connected != "already":
            ray.shutdown()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()
