"""The micro-batcher: concurrent requests gathered into one batched guard call.

Requests with the same key (token limit, stops) arriving within ``window`` share a call; while
every slot is busy they pile up, so batches grow with the load. Pure asyncio: a request cancelled
before its batch starts is taken out; a started batch runs to its end (one call serves all).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Full", "MicroBatcher"]

Run = Callable[[Hashable, list[Any]], Awaitable[Sequence[Any]]]
"""One batched call: the group's key and inputs in, one output (or exception) per input."""


class Full(Exception):
    """The queue holds ``max_queue`` requests already."""


@dataclass
class _Job:
    key: Hashable
    value: Any
    future: asyncio.Future[Any]
    queued: float = field(default=0.0)


class MicroBatcher:
    """Gathers requests into batched calls of ``run`` (see the module).

    Args:
        run: The batched call.
        max_batch: Most requests in one call (1: no batching).
        window: Seconds to wait for more requests after the first.
        max_queue: Most requests queued besides one awaiting a slot; one more raises :class:`Full`.
        slots: Calls that may run at once (1 for a model in process).
        on_batch: Called with each batch's size and its requests' seconds in the queue.
    """

    def __init__(
        self,
        run: Run,
        *,
        max_batch: int = 32,
        window: float = 0.01,
        max_queue: int = 256,
        slots: int = 1,
        on_batch: Callable[[int, list[float]], None] | None = None,
    ) -> None:
        if max_batch < 1 or window < 0 or max_queue < 1 or slots < 1:
            msg = (
                "need max_batch >= 1, window >= 0, max_queue >= 1 and slots >= 1; got "
                f"{max_batch}, {window}, {max_queue}, {slots}"
            )
            raise ValueError(msg)
        self._run = run
        self.max_batch = max_batch
        self.window = window
        self.max_queue = max_queue
        self._on_batch = on_batch
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=max_queue)
        self._slots = asyncio.Semaphore(slots)
        self._tasks: set[asyncio.Task[None]] = set()
        self._collector: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        """Requests waiting for a batch."""
        return self._queue.qsize()

    def start(self) -> None:
        """Start collecting (in the running loop)."""
        if self._collector is None:
            self._collector = asyncio.get_running_loop().create_task(self._collect())

    async def stop(self) -> None:
        """Stop collecting; running batches finish, requests still queued are cancelled."""
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
            self._collector = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().future.cancel()

    def submit(self, key: Hashable, value: Any) -> asyncio.Future[Any]:
        """Queue one request; its future gets its output (or exception). :class:`Full` if full."""
        loop = asyncio.get_running_loop()
        job = _Job(key, value, loop.create_future(), loop.time())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            msg = f"{self.max_queue} requests are waiting already"
            raise Full(msg) from None
        return job.future

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one engine slot (a live stream, which runs outside the batches)."""
        async with self._slots:
            yield

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self._first()]
            try:
                await self._slots.acquire()
            except BaseException:  # stopped: a request taken from the queue is still queued
                _cancel(jobs)
                raise
            try:
                if jobs[0].future.cancelled():
                    jobs = self._gather_now()
                await self._gather(loop, jobs)
            except BaseException:
                self._slots.release()
                _cancel(jobs)
                raise
            groups: dict[Hashable, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            if not groups:  # every request taken went away: the slot is free again
                self._slots.release()
                continue
            waiting = list(groups.values())
            try:
                for index, group in enumerate(groups.values()):
                    if index:
                        await self._slots.acquire()
                    task = loop.create_task(self._call(group, loop.time()))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    waiting.remove(group)
            except BaseException:  # stopped: the groups not started are cancelled as queued
                for group in waiting:
                    _cancel(group)
                raise

    async def _first(self) -> _Job:
        """The next request whose client is still there."""
        while True:
            job = await self._queue.get()
            if not job.future.cancelled():
                return job

    def _gather_now(self) -> list[_Job]:
        """The first request went away while waiting for a slot: the next one queued now."""
        jobs: list[_Job] = []
        while not jobs and not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.cancelled():
                jobs.append(job)
        return jobs

    async def _gather(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> list[_Job]:
        """Add those arriving within the window to ``jobs``, in place so a stop settles them."""
        deadline = loop.time() + self.window
        while len(jobs) < self.max_batch:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0 or not jobs:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:
                    break
            if not job.future.cancelled():
                jobs.append(job)
        return jobs

    async def _call(self, jobs: list[_Job], started: float) -> None:
        try:
            jobs = [job for job in jobs if not job.future.cancelled()]
            if not jobs:
                return
            if self._on_batch is not None:
                self._on_batch(len(jobs), [started - job.queued for job in jobs])
            try:
                outputs = await self._run(jobs[0].key, [job.value for job in jobs])
            except Exception as exc:  # the whole call failed: every request gets it
                outputs = [exc] * len(jobs)
            for job, output in zip(jobs, outputs, strict=True):
                if job.future.done():
                    continue
                if isinstance(output, BaseException):
                    job.future.set_exception(output)
                else:
                    job.future.set_result(output)
        finally:
            self._slots.release()


def _cancel(jobs: list[_Job]) -> None:
    """Cancel requests taken from the queue but never started (as :meth:`stop` does queued)."""
    for job in jobs:
        job.future.cancel()
