"""Invariant 2 across a store outage: an entry another node wrote just before the owner's store
went away must still be read when the store answers again, however long the outage lasted.

The owner re-reads a window before now on each refresh for other nodes' late entries. That
window has to reach back to the last read that succeeded, not just ``reread_s`` before the
moment the store answered again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.unit.helpers import START_MS, advance, owner_and_writer, settle
from timeshard.clock import FakeClock
from timeshard.errors import StoreUnavailable
from timeshard.model import BucketEntry
from timeshard.node import JobSpec
from timeshard.store.sqlite import SqliteStore


class OutageStore(SqliteStore):
    """The owner's view of the store: while ``down``, reading a bucket fails as an unreachable
    store does."""

    down = False

    async def read_bucket(self, shard: int, minute: int, **kw: object) -> list[BucketEntry]:
        if self.down:
            raise StoreUnavailable("connection refused (outage injected by the test)")
        return await super().read_bucket(shard, minute, **kw)  # type: ignore[arg-type]

    async def read_buckets(
        self, shards: Sequence[int], minute: int, **kw: Any
    ) -> dict[int, list[BucketEntry]]:
        if self.down:  # the node's refresh of every shard at once
            raise StoreUnavailable("connection refused (outage injected by the test)")
        return await super().read_buckets(shards, minute, **kw)


async def _outage_after_a_foreign_write(tmp_path: Path, outage_s: float) -> None:
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    owner_store = OutageStore(db, num_shards=4)
    writer_store = SqliteStore(db, num_shards=4)
    async with owner_and_writer(db, clock, writer_store, owner_store=owner_store) as (a, b):
        await advance(a, clock, 3)  # a has read ahead to now + lookahead
        job, created = await b.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms() + 1_000)
        )  # b owns nothing: a hears of it only by reading
        assert created
        owner_store.down = True
        await advance(a, clock, outage_s)
        owner_store.down = False
        await advance(a, clock, 3)
        await settle(a)
        claimed = await a.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id], (
            f"job written by another node before a {outage_s:g} s outage was never read"
        )
        assert claimed[0].job.started_at >= job.run_at


async def test_an_entry_written_before_an_outage_longer_than_the_reread_is_read_after_it(
    tmp_path: Path,
) -> None:
    """12 s without the store, past the 5 s re-read window (a Cassandra restart takes 13-16 s)."""
    await _outage_after_a_foreign_write(tmp_path, outage_s=12)


async def test_an_entry_written_before_an_outage_of_many_minutes_is_read_after_it(
    tmp_path: Path,
) -> None:
    """Long enough that the due time is several minute buckets behind when the store is back."""
    await _outage_after_a_foreign_write(tmp_path, outage_s=200)


async def test_an_entry_written_before_a_short_outage_is_read_after_it(tmp_path: Path) -> None:
    await _outage_after_a_foreign_write(tmp_path, outage_s=3)
