"""A job waiting in a ready queue (no worker for its type) that is cancelled or rescheduled
leaves the queue and the counts: at once when the owner made the change, at the
owner's next look at the job (``_park_waiting``, within about a minute) when another node did.
Until then it was counted as ready, due and lagging, and its entry was written again every
minute until a worker of its type appeared."""

from __future__ import annotations

from pathlib import Path

from tests.unit.helpers import START_MS, advance, owner_and_writer, running
from timeshard.clock import FakeClock
from timeshard.model import Job, JobState
from timeshard.node import JobSpec, Node
from timeshard.sharding import minute_of
from timeshard.store.sqlite import SqliteStore


async def _waiting_job(node: Node, clock: FakeClock) -> Job:
    """A job of a type nobody claims, due and waiting in ``node``'s ready queue."""
    job, _ = await node.jobs.schedule(
        JobSpec(job_type="nobody", payload=b"", run_at=clock.now_ms() + 1000)
    )
    await advance(node, clock, 2)
    assert node.ready.count() == 1
    return job


async def _entries_written_over(node: Node, clock: FakeClock, job: Job, seconds: float) -> int:
    """How many entries of ``job`` are written while the clock moves on ``seconds``."""
    since = clock.now_ms()
    await advance(node, clock, seconds, step=5)
    found = 0
    for minute in range(minute_of(since), minute_of(clock.now_ms()) + 2):
        page = await node.store.read_bucket(job.shard, minute, due_from=since + 1, due_to=2**62)
        found += sum(1 for e in page if e.job_id == job.job_id)
    return found


async def test_a_job_cancelled_on_its_owner_leaves_the_ready_queue_at_once() -> None:
    async with running() as (node, clock):
        job = await _waiting_job(node, clock)
        await advance(node, clock, 90, step=5)  # parked (re-filed) at least once
        await node.jobs.cancel(job.job_id)
        assert node.ready.count() == 0, "the cancelled job is still counted as ready"
        assert node.dispatchers[job.shard].waiting == 0
        await advance(node, clock, 1)
        assert node.dispatchers[job.shard].backlog(clock.now_ms()) == (0, None)
        assert await _entries_written_over(node, clock, job, 180) == 0, (
            "the cancelled job's entry is still written again every minute"
        )


async def test_a_job_rescheduled_on_its_owner_leaves_the_queue_until_its_new_time() -> None:
    async with running() as (node, clock):
        job = await _waiting_job(node, clock)
        later = clock.now_ms() + 120_000
        await node.jobs.reschedule(job.job_id, later)
        assert node.ready.count() == 0, "a job moved to later is still counted as ready"
        await advance(node, clock, 110, step=5)
        assert node.ready.count() == 0
        await advance(node, clock, 15, step=5)
        (claimed,) = await node.claims.claim(
            worker="w", types=["nobody"], limit=1, wait_s=0, lease_s=5
        )
        assert claimed.job.job_id == job.job_id and claimed.job.started_at >= later


async def test_a_job_cancelled_through_another_node_leaves_the_owners_queue(
    tmp_path: Path,
) -> None:
    """The owner is not told of a cancel another node wrote: it finds out when it next looks
    at the waiting job's row, before writing its entry again."""
    db = tmp_path / "t.db"
    clock = FakeClock(START_MS)
    async with owner_and_writer(db, clock, SqliteStore(db, num_shards=4)) as (a, b):
        job = await _waiting_job(a, clock)
        await advance(a, clock, 70, step=5)
        assert a.ready.count() == 1
        await b.jobs.cancel(job.job_id)
        assert (await a.jobs.get(job.job_id)).state is JobState.CANCELLED
        await advance(a, clock, 70, step=5)  # the owner's next look at the job
        assert a.ready.count() == 0, "the owner still holds a job cancelled elsewhere"
        assert a.dispatchers[job.shard].backlog(clock.now_ms())[0] == 0
        assert await _entries_written_over(a, clock, job, 180) == 0


async def test_a_job_rescheduled_through_another_node_is_held_for_its_new_time(
    tmp_path: Path,
) -> None:
    db = tmp_path / "t.db"
    clock = FakeClock(START_MS)
    async with owner_and_writer(db, clock, SqliteStore(db, num_shards=4)) as (a, b):
        job = await _waiting_job(a, clock)
        later = clock.now_ms() + 600_000
        await b.jobs.reschedule(job.job_id, later)
        await advance(a, clock, 130, step=5)
        assert not a.ready.holds("nobody", job.job_id), "a job moved to later still waits as due"
        assert a.ready.count() == 0
        await advance(a, clock, (later - clock.now_ms()) / 1000 + 2, step=5)
        (claimed,) = await a.claims.claim(
            worker="w", types=["nobody"], limit=1, wait_s=0, lease_s=5
        )
        assert claimed.job.job_id == job.job_id and claimed.job.started_at >= later
