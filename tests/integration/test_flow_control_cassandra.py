"""Deadlines, priorities and cron spread on real Cassandra, with two nodes sharing one keyspace:
one owns every shard (it dispatches), the other owns none (a client's node). A job scheduled
through the other node and never claimed ends expired at its owner; a claim after the deadline
never applies; the owner hands out higher priorities first; a schedule's occurrences run at
their nominal time plus the schedule's stable offset and keep their nominal ids."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.unit.helpers import FixedCoordinator
from timeshard.clock import SystemClock
from timeshard.model import JobState, Schedule, spread_offset_of
from timeshard.node import JobSpec, Node
from timeshard.store.base import JobClaim
from timeshard.store.cassandra import CassandraStore
from timeshard.testing.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SHARDS = 8


@asynccontextmanager
async def two_nodes(address: str, keyspace: str) -> AsyncIterator[tuple[Node, Node]]:
    url = f"cassandra://{address}/{keyspace}"
    owner = Node(
        store=CassandraStore.from_url(url, num_shards=SHARDS),
        coordinator=FixedCoordinator(range(SHARDS)),
        clock=SystemClock(),
        node_id="owner",
    )
    other = Node(
        store=CassandraStore.from_url(url, num_shards=SHARDS),
        coordinator=FixedCoordinator(()),
        clock=SystemClock(),
        node_id="other",
    )
    await owner.start()
    await other.start()
    try:
        yield owner, other
    finally:
        await other.stop()
        await owner.stop()


async def test_a_job_scheduled_through_another_node_expires_at_its_owner(
    cassandra_address: str, keyspace: str
) -> None:
    async with two_nodes(cassandra_address, keyspace) as (owner, other):
        now = other.clock.now_ms()
        job, _ = await other.jobs.schedule(
            JobSpec(job_type="it.nobody", payload=b"", run_at=now + 500, deadline=now + 2500)
        )

        async def ready() -> bool:
            return owner.ready.count() == 1

        await wait_until(ready, 30, "the owner to hold the job ready")

        async def expired() -> bool:
            return (await other.jobs.get(job.job_id)).state is JobState.EXPIRED

        await wait_until(expired, 30, "the job to expire")
        got = await other.jobs.get(job.job_id)
        assert got.history == () and got.attempt == 0
        assert got.finished_at > got.deadline
        assert "not started by its deadline" in got.last_error
        assert owner.ready.count() == 0
        page = await other.jobs.list_jobs(
            state=JobState.EXPIRED, job_type=None, limit=10, page_token=""
        )
        assert [j.job_id for j in page.jobs] == [job.job_id]
        # A claim written after the deadline does not apply, whichever node sends it.
        late, _ = await other.jobs.schedule(
            JobSpec(job_type="it.nobody2", payload=b"", run_at=now, deadline=now + 1)
        )
        [out] = await other.store.claim_jobs(
            [
                JobClaim(
                    job_id=late.job_id,
                    expect_fence=0,
                    worker="w",
                    now=other.clock.now_ms(),
                    lease_until=other.clock.now_ms() + 30_000,
                )
            ]
        )
        assert not out.applied


async def test_the_owner_hands_out_higher_priorities_first(
    cassandra_address: str, keyspace: str
) -> None:
    async with two_nodes(cassandra_address, keyspace) as (owner, other):
        now = other.clock.now_ms()
        low = [
            (
                await other.jobs.schedule(
                    JobSpec(job_type="it.prio", payload=b"", run_at=now, priority=1)
                )
            )[0]
            for _ in range(6)
        ]
        high = [
            (
                await other.jobs.schedule(
                    JobSpec(job_type="it.prio", payload=b"", run_at=now, priority=8)
                )
            )[0]
            for _ in range(6)
        ]

        async def all_ready() -> bool:
            return owner.ready.count() == 12

        await wait_until(all_ready, 30, "every job ready at the owner")
        first = await owner.claims.claim(
            worker="w", types=["it.prio"], limit=6, wait_s=0, lease_s=30
        )
        assert {c.job.job_id for c in first} == {j.job_id for j in high}
        assert all(c.job.priority == 8 for c in first)
        rest = await owner.claims.claim(
            worker="w", types=["it.prio"], limit=6, wait_s=0, lease_s=30
        )
        assert {c.job.job_id for c in rest} == {j.job_id for j in low}


async def test_occurrences_run_spread_after_their_nominal_time(
    cassandra_address: str, keyspace: str
) -> None:
    async with two_nodes(cassandra_address, keyspace) as (_owner, other):
        spread_ms = 900  # every second, spread within 0.9 s
        s = await other.schedules.create(
            Schedule(
                schedule_id="spread-it",
                shard=0,
                cron="* * * * * *",
                timezone="UTC",
                job_type="it.cron",
                spread_ms=spread_ms,
                next_fire=0,
                created_at=0,
            )
        )
        assert s.spread_ms == spread_ms
        offset = spread_offset_of("spread-it", spread_ms)

        async def fired() -> bool:
            page = await other.jobs.list_jobs(
                state=None, job_type="it.cron", limit=10, page_token=""
            )
            return bool(page.jobs)

        await wait_until(fired, 60, "an occurrence")
        page = await other.jobs.list_jobs(state=None, job_type="it.cron", limit=10, page_token="")
        for job in page.jobs:
            nominal = int(job.job_id.removeprefix("spread-it@"))
            assert nominal % 1000 == 0  # the id stays on the nominal time
            assert job.run_at == nominal + offset
        assert (await other.schedules.get("spread-it")).spread_ms == spread_ms
