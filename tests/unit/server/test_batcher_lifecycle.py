"""Micro-batcher lifecycle: a request leaving while it waits for a slot, stop mid-batch."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from esi_guard.server import MicroBatcher


class Gated:
    def __init__(self) -> None:
        self.calls: list[tuple[Hashable, list[Any]]] = []
        self.gate = asyncio.Event()

    async def __call__(self, key: Hashable, values: list[Any]) -> list[Any]:
        self.calls.append((key, list(values)))
        await self.gate.wait()
        return [f"{key}:{v}" for v in values]


async def test_a_request_gone_while_waiting_for_the_slot_does_not_keep_the_slot() -> None:
    run = Gated()
    batcher = MicroBatcher(run, max_batch=4, window=0.0, slots=1)
    batcher.start()
    busy = batcher.submit("k", "busy")
    await asyncio.sleep(0.02)  # "busy" holds the only slot
    gone = batcher.submit("k", "gone")
    await asyncio.sleep(0.02)  # the collector took "gone" and waits for the slot
    gone.cancel()  # its client went away; nothing else is queued
    run.gate.set()
    assert await busy == "k:busy"
    await asyncio.sleep(0.02)  # the collector took the freed slot for "gone"
    later = batcher.submit("k", "later")
    assert await asyncio.wait_for(later, 2) == "k:later"
    await batcher.stop()


async def test_stop_settles_requests_gathered_but_not_yet_started() -> None:
    run = Gated()
    batcher = MicroBatcher(run, max_batch=4, window=0.05, slots=1)
    batcher.start()
    a = batcher.submit("a", 1)
    b = batcher.submit("b", 2)  # same batch, another key: waits for the slot "a" holds
    await asyncio.sleep(0.1)
    stopping = asyncio.ensure_future(batcher.stop())
    await asyncio.sleep(0.02)
    run.gate.set()
    await asyncio.wait_for(stopping, 2)
    assert a.result() == "a:1"
    assert b.done(), "a request the batcher took is left pending forever"
