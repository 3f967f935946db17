"""The embedded store's writer keeps the jobs it wrote last (``store.keptjobs``) and compares a
conditional write against one instead of reading its row: each kept job must be exactly the
stored row, through every kind of write, another connection's writes, and rollbacks."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from timeshard.model import Job, JobState
from timeshard.store import keptjobs
from timeshard.store.base import Completion, JobClaim, entry_for
from timeshard.store.history import MAX_HISTORY
from timeshard.store.sqlite import SqliteStore, _apply, _select
from timeshard.store.sqlitedb import Database, WriterConnection
from timeshard.store.transitions import claim

NOW = 1_800_000_000_000
LEASE_MS = 60_000


def make_job(n: int, *, payload: bytes = b"{}", max_attempts: int = 3) -> Job:
    return Job(
        job_id=f"job-{n}",
        shard=n % 4,
        job_type="t",
        payload=payload,
        run_at=NOW,
        created_at=NOW,
        max_attempts=max_attempts,
    )


async def create(store: SqliteStore, *jobs: Job) -> None:
    results = await store.create_jobs([(j, entry_for(j, j.run_at, NOW)) for j in jobs])
    assert all(r.created for r in results)


def claim_of(job_id: str, fence: int) -> JobClaim:
    return JobClaim(
        job_id=job_id, expect_fence=fence, worker="w", now=NOW, lease_until=NOW + LEASE_MS
    )


async def kept_and_stored(store: SqliteStore) -> list[tuple[Job, Job | None]]:
    """Each job the writer keeps, beside its row as read from the file, on the writer thread."""

    def read(db: WriterConnection) -> list[tuple[Job, Job | None]]:
        return [(job, _select(db, job.job_id)) for job in db.kept_jobs.kept()]

    return await store._db.call(read)


async def assert_kept_as_stored(store: SqliteStore) -> int:
    pairs = await kept_and_stored(store)
    for kept, stored in pairs:
        assert kept == stored, f"{kept.job_id}: kept {kept} but the row is {stored}"
    return len(pairs)


@contextlib.asynccontextmanager
async def opened(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "jobs.db", num_shards=4)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def test_every_kept_job_is_its_row_through_random_writes(tmp_path: Path) -> None:
    """Random claims, results, failures with and without a retry, heartbeats, reschedules,
    cancels and purges; after each, every kept job equals its row, and the rows kept are used."""
    async with opened(tmp_path) as store:
        rng = random.Random(7)
        jobs = [make_job(n, max_attempts=40) for n in range(30)]
        await create(store, *jobs)
        assert await assert_kept_as_stored(store) == 30  # (a job just created is kept)
        for step in range(600):
            job_id = f"job-{rng.randrange(30)}"
            (job,) = (await store.get_jobs([job_id])).values() or (None,)
            if job is None:
                continue
            f, now = job.fence, NOW + step
            if job.state is JobState.SCHEDULED:
                choice = rng.choice(["claim", "claim", "reschedule", "cancel"])
                if choice == "claim":
                    await store.claim_jobs([claim_of(job_id, f)])
                elif choice == "reschedule":
                    await store.reschedule_job(job_id, f, NOW, now)
                else:
                    await store.cancel_job(job_id, JobState.SCHEDULED, f, now)
            elif job.state is JobState.RUNNING:
                choice = rng.choice(["complete", "fail", "retry", "heartbeat"])
                if choice == "complete":
                    await store.complete_jobs([Completion(job_id, f, b'"ok"', "json", "w2")], now)
                elif choice == "fail":
                    await store.fail_job(job_id, f, now, "boom", None)
                elif choice == "retry":
                    await store.fail_job(job_id, f, now, "again", NOW, worker="w3")
                else:
                    await store.heartbeat(job_id, f, now + LEASE_MS, started=True, worker="w4")
            elif rng.random() < 0.3:
                await store.purge_job(job_id, f)
            await assert_kept_as_stored(store)


async def test_a_job_with_more_attempts_than_a_row_keeps_is_not_kept(tmp_path: Path) -> None:
    """A row keeps the last ``MAX_HISTORY`` attempts: past that the job written is not the row,
    so it is read back, and the next write starts from the row."""
    async with opened(tmp_path) as store:
        job = make_job(1, max_attempts=MAX_HISTORY + 5)
        await create(store, job)
        fence = 0
        for _ in range(MAX_HISTORY + 2):
            (claimed,) = await store.claim_jobs([claim_of(job.job_id, fence)])
            assert claimed.applied and claimed.job is not None
            failed = await store.fail_job(job.job_id, claimed.job.fence, NOW, "again", NOW)
            assert failed.applied and failed.job is not None
            fence = failed.job.fence
            await assert_kept_as_stored(store)
        (stored,) = (await store.get_jobs([job.job_id])).values()
        assert len(stored.history) == MAX_HISTORY and stored.attempt == MAX_HISTORY + 2


async def test_a_large_job_is_not_kept(tmp_path: Path) -> None:
    async with opened(tmp_path) as store:
        await create(store, make_job(1, payload=b"x" * (keptjobs.ROW_BYTES_MAX + 1)), make_job(2))
        kept = {job.job_id for job, _ in await kept_and_stored(store)}
        assert kept == {"job-2"}


async def test_another_connections_write_is_seen_by_the_next_claim(tmp_path: Path) -> None:
    """Two stores on one file (two servers, or a tool): a job one cancelled is not claimed by
    the other, which kept it as it created it."""
    path = tmp_path / "shared.db"
    a, b = SqliteStore(path, num_shards=4), SqliteStore(path, num_shards=4)
    await a.open()
    await b.open()
    try:
        await create(a, make_job(1))
        cancelled = await b.cancel_job("job-1", JobState.SCHEDULED, 0, NOW)
        assert cancelled.applied
        (claimed,) = await a.claim_jobs([claim_of("job-1", 0)])
        assert not claimed.applied and claimed.job is not None
        assert claimed.job.state is JobState.CANCELLED
        # A plain connection's write too (sqlite3 on the file, as an operator's tool would).
        await create(a, make_job(2))
        with sqlite3.connect(path) as other:
            other.execute("UPDATE jobs SET fence = 7 WHERE job_id = 'job-2'")
        (claimed,) = await a.claim_jobs([claim_of("job-2", 0)])
        assert not claimed.applied
        (claimed,) = await a.claim_jobs([claim_of("job-2", 7)])
        assert claimed.applied
    finally:
        await a.close()
        await b.close()


async def test_a_rolled_back_write_is_not_kept(tmp_path: Path) -> None:
    """A call that wrote and then raised is undone, alone (``_run_alone``) or beside another
    call in one transaction (``_run_batch``: its savepoint): the next write starts from the
    row as it was, and the other call's write stands."""
    path = tmp_path / "jobs.db"
    store = SqliteStore(path, num_shards=4)
    await store.open()
    await create(store, make_job(1), make_job(2), make_job(3))
    await store.close()
    db = sqlite3.connect(path, isolation_level=None, factory=WriterConnection)
    loop = asyncio.get_running_loop()

    def claim_then_raise(job_id: str) -> Callable[[WriterConnection], None]:
        def run(db: WriterConnection) -> None:
            assert _apply(db, job_id, claim(claim_of(job_id, 0))).applied
            raise ValueError("after the write")

        return run

    def claim_one(job_id: str, fence: int) -> Callable[[WriterConnection], bool]:
        return lambda db: _apply(db, job_id, claim(claim_of(job_id, fence))).applied

    try:
        alone = loop.create_future()
        Database._run_alone(db, claim_then_raise("job-1"), alone)
        with pytest.raises(ValueError):
            await alone
        ok, failed = loop.create_future(), loop.create_future()
        Database._run_batch(db, [(claim_one("job-3", 0), ok), (claim_then_raise("job-2"), failed)])
        assert await ok is True
        with pytest.raises(ValueError):
            await failed
        again = [loop.create_future() for _ in range(3)]
        Database._run_batch(
            db,
            [
                (claim_one("job-1", 0), again[0]),
                (claim_one("job-2", 0), again[1]),
                (claim_one("job-3", 0), again[2]),  # (claimed above: its fence is 1 now)
            ],
        )
        assert [await f for f in again] == [True, True, False]
        for job in db.kept_jobs.kept():
            assert job == _select(db, job.job_id)
    finally:
        db.close()
