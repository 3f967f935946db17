"""The burst jobs a Cassandra backlog run found not run 30 s after the burst: a node on the
local coordinator is its shards' only writer, so its dispatchers re-read nothing and rely on
being told of each entry the node writes. A job created while the refresh that first reads
past its due time is in flight (that partition already read, the refresh not yet ended) was
neither read nor taken from the notify, and was never dispatched: the cursor later passed its
minute. The same race as on the embedded store, here on real Cassandra, with the bucket read
held open so it happens every time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import BucketEntry
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.store.cassandra import CassandraStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class HeldReads(CassandraStore):
    """While ``hold`` is set, a bucket read (of one partition, or of many at once) answers
    what it read only once ``release`` is."""

    hold = False
    reading: asyncio.Event
    release: asyncio.Event

    async def read_bucket(self, shard: int, minute: int, **kw: Any) -> list[BucketEntry]:
        page = await super().read_bucket(shard, minute, **kw)
        await self._held()
        return page

    async def read_buckets(self, shards: Any, minute: int, **kw: Any) -> Any:
        pages = await super().read_buckets(shards, minute, **kw)
        await self._held()
        return pages

    async def _held(self) -> None:
        if self.hold:
            self.reading.set()
            await self.release.wait()


async def test_a_job_created_while_its_bucket_read_is_in_flight_runs(
    cassandra_address: str, keyspace: str
) -> None:
    store = HeldReads.from_url(f"cassandra://{cassandra_address}/{keyspace}", num_shards=1)
    store.reading, store.release = asyncio.Event(), asyncio.Event()
    node = Node(
        store=store,
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=NodeConfig(dispatch=DispatchConfig(lookahead_s=2, refresh_s=1)),
        node_id="n",
    )
    await node.start()
    try:
        await asyncio.sleep(1.5)  # the first refreshes have read up to now + 2 s
        store.hold = True
        await asyncio.wait_for(store.reading.wait(), 10)
        # The held refresh reads up to about now + 2 s; the one before it, 1 s less far.
        job, created = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=node.clock.now_ms() + 1_700)
        )
        assert created
        store.hold = False
        store.release.set()
        claimed = await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=8, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id], "the job was never dispatched"
    finally:
        store.release.set()
        await node.stop()
