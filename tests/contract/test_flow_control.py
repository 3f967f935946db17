"""Deadlines, priorities and spreads in the store: a claim never applies after a job's
deadline, an expiry only after it (so the two never both apply), an expired job is finished
and listed as such, and the new fields are kept as written."""

from __future__ import annotations

from dataclasses import replace

from tests.contract.conftest import OpenStore
from tests.contract.helpers import (
    LEASE_MS,
    NOW,
    NUM_SHARDS,
    assert_stored,
    assert_unchanged,
    claim,
    create,
    make_job,
)
from timeshard.model import Job, JobState, Schedule
from timeshard.sharding import shard_of
from timeshard.store.base import JobClaim, schedule_entry

REASON = "not started by its deadline"


def with_deadline(job_id: str, deadline: int, **kw: object) -> Job:
    return replace(make_job(job_id, **kw), deadline=deadline)  # type: ignore[arg-type]


def claim_at(job: Job, now: int) -> JobClaim:
    return replace(claim(job), now=now, lease_until=now + LEASE_MS)


async def test_deadline_and_priority_are_kept_as_written(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = replace(make_job("fields"), deadline=NOW + 5000, priority=7)
        [result] = await create(store, job)
        assert result.created
        got = await store.get_job("fields")
        assert got is not None
        assert (got.deadline, got.priority) == (NOW + 5000, 7)
        page = await store.list_jobs(state=None, job_type=None, limit=10, page_token="")
        assert [(j.deadline, j.priority) for j in page.jobs] == [(NOW + 5000, 7)]


async def test_a_claim_at_the_deadline_applies_and_one_after_it_does_not(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        on_time, late = with_deadline("dl-on", NOW + 1000), with_deadline("dl-late", NOW + 1000)
        await create(store, on_time, late)
        [ok] = await store.claim_jobs([claim_at(on_time, NOW + 1000)])
        assert (await assert_stored(store, ok)).state is JobState.RUNNING
        [refused] = await store.claim_jobs([claim_at(late, NOW + 1001)])
        await assert_unchanged(store, refused, late)


async def test_expire_applies_only_after_the_deadline(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = with_deadline("dl-expire", NOW + 1000)
        await create(store, job)
        early = await store.expire_job(job.job_id, job.fence, NOW + 1000, REASON)
        await assert_unchanged(store, early, job)
        out = await store.expire_job(job.job_id, job.fence, NOW + 1001, REASON)
        got = await assert_stored(store, out)
        assert got.state is JobState.EXPIRED and got.state.terminal
        assert (got.finished_at, got.last_error, got.attempt) == (NOW + 1001, REASON, 0)
        # Finished: neither claimed nor expired again, and listed by its state.
        [again] = await store.claim_jobs([claim_at(got, NOW + 2000)])
        await assert_unchanged(store, again, got)
        twice = await store.expire_job(job.job_id, job.fence, NOW + 2000, REASON)
        await assert_unchanged(store, twice, got)
        page = await store.list_jobs(state=JobState.EXPIRED, job_type=None, limit=10, page_token="")
        assert [j.job_id for j in page.jobs] == [job.job_id]


async def test_expire_refuses_a_job_without_a_deadline_a_stale_fence_or_a_running_job(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        plain = make_job("dl-none")
        stale = with_deadline("dl-stale", NOW + 10)
        running = with_deadline("dl-running", NOW + 10)
        await create(store, plain, stale, running)
        [taken] = await store.claim_jobs([claim_at(running, NOW)])
        assert taken.applied and taken.job is not None
        later = NOW + 60_000
        await assert_unchanged(store, await store.expire_job("dl-none", 0, later, REASON), plain)
        await assert_unchanged(store, await store.expire_job("dl-stale", 5, later, REASON), stale)
        out = await store.expire_job("dl-running", taken.job.fence, later, REASON)
        await assert_unchanged(store, out, taken.job)


async def test_a_schedule_keeps_its_spread(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = Schedule(
            schedule_id="spread",
            shard=shard_of("spread", NUM_SHARDS),
            cron="0 * * * *",
            timezone="UTC",
            job_type="demo.echo",
            spread_ms=600_000,
            next_fire=NOW + 3_600_000,
            created_at=NOW,
        )
        created, stored = await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        assert created and stored.spread_ms == 600_000
        applied, updated = await store.update_schedule(
            stored.with_(spread_ms=0), stored.version, None
        )
        assert applied and updated is not None and updated.spread_ms == 0
        got = await store.get_schedule("spread")
        assert got is not None and got.spread_ms == 0
