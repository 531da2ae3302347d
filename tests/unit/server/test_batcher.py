"""The micro-batcher alone: batches by window and key, bounded queue, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import pytest

from esi_guard.server import MicroBatcher
from esi_guard.server._batcher import Full


class Recorder:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[Hashable, list[Any]]] = []
        self.delay = delay
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, key: Hashable, values: list[Any]) -> list[Any]:
        self.calls.append((key, list(values)))
        await self.gate.wait()
        await asyncio.sleep(self.delay)
        return [ValueError(v) if v == "bad" else f"{key}:{v}" for v in values]


async def test_concurrent_requests_share_one_call_and_keys_split_it() -> None:
    run = Recorder()
    batcher = MicroBatcher(run, max_batch=8, window=0.05)
    batcher.start()
    futures = [batcher.submit("a", i) for i in range(5)] + [batcher.submit("b", 9)]
    assert await asyncio.gather(*futures) == ["a:0", "a:1", "a:2", "a:3", "a:4", "b:9"]
    assert sorted((key, len(values)) for key, values in run.calls) == [("a", 5), ("b", 1)]
    await batcher.stop()


async def test_max_batch_one_turns_batching_off_and_an_error_stays_in_place() -> None:
    run = Recorder()
    batcher = MicroBatcher(run, max_batch=1, window=0.05)
    batcher.start()
    results = await asyncio.gather(*(batcher.submit("k", v) for v in ("x", "bad", "y")),
                                   return_exceptions=True)  # fmt: skip
    assert results[0] == "k:x" and results[2] == "k:y"
    assert isinstance(results[1], ValueError)
    assert [len(values) for _, values in run.calls] == [1, 1, 1]
    await batcher.stop()


async def test_batches_grow_while_the_slot_is_busy() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = MicroBatcher(run, max_batch=16, window=0.0)
    batcher.start()
    first = batcher.submit("k", 0)
    await asyncio.sleep(0.05)  # the first call holds the only slot
    rest = [batcher.submit("k", i) for i in range(1, 7)]
    run.gate.set()
    await asyncio.gather(first, *rest)
    assert [len(values) for _, values in run.calls] == [1, 6]
    await batcher.stop()


async def test_a_full_queue_refuses_and_a_cancelled_request_is_dropped() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = MicroBatcher(run, max_batch=4, window=0.0, max_queue=2)
    batcher.start()
    busy = batcher.submit("k", "busy")
    await asyncio.sleep(0.05)
    gone = batcher.submit("k", "gone")
    kept = batcher.submit("k", "kept")
    with pytest.raises(Full):
        batcher.submit("k", "one too many")
    assert batcher.depth == 2
    gone.cancel()
    run.gate.set()
    assert await asyncio.gather(busy, kept) == ["k:busy", "k:kept"]
    assert [values for _, values in run.calls] == [["busy"], ["kept"]]
    await batcher.stop()


async def test_a_call_that_raises_fails_each_of_its_requests() -> None:
    async def broken(key: Hashable, values: list[Any]) -> list[Any]:
        raise RuntimeError("engine down")

    batcher = MicroBatcher(broken, window=0.01)
    batcher.start()
    results = await asyncio.gather(batcher.submit("k", 1), batcher.submit("k", 2),
                                   return_exceptions=True)  # fmt: skip
    assert all(isinstance(r, RuntimeError) for r in results)
    await batcher.stop()


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch >= 1"):
        MicroBatcher(Recorder(), max_batch=0)
