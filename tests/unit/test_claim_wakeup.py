"""After a store outage one node's claims slept through their whole long
poll while jobs were ready. A claim checked the ready queues, then registered for a change one
loop turn later; a push in between was lost. These tests push exactly in that gap."""

from __future__ import annotations

import asyncio

from tests.unit.helpers import advance, running
from timeshard.node.ready import ReadyItem
from timeshard.testing.waits import wait_until


def item(job_id: str) -> ReadyItem:
    return ReadyItem(job_id=job_id, job_type="t", shard=0, fence=0, run_at=0)


async def test_a_push_right_after_the_check_wakes_the_waiting_claim() -> None:
    async with running() as (node, _):
        waiting = asyncio.create_task(node.claims._wait_ready(["t"], timeout=30))
        asyncio.get_running_loop().call_soon(node.ready.push, item("j1"))
        await wait_until(waiting.done, timeout=2, what="the waiting claim to wake")


async def test_room_freed_under_a_concurrency_limit_wakes_the_waiting_claim() -> None:
    async with running() as (node, clock):
        node.ready.push(item("j2"))  # ready, but say the type has no room: it waits for room
        waiting = asyncio.create_task(node.claims._wait_ready(["t"], timeout=30))
        # Waiting for room looks again after at most a second (of the node's clock): short
        # of that, it must still wait, not spin.
        await advance(node, clock, 0.9)
        assert not waiting.done(), "a claim with nothing it may take must wait, not spin"
        node.ready.wake()
        await wait_until(waiting.done, timeout=2, what="the waiting claim to wake")
