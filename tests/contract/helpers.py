"""Building jobs for the contract suite and checking what a store holds."""

from __future__ import annotations

from timeshard.model import BucketEntry, Job, WriteResult
from timeshard.sharding import minute_of, shard_of
from timeshard.store.base import CreateResult, JobClaim, Store, entry_for

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a minute boundary
NUM_SHARDS = 8


def make_job(
    job_id: str,
    *,
    run_at: int = NOW,  # due: claims (at NOW) apply; never early
    job_type: str = "demo.echo",
    payload: bytes = b'{"n":1}',
    key: str = "",
    max_attempts: int = 3,
) -> Job:
    return Job(
        job_id=job_id,
        shard=shard_of(job_id, NUM_SHARDS),
        job_type=job_type,
        payload=payload,
        run_at=run_at,
        created_at=NOW,
        idempotency_key=key,
        max_attempts=max_attempts,
    )


async def create(store: Store, *jobs: Job, now: int = NOW) -> list[CreateResult]:
    return await store.create_jobs([(j, entry_for(j, j.run_at, now)) for j in jobs])


async def created(store: Store, job_id: str, **kw: object) -> Job:
    """A new scheduled job, stored."""
    [result] = await create(store, make_job(job_id, **kw))  # type: ignore[arg-type]
    assert result.created
    return result.job


LEASE_MS = 120_000  # a lease runs out two minutes after NOW, in another bucket than run_at


async def claimed(store: Store, job: Job, *, worker: str = "w1", lease_ms: int = LEASE_MS) -> Job:
    """``job`` claimed by ``worker`` at NOW."""
    [out] = await store.claim_jobs([claim(job, worker=worker, lease_ms=lease_ms)])
    assert out.applied and out.job is not None
    return out.job


def claim(
    job: Job, *, worker: str = "w1", lease_ms: int = LEASE_MS, fence: int | None = None
) -> JobClaim:
    now = max(NOW, job.run_at)  # never early: a claim applies once the job is due
    return JobClaim(
        job_id=job.job_id,
        expect_fence=job.fence if fence is None else fence,
        worker=worker,
        now=now,
        lease_until=now + lease_ms,
    )


async def entries_of(store: Store, job: Job, at: int) -> list[BucketEntry]:
    """The bucket entries of ``job`` in the minute of ``at``."""
    page = await store.read_bucket(job.shard, minute_of(at), due_from=0, due_to=2**62)
    return [e for e in page if e.job_id == job.job_id]


async def assert_unchanged(store: Store, out: WriteResult, before: Job) -> None:
    """A write that did not apply reports the row as found and changed nothing."""
    assert not out.applied
    assert out.job == before
    assert await store.get_job(before.job_id) == before


async def assert_stored(store: Store, out: WriteResult) -> Job:
    """A write that applied reports the row as it is now stored."""
    assert out.applied and out.job is not None
    stored = await store.get_job(out.job.job_id)
    assert stored == out.job
    return stored
