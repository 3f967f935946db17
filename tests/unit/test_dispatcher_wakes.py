"""A shard dispatcher's loop wakes when it has something to do, and only then: an entry this
node writes wakes it when it is due before the time the loop waits for (a job created due
sooner than the one it waits for fires on time), not when it is due later (a job created
seconds ahead, while others come due every few milliseconds, costs no step of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tests.unit.helpers import START_MS, advance, make_node, settle
from timeshard.clock import FakeClock
from timeshard.node import JobSpec, Node
from timeshard.testing.waits import wait_until


@asynccontextmanager
async def one_shard() -> AsyncIterator[tuple[Node, FakeClock]]:
    """A node of one shard: every job goes to the same dispatcher."""
    node, clock = make_node(shards=1)
    await node.start()
    try:
        yield node, clock
    finally:
        await node.stop()


def count_steps(node: Node) -> list[int]:
    """Each step of shard 0's dispatcher loop, by the (fake) time it ran."""
    d = node.dispatchers[0]
    original = d._step
    steps: list[int] = []

    async def step() -> None:
        steps.append(node.clock.now_ms())
        await original()

    d._step = step  # type: ignore[method-assign]
    return steps


async def create(node: Node, run_at: int) -> str:
    job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=run_at))
    return job.job_id


async def test_an_entry_due_sooner_than_the_wait_wakes_the_loop_and_fires_on_time() -> None:
    async with one_shard() as (node, clock):
        await create(node, START_MS + 3000)
        await advance(node, clock, 0.2, step=0.1)
        soon = await create(node, START_MS + 1000)
        claim = asyncio.create_task(
            node.claims.claim(worker="w", types=["t"], limit=10, wait_s=60, lease_s=30)
        )
        await advance(node, clock, 1.0, step=0.1)  # due, and the other one not for 1.8 s
        await wait_until(claim.done, 10, "the claim of the job due sooner")
        assert [c.job.job_id for c in claim.result()] == [soon]


async def test_an_entry_due_after_the_wait_does_not_wake_the_loop() -> None:
    async with one_shard() as (node, clock):
        await create(node, START_MS + 1000)
        await advance(node, clock, 0.2, step=0.1)
        await settle(node)
        steps = count_steps(node)
        for n in range(5):
            await create(node, START_MS + 2000 + n)
        await settle(node)
        assert steps == [], "an entry due after the loop's wait woke it"
        await create(node, START_MS + 500)
        await wait_until(lambda: bool(steps), 10, "a step for the entry due sooner")
