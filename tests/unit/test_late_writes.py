"""Invariant 4 with two nodes: an entry written by a node that does not own the shard, due
before what the owner has already read, must still be found.

Two nodes share one SQLite file. The owner ``a`` owns every shard and re-reads like a node of a
cluster (it is not the only writer); ``b`` owns none. ``b``'s store is slow: its write lands
after ``a`` has read past the entry's due time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from tests.unit.helpers import (
    START_MS,
    advance,
    owner_and_writer,
    settle,
    wait_until,
)
from timeshard.clock import FakeClock
from timeshard.model import BucketEntry, Job
from timeshard.node import Node
from timeshard.store.base import CreateResult
from timeshard.store.sqlite import SqliteStore


class SlowStore(SqliteStore):
    """Creates land ``delay_s`` (fake seconds) after the call began."""

    def __init__(self, path: Path, clock: FakeClock, delay_s: float) -> None:
        super().__init__(path, num_shards=4)
        self._clock = clock
        self.delay_s = delay_s

    async def create_jobs(
        self, jobs: Sequence[tuple[Job, BucketEntry]], *, fresh: Collection[str] = frozenset()
    ) -> list[CreateResult]:
        await self._clock.sleep(self.delay_s)
        return await super().create_jobs(jobs, fresh=fresh)


@asynccontextmanager
async def slow_writer(tmp_path: Path, delay_s: float) -> AsyncIterator[tuple[Node, Node]]:
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    async with owner_and_writer(db, clock, SlowStore(db, clock, delay_s)) as nodes:
        yield nodes


async def _schedule_slowly(a: Node, b: Node, clock: FakeClock, delay_s: float) -> Job:
    """``b`` schedules a job due now; its write lands ``delay_s`` later, while ``a`` reads."""
    await advance(a, clock, 3)  # a has read ahead to now + lookahead
    task = asyncio.create_task(b.schedule(job_type="t", payload=b"{}", run_at=clock.now_ms()))
    await settle(a)
    await advance(a, clock, delay_s + 0.1, step=0.25)  # the write lands in here
    await wait_until(task.done, what="the slow schedule to return")
    job, created = task.result()
    assert created
    return job


async def test_a_late_entry_from_another_node_is_read_again(tmp_path: Path) -> None:
    """Landed 2 s after its due time: the owner's re-read of the last ``reread_s`` finds it
    (before the fix the re-read began where the previous refresh began, after its time)."""
    async with slow_writer(tmp_path, delay_s=2.0) as (a, b):
        clock = a.clock
        assert isinstance(clock, FakeClock)
        job = await _schedule_slowly(a, b, clock, 2.0)
        await advance(a, clock, 2)
        claimed = await a.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]
        assert claimed[0].job.started_at >= job.run_at


async def test_an_entry_that_landed_very_late_is_written_again_due_now(tmp_path: Path) -> None:
    """Landed 20 s after its due time, beyond any re-read window: the writer writes the entry
    again, due now, and the owner finds that one."""
    async with slow_writer(tmp_path, delay_s=20.0) as (a, b):
        clock = a.clock
        assert isinstance(clock, FakeClock)
        job = await _schedule_slowly(a, b, clock, 20.0)
        await advance(a, clock, 3)
        claimed = await a.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]
