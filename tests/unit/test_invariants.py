"""Invariants 1-5 (docs/architecture.md) on the embedded store and the fake clock. Each test states
the invariant it guards and fails if it breaks."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest

from tests.unit.helpers import START_MS, advance, all_entries, running, settle
from timeshard.errors import AlreadyExists, FailedPrecondition, NotFound, StaleFence
from timeshard.model import BucketEntry, JobState
from timeshard.node import JobSpec, Node
from timeshard.sharding import minute_of
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until

# -- 1. durable before acknowledged ---------------------------------------------------------


async def test_schedule_is_durable_before_it_returns(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with running(db) as (node, _clock):
        job, created = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 5000)
        )
        assert created
        # A second connection, as after a crash, sees the row and its bucket entry.
        other = SqliteStore(db, num_shards=node.num_shards)
        await other.open()
        try:
            stored = await other.get_job(job.job_id)
            assert stored is not None and stored.state is JobState.SCHEDULED
            entries = await other.read_bucket(
                job.shard, minute_of(START_MS + 5000), due_from=0, due_to=2**62
            )
            assert [e.job_id for e in entries] == [job.job_id]
        finally:
            await other.close()


async def test_idempotency_key_creates_once_and_rejects_another_body() -> None:
    async with running() as (node, _):
        a, created_a = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b'{"x":1}', run_at=START_MS, idempotency_key="k1")
        )
        b, created_b = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b'{"x":1}', run_at=START_MS, idempotency_key="k1")
        )
        assert created_a and not created_b and a.job_id == b.job_id
        with pytest.raises(AlreadyExists, match="k1"):
            await node.jobs.schedule(
                JobSpec(job_type="t", payload=b'{"x":2}', run_at=START_MS, idempotency_key="k1")
            )
        page = await node.jobs.list_jobs(state=None, job_type=None, limit=10, page_token="")
        assert len(page.jobs) == 1


# -- 2. never skipped -------------------------------------------------------------------------


async def _assert_attention_covered(node: Node, job_ids: list[str]) -> None:
    """Invariant 2, checked by a full scan of each shard's buckets from its cursor."""
    jobs = await node.store.get_jobs(job_ids)
    entries: dict[str, list[BucketEntry]] = {}
    for shard in {j.shard for j in jobs.values()}:
        cursor = (await node.store.get_shard(shard)).cursor
        for minute in range(cursor, minute_of(node.clock.now_ms()) + 3):
            for e in await node.store.read_bucket(shard, minute, due_from=0, due_to=2**62):
                entries.setdefault(e.job_id, []).append(e)
    for job in jobs.values():
        attention = job.next_attention()
        if attention is None:
            continue
        mine = entries.get(job.job_id, [])
        assert any(e.due_at <= attention for e in mine), (
            f"{job.state} job {job.job_id} needs attention at {attention}; entries: {mine}"
        )


async def test_every_live_job_has_an_entry_no_later_than_it_needs_attention() -> None:
    rng = random.Random(7)
    async with running(lookahead_s=2.0) as (node, clock):
        ids = []
        for i in range(30):
            job, _ = await node.jobs.schedule(
                JobSpec(
                    job_type="t",
                    payload=b"{}",
                    run_at=START_MS + rng.randint(0, 90_000),
                    job_id=f"j{i}",
                )
            )
            ids.append(job.job_id)
        for _ in range(200):
            await advance(node, clock, 1.0, step=1.0)
            for c in await node.claims.claim(worker="w", types=["t"], limit=3, wait_s=0, lease_s=5):
                roll = rng.random()
                if roll < 0.3:
                    await node.attempts.complete(c.job.job_id, c.job.fence)
                elif roll < 0.6:
                    await node.attempts.fail(c.job.job_id, c.job.fence, "boom", permanent=False)
                elif roll < 0.8:
                    await node.attempts.heartbeat(c.job.job_id, c.job.fence, 20)
                # else: the worker vanishes; its lease must expire and the job come back
            if rng.random() < 0.1:
                victim = rng.choice(ids)
                with contextlib.suppress(FailedPrecondition):
                    await node.jobs.reschedule(victim, clock.now_ms() + rng.randint(0, 30_000))
            await _assert_attention_covered(node, ids)
        states = {(await node.jobs.get(i)).state for i in ids}
        assert JobState.SUCCEEDED in states and JobState.DEAD in states


