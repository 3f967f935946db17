"""The node's one timer for its dispatchers' waits (``node.timer.DueTimer``): waits end at
their time or when woken, in time order, with one loop timer for all of them; and the earliest
held entry across dispatchers is known without a pass over them."""

from __future__ import annotations

import asyncio

from tests.unit.helpers import running
from timeshard.clock import SystemClock, wake
from timeshard.node.timer import DueTimer
from timeshard.testing.waits import wait_until


async def test_waits_end_at_their_time_in_order_with_one_loop_timer() -> None:
    timer = DueTimer(SystemClock())
    loop = asyncio.get_running_loop()
    ended: list[int] = []

    async def wait(n: int, delay: float) -> None:
        await timer.sleep(delay, loop.create_future())
        ended.append(n)

    tasks = [asyncio.create_task(wait(n, d)) for n, d in ((1, 0.15), (2, 0.05), (3, 0.10))]
    await asyncio.sleep(0.01)
    armed = timer._handle
    assert armed is not None and timer._armed_for <= loop.time() + 0.05  # the earliest: one
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert ended == [2, 3, 1]
    assert timer._handle is None  # nothing left to wait for: no timer held


async def test_a_wait_woken_early_ends_at_once_and_the_others_still_end() -> None:
    timer = DueTimer(SystemClock())
    loop = asyncio.get_running_loop()
    early = loop.create_future()
    first = asyncio.create_task(timer.sleep(30, early))
    second = asyncio.create_task(timer.sleep(0.05, loop.create_future()))
    await asyncio.sleep(0.01)
    wake(early)
    await asyncio.wait_for(first, 1)
    await asyncio.wait_for(second, 5)


def test_the_earliest_due_entry_across_shards() -> None:
    timer = DueTimer(SystemClock())
    assert timer.next_due() is None
    timer.note_due(1, 500)
    timer.note_due(2, 300)
    timer.note_due(3, 400)
    assert timer.next_due() == 300
    timer.note_due(2, 700)  # shard 2's earliest was made ready: its next is later
    assert timer.next_due() == 400
    timer.note_due(3, None)  # shard 3 holds nothing now
    assert timer.next_due() == 500


async def test_a_node_knows_its_dispatchers_earliest_entry() -> None:
    from timeshard.node import JobSpec

    async with running() as (node, clock):
        now = clock.now_ms()
        await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=now + 3000))
        await wait_until(lambda: node.timer.next_due() == now + 3000, 5, "the entry noted")
