"""Invariant 2 for a node's own writes while its dispatcher reads: a job created while the
dispatcher's read of the buckets ahead is in flight — the read started before the create's
entry was written, and ends after the node notified its dispatcher of it — is still
dispatched. The embedded node re-reads nothing (it is the only writer, and notifies itself),
so an entry dropped here was never dispatched: acknowledged and never run (found by a Go
worker's burst load test: 1,587 of 20,000 jobs)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tests.unit.helpers import START_MS, advance, settle
from timeshard.clock import FakeClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import BucketEntry
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until


class SlowReads(SqliteStore):
    """While ``hold`` is set, a bucket read answers what it read only once ``release`` is."""

    def __init__(self) -> None:
        super().__init__(":memory:", num_shards=1)
        self.hold = False
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def read_bucket(self, shard: int, minute: int, **kw: Any) -> list[BucketEntry]:
        page = await super().read_bucket(shard, minute, **kw)
        await self._held()
        return page

    async def read_buckets(
        self, shards: Sequence[int], minute: int, **kw: Any
    ) -> dict[int, list[BucketEntry]]:
        pages = await super().read_buckets(shards, minute, **kw)  # the node's refresh
        await self._held()
        return pages

    async def _held(self) -> None:
        if self.hold:
            self.reading.set()
            await self.release.wait()


async def test_a_job_created_while_its_bucket_is_being_read_is_dispatched() -> None:
    clock = FakeClock(START_MS + 10_000)
    store = SlowReads()
    node = Node(
        store=store,
        coordinator=LocalCoordinator(),
        clock=clock,
        config=NodeConfig(dispatch=DispatchConfig(lookahead_s=5, refresh_s=1)),
        node_id="n",
    )
    await node.start()
    try:
        await advance(node, clock, 2)  # read ahead to now + 5 s
        store.hold = True
        clock.advance(1)  # the next refresh reads one more second ahead, and is held
        await wait_until(store.reading.is_set, what="the refresh's read to be in flight")
        # Due in the second that read is taking in: beyond what was read before it.
        job, created = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms() + 4_500)
        )
        assert created
        store.hold = False
        store.release.set()
        await settle(node)
        await advance(node, clock, 7)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id], "the job was never dispatched"
    finally:
        store.release.set()
        await node.stop()