# -- 3. the cursor advances only past handled buckets -----------------------------------------


async def test_an_unclaimed_due_job_does_not_hold_its_shard_and_survives_owner_death(
    tmp_path: Path,
) -> None:
    """Invariant 3 without a stall: a due job nobody claims (a type
    without workers) is not handled, so a new owner finds it again; but it does not pin its
    shard's cursor, which keeps up with the clock like the others."""
    db = tmp_path / "t.db"
    async with running(db) as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        await advance(node, clock, 2)
        await wait_until(lambda: node.ready.count() == 1, what="job ready")
        await advance(node, clock, 300, step=10)  # five minutes: nobody claims it
        cursor = (await node.store.get_shard(job.shard)).cursor
        assert cursor >= minute_of(clock.now_ms()) - 1, "the unclaimed job held its shard back"
        assert node.dispatchers[job.shard].in_memory <= 2, "its entries piled up in memory"
        assert node.dispatchers[job.shard].waiting == 1
        now = clock.now_ms()
    # The owner is gone; a new owner from the same store finds the job again.
    async with running(db, clock=clock) as (node2, clock2):
        assert (await node2.store.get_shard(job.shard)).epoch == 2
        await advance(node2, clock2, 1)
        claimed = await node2.claims.claim(worker="w2", types=["t"], limit=1, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]
        assert claimed[0].job.started_at >= now


# -- 4. late writes are not lost ---------------------------------------------------------------


async def test_job_due_before_the_cursor_is_written_where_the_dispatcher_reads() -> None:
    async with running() as (node, clock):
        await advance(node, clock, 150, step=10)
        shard_cursors = [(await node.store.get_shard(s)).cursor for s in range(node.num_shards)]
        assert min(shard_cursors) > minute_of(START_MS)
        past = START_MS + 1000  # minutes behind every cursor
        job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=past))
        entries = await all_entries(node, job)
        cursor = (await node.store.get_shard(job.shard)).cursor
        assert entries and all(e.minute >= cursor for e in entries)
        await advance(node, clock, 1)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]


# -- 5. one lease at a time --------------------------------------------------------------------


async def test_stale_fence_is_rejected_everywhere_and_changes_nothing() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        await advance(node, clock, 0.5)
        (first,) = await node.claims.claim(worker="w1", types=["t"], limit=1, wait_s=0, lease_s=5)
        await advance(node, clock, 6)  # lease expires; the dispatcher releases it
        await wait_until(lambda: node.ready.count() == 1, what="released job ready")
        (second,) = await node.claims.claim(worker="w2", types=["t"], limit=1, wait_s=0, lease_s=5)
        # the first delivery never started (invariant 9): attempt 1 again
        assert second.job.fence == first.job.fence + 1 and second.job.attempt == 1
        before = await node.jobs.get(job.job_id)
        for call in (
            node.attempts.heartbeat(job.job_id, first.job.fence, 5),
            node.attempts.complete(job.job_id, first.job.fence),
            node.attempts.fail(job.job_id, first.job.fence, "x", permanent=True),
        ):
            with pytest.raises(StaleFence) as info:
                await call
            assert isinstance(info.value, FailedPrecondition)
        assert await node.jobs.get(job.job_id) == before
        done = await node.attempts.complete(job.job_id, second.job.fence)
        assert done.state is JobState.SUCCEEDED


async def test_a_job_is_claimed_by_one_of_many_concurrent_claimers() -> None:
    import asyncio

    async with running() as (node, clock):
        await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 500))
        waiters = [
            asyncio.ensure_future(
                node.claims.claim(worker=f"w{i}", types=["t"], limit=1, wait_s=5, lease_s=5)
            )
            for i in range(8)
        ]
        await settle(node)
        await advance(node, clock, 1)
        await wait_until(lambda: sum(1 for w in waiters if w.done()) >= 1, what="a claim")
        clock.advance(6)  # the other long polls end empty
        results = await asyncio.gather(*waiters)
        assert sum(len(r) for r in results) == 1


async def test_never_early() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 3000)
        )
        for _ in range(5):
            await advance(node, clock, 0.5)
            assert clock.now_ms() < job.run_at
            assert (
                await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5) == []
            )
        await advance(node, clock, 0.5)
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        assert c.job.started_at >= job.run_at


# -- the job API -------------------------------------------------------------------------------


