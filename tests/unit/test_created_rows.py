"""A job this node created goes to the ready queue as written when it comes due, without a read
of its row: on Cassandra that read (QUORUM, behind the shard's other reads) was a large part of
a job's lateness. The claim still compares the stored row, so a job another node changed since
(cancelled, moved later) is never claimed early or after its cancel."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from timeshard.model import BucketEntry, Job, JobState
from timeshard.node import JobSpec
from timeshard.store.sqlite import SqliteStore

from .helpers import START_MS, advance, running, settle


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The job ids of each ``get_jobs_for`` call any SQLite store makes."""
    seen: list[list[str]] = []
    original = SqliteStore.get_jobs_for

    async def counting(self: SqliteStore, entries: Sequence[BucketEntry]) -> dict[str, Job]:
        seen.append([e.job_id for e in entries])
        return await original(self, entries)

    monkeypatch.setattr(SqliteStore, "get_jobs_for", counting)
    return seen


async def test_a_job_this_node_created_is_made_ready_without_reading_its_row(
    reads: list[list[str]],
) -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        await advance(node, clock, 1.5)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=0, lease_s=30)
        assert [c.job.job_id for c in claimed] == [job.job_id]
        assert claimed[0].job.started_at >= job.run_at
        assert not any(job.job_id in ids for ids in reads), "the row was read before the claim"


async def test_a_job_cancelled_elsewhere_after_its_create_is_not_claimed(
    reads: list[list[str]],
) -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        # Another node's cancel: straight to the store, this node's dispatcher is not told.
        out = await node.store.cancel_job(job.job_id, JobState.SCHEDULED, job.fence, START_MS)
        assert out.applied
        await advance(node, clock, 1.5)
        assert await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=0, lease_s=30) == []
        assert (await node.jobs.get(job.job_id)).state is JobState.CANCELLED
        await settle(node)  # the dispatcher looks at the refused job again
        assert any(job.job_id in ids for ids in reads), "the refused claim was not decided again"
        assert node.dispatchers[job.shard].backlog(clock.now_ms()) == (0, None), "not handled"


async def test_a_job_moved_later_elsewhere_is_not_claimed_before_its_new_time() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        later = START_MS + 12_000
        out = await node.store.reschedule_job(job.job_id, job.fence, later, START_MS)
        assert out.applied
        await advance(node, clock, 6)
        assert await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=0, lease_s=30) == []
        await advance(node, clock, 7)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=0, lease_s=30)
        assert [c.job.job_id for c in claimed] == [job.job_id]
        assert claimed[0].job.started_at >= later
