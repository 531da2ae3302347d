"""A run's batches spread over Ray actors, one guard each (``--workers N``).

``esi-guard calibrate`` and ``evaluate`` score a labelled set in batches of
``--batch-size`` questions (:mod:`esi_guard.cli.run.score`). With ``--workers N`` the same
batches, cut the same way, go to N Ray actors; each actor builds its own guard once and
scores whole batches, so every answer is computed in the same batch as in one process and
the records, the cache and the threshold file are the same (the cache's lines come in the
order the batches finish; a run reads them by index). Batches are written to the cache as
they come back, so a run stopped halfway resumes from it, with or without workers. A worker
that dies is restarted by Ray and its batch run again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from esi_guard._imports import import_extra
from esi_guard.ray._cluster import connect

if TYPE_CHECKING:
    from esi_guard.calibration.data import Example
    from esi_guard.cli.run.cache import RunHeader
    from esi_guard.guard import ESIGuard

ray = import_extra("ray", needed_by="--workers", what="Ray", extra="ray")
actor_pool = import_extra("ray.util.actor_pool", needed_by="--workers", what="Ray", extra="ray")

__all__ = ["ScoringPool"]

Chunk = list[int]
"""The indices of one batch of examples."""


class _Scorer:
    """One worker: its guard, built once, and the run's prompts."""

    def __init__(
        self, guard: Callable[[], ESIGuard], system_prompt: str | None, template: str | None
    ) -> None:
        self.guard = guard()
        self.system_prompt = system_prompt
        self.template = template

    def header(
        self, digest: str, system: str | None, template: str | None, request: dict[str, Any]
    ) -> RunHeader:
        from esi_guard.cli.run.cache import RunHeader

        return RunHeader.of(self.guard, digest, system, template, request)

    def records(
        self, chunk: Chunk, examples: dict[int, Example]
    ) -> tuple[Chunk, list[dict[str, Any]]]:
        """The batch's records; its examples come with it (a restarted worker needs them)."""
        from esi_guard.cli.run.score import score_chunk

        return chunk, score_chunk(self.guard, examples, chunk, self.system_prompt,
                                  self.template)  # fmt: skip


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
        system_prompt: The run's system prompt.
        template: The run's prompt template (``{question}``, ``{context}``).
        worker_cpus: Ray's ``num_cpus`` for each actor.
        address: The Ray cluster to join.
    """

    def __init__(
        self,
        guard: Callable[[], ESIGuard],
        workers: int,
        *,
        examples: Sequence[Example],
        system_prompt: str | None = None,
        template: str | None = None,
        worker_cpus: float = 1.0,
        address: str | None = None,
    ) -> None:
        if workers < 1:
            msg = f"workers must be at least 1, got {workers}"
            raise ValueError(msg)
        self._connected = connect(address)
        scorer = ray.remote(num_cpus=worker_cpus, max_restarts=3, max_task_retries=3)(_Scorer)
        self.examples = examples
        self.actors = [scorer.remote(guard, system_prompt, template) for _ in range(workers)]

    def header(
        self, digest: str, system: str | None, template: str | None, request: dict[str, Any]
    ) -> RunHeader:
        """The run's cache header, from the first worker's guard."""
        return ray.get(self.actors[0].header.remote(digest, system, template, request))  # type: ignore[no-any-return]

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