async def test_cancel_and_reschedule() -> None:
    async with running() as (node, clock):
        a, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        b, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        await node.jobs.cancel(a.job_id)
        with pytest.raises(FailedPrecondition, match="already cancelled"):
            await node.jobs.cancel(a.job_id)
        moved = await node.jobs.reschedule(b.job_id, START_MS + 10_000)
        assert moved.run_at == START_MS + 10_000
        await advance(node, clock, 5)
        assert await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=0, lease_s=5) == []
        await advance(node, clock, 6)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=5, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [b.job_id]
        with pytest.raises(NotFound):
            await node.jobs.get("missing")


async def test_cancel_of_a_running_job_revokes_its_lease() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        await advance(node, clock, 0.5)
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        cancelled = await node.jobs.cancel(job.job_id)
        assert cancelled.state is JobState.CANCELLED
        with pytest.raises(StaleFence):
            await node.attempts.heartbeat(job.job_id, c.job.fence, 5)


async def test_retry_then_dead_letter_after_max_attempts() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS, max_attempts=2)
        )
        await advance(node, clock, 0.5)
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        failed = await node.attempts.fail(job.job_id, c.job.fence, "boom", permanent=False)
        assert failed.state is JobState.SCHEDULED
        assert START_MS < failed.run_at <= clock.now_ms() + 1000  # base 1 s, full jitter
        await advance(node, clock, 1.5)
        (c2,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        dead = await node.attempts.fail(job.job_id, c2.job.fence, "boom again", permanent=False)
        assert dead.state is JobState.DEAD and dead.last_error == "boom again"
        assert [a.outcome for a in dead.history] == ["retry", "dead"]


async def test_a_claim_cancelled_mid_write_gives_its_jobs_back() -> None:
    import asyncio

    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        await advance(node, clock, 0.5)
        real = node.store.claim_jobs
        blocked = asyncio.Event()

        async def hang(claims):  # type: ignore[no-untyped-def]
            blocked.set()
            await asyncio.Event().wait()

        node.store.claim_jobs = hang  # type: ignore[method-assign]
        call = asyncio.ensure_future(
            node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        )
        await blocked.wait()
        call.cancel()  # the worker's deadline passed; gRPC cancels the handler
        await asyncio.gather(call, return_exceptions=True)
        node.store.claim_jobs = real  # type: ignore[method-assign]
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        assert c.job.job_id == job.job_id


async def test_a_stranded_pending_entry_is_looked_at_again() -> None:
    async with running(stale_s=10.0) as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        await advance(node, clock, 0.5)
        await wait_until(lambda: node.ready.count() == 1, what="ready")
        node.ready.drop_shard(job.shard)  # lose it from memory, as a bug would
        await advance(node, clock, 12, step=1)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]


async def test_an_entry_that_comes_due_before_its_row_lands_is_not_dropped() -> None:
    """Cassandra writes a job's bucket entry before its row (so a crash never leaves a row
    without an entry); the row may land after the entry came due."""
    from timeshard.model import Job
    from timeshard.store.base import entry_for

    async with running() as (node, clock):
        job = Job(job_id="slow-row", shard=1, job_type="t", run_at=START_MS + 200, created_at=0)
        entry = entry_for(job, job.run_at, START_MS)
        await node.store.add_entries([entry])
        node._notify([entry])  # as the writing node does
        await advance(node, clock, 3, step=0.5)  # the entry comes due; no row yet
        assert await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5) == []
        await node.store.create_jobs([(job, entry)])
        await advance(node, clock, 1, step=0.5)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == ["slow-row"]


async def test_a_deposed_dispatcher_changes_nothing_and_its_node_retakes_when_still_owner(
    tmp_path: Path,
) -> None:
    """Invariant 7: another writer took the shard's epoch; this node's cursor write is
    refused, it stops; as the coordinator still names it owner, it takes the next epoch."""
    async with running(tmp_path / "db") as (node, clock):
        shard = 1
        before = await node.store.get_shard(shard)
        ok, _ = await node.store.acquire_shard(shard, "intruder", before.epoch, 0)
        assert ok
        await advance(node, clock, 70, step=5)  # a minute passes: the cursor must move
        await wait_until(
            lambda: node.dispatchers[shard].epoch == before.epoch + 2, what="the retake"
        )
        after = await node.store.get_shard(shard)
        assert after.owner == "test-node" and after.epoch == before.epoch + 2
