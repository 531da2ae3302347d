"""A run's batches spread over Ray actors, one guard each (``--workers N``).

``esi-guard calibrate`` and ``evaluate`` score a labelled set in batches of
``--batch-size`` questions (:mod:`esi_guard.cli.run.score`). With ``--workers N`` the same
batches, cut the same way, go to N Ray actors; each actor builds its own guard once and
scores whole batches with the function the command hands it (the pool knows nothing of a
run's records: nothing here imports the CLI), so every answer is computed in the same
batch as in one process and the records, the cache and the threshold file are the same
(the cache's lines come in the order the batches finish; a run reads them by index).
Batches are written to the cache as they come back, so a run stopped halfway resumes from
it, with or without workers. A worker that dies is restarted by Ray and its batch run again.
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

    Joins the Ray cluster at ``address`` (``RAY_ADDRESS`` when None) or starts a local one
    on loopback (:func:`~esi_guard.ray._cluster.connect`), stopped again by :meth:`close`
    (a joined one is left). Each worker holds ``worker_cpus`` CPUs (give a llama.cpp
    model as many threads).

    Args:
        guard: Builds each worker's guard (pickled to it).
        workers: How many actors.
        examples: The run's examples (each batch's go with it).
        score: Scores one batch in a worker (pickled to it): ``score(guard, examples,
            chunk)`` -> the batch's records, as one process would write them.
        worker_cpus: Ray's ``num_cpus`` for each actor.
        address: The Ray cluster to join.
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
