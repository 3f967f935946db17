"""The partition data model on real Cassandra: a deposed owner's batches are rejected
by the epoch it no longer holds, a worker's result still lands by its fence, many jobs' claims
cost one Paxos round, and a job whose time moves never lives in two places."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.contract.helpers import NOW, NUM_SHARDS, claim, claimed, create, make_job
from timeshard.errors import NotOwner
from timeshard.model import BucketEntry, JobState
from timeshard.sharding import minute_of, shard_of
from timeshard.store.base import Completion, JobClaim
from timeshard.store.cassandra import CassandraStore

pytestmark = pytest.mark.timeout(300)


@asynccontextmanager
async def stores(address: str, keyspace: str, n: int) -> AsyncIterator[list[CassandraStore]]:
    """``n`` separate clients of one keyspace (as on ``n`` nodes)."""
    opened = [
        CassandraStore.from_url(f"cassandra://{address}/{keyspace}", num_shards=NUM_SHARDS)
        for _ in range(n)
    ]
    await opened[0].open()  # migrate once, then the others
    await asyncio.gather(*(s.open() for s in opened[1:]))
    try:
        yield opened
    finally:
        await asyncio.gather(*(s.close() for s in opened))


def ids_in_shard(shard: int, n: int, prefix: str) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        job_id = f"{prefix}-{i}"
        if shard_of(job_id, NUM_SHARDS) == shard:
            out.append(job_id)
        i += 1
    return out


async def test_a_deposed_owner_can_not_claim_once_the_new_owner_touched_the_partition(
    cassandra_address: str, keyspace: str
) -> None:
    async with stores(cassandra_address, keyspace, 2) as (old, new):
        shard = 3
        a, b, c = (make_job(i) for i in ids_in_shard(shard, 3, "fence"))
        await create(old, a, b, c)
        applied, state = await old.acquire_shard(shard, "old", 0, minute_of(NOW))
        assert applied and state.epoch == 1
        [first] = await old.claim_jobs([claim(a)])
        assert first.applied  # the owner claims
        applied, state = await new.acquire_shard(shard, "new", 1, 0)
        assert applied and state.epoch == 2
        # The new owner reads the partition (the dispatcher does before it hands jobs out):
        # that raises the partition's epoch.
        entries = [BucketEntry(shard=shard, minute=minute_of(NOW), due_at=NOW, job_id=b.job_id)]
        assert b.job_id in await new.get_jobs_for(entries)
        with pytest.raises(NotOwner):
            await old.claim_jobs([claim(b)])  # deposed: rejected, changes nothing
        stored = await new.get_job(b.job_id)
        assert stored is not None and stored.state is JobState.SCHEDULED and stored.fence == 0
        [won] = await new.claim_jobs([claim(b, worker="w2")])
        assert won.applied
        # A worker's result is decided by its fence, whichever node writes it: the job the
        # old owner handed out still completes through the old owner's store.
        assert first.job is not None
        done = await old.complete_job(a.job_id, first.job.fence, NOW + 10)
        assert done.applied and done.job is not None and done.job.state is JobState.SUCCEEDED
        # And the new owner's claims are not affected by the old one.
        [last] = await new.claim_jobs([claim(c)])
        assert last.applied


async def test_claims_of_many_jobs_of_one_partition_cost_one_paxos_round(
    cassandra_address: str, keyspace: str
) -> None:
    async with stores(cassandra_address, keyspace, 1) as (store,):
        shard = 5
        jobs = [make_job(i) for i in ids_in_shard(shard, 40, "round")]
        await create(store, *jobs)
        await store.acquire_shard(shard, "me", 0, minute_of(NOW))
        before = store.stats.paxos_rounds
        outs = await store.claim_jobs([claim(j) for j in jobs])
        assert all(o.applied for o in outs)
        rounds = store.stats.paxos_rounds - before
        assert rounds <= 3, f"40 claims of one partition took {rounds} Paxos rounds"
        before = store.stats.paxos_rounds
        done = await asyncio.gather(
            *(store.complete_job(o.job.job_id, o.job.fence, NOW + 5) for o in outs if o.job)
        )
        assert all(d.applied for d in done)
        assert store.stats.paxos_rounds - before <= 3


@pytest.mark.parametrize("other", ["cancel", "reschedule"])
async def test_a_claim_racing_a_cancel_or_reschedule_has_one_winner(
    cassandra_address: str, keyspace: str, other: str
) -> None:
    """From two clients at once, many times: exactly one of the two applies, and the stored
    row is the winner's."""
    async with stores(cassandra_address, keyspace, 2) as (one, two):
        jobs = [make_job(f"race-{other}-{i}") for i in range(12)]
        await create(one, *jobs)
        for job in jobs:
            if other == "cancel":
                rival = two.cancel_job(job.job_id, JobState.SCHEDULED, 0, NOW)
            else:
                rival = two.reschedule_job(job.job_id, 0, NOW + 3_600_000, NOW)
            [claimed], moved = await asyncio.gather(one.claim_jobs([claim(job)]), rival)
            assert claimed.applied != moved.applied, f"{job.job_id}: both or neither applied"
            stored = await one.get_job(job.job_id)
            winner = claimed if claimed.applied else moved
            assert stored is not None and stored == winner.job


async def test_a_rescheduled_job_has_one_row_and_runs_at_its_new_time_only(
    cassandra_address: str, keyspace: str
) -> None:
    """The job never moves: its row stays in its home partition and the reschedule writes an
    entry for the new time first. A crash between the two writes leaves the job at its old
    time (the call failed), never in two places; the old entry then finds a later run_at."""
    async with stores(cassandra_address, keyspace, 1) as (store,):
        job = make_job("moved", run_at=NOW)
        await create(store, job)
        later = NOW + 10 * 60_000
        out = await store.reschedule_job(job.job_id, 0, later, NOW)
        assert out.applied
        old_entry = BucketEntry(shard=job.shard, minute=minute_of(NOW), due_at=NOW, job_id="moved")
        new_entry = BucketEntry(
            shard=job.shard, minute=minute_of(later), due_at=later, job_id="moved"
        )
        for entry in (old_entry, new_entry):
            found = await store.get_jobs_for([entry])
            assert list(found) == ["moved"] and found["moved"].run_at == later
        [early] = await store.claim_jobs([claim(job)])  # at NOW, through the old entry
        assert not early.applied
        # The crash case: only the entry of a reschedule landed; the job stays where it was.
        await store.add_entries(
            [
                BucketEntry(
                    shard=job.shard, minute=minute_of(later + 5), due_at=later + 5, job_id="moved"
                )
            ]
        )
        stored = await store.get_job("moved")
        assert stored is not None and stored.run_at == later and stored.state is JobState.SCHEDULED


async def test_a_finished_job_expires_with_its_key_and_a_get_says_so(
    cassandra_address: str, keyspace: str
) -> None:
    from timeshard.store.base import Retention

    store = CassandraStore.from_url(
        f"cassandra://{cassandra_address}/{keyspace}",
        num_shards=NUM_SHARDS,
        retention=Retention(finished_s=2, dead_s=3600, index_s=3600),
    )
    await store.open()
    try:
        job = make_job("short-lived", key="short-key")
        await create(store, job)
        [claimed] = await store.claim_jobs([claim(job)])
        assert claimed.job is not None
        assert (await store.complete_job(job.job_id, claimed.job.fence, NOW + 1)).applied
        assert await store.get_job(job.job_id) is not None
        await asyncio.sleep(3.5)
        assert await store.get_job(job.job_id) is None
        assert store.expired(job.job_id)  # the index outlives the row: it says "expired"
        [again] = await create(store, make_job("short-2", key="short-key"))
        assert again.created, "the idempotency key should have expired with its job"
    finally:
        await store.close()


async def test_a_job_made_again_after_a_purge_outlives_the_dead_jobs_retention(
    cassandra_address: str, keyspace: str
) -> None:
    """A dead job's index row and key get the dead-letter retention as their time to live; a
    purge leaves them (the key keeps its id), so the job made again under that key must
    rewrite them without it, or it would lose its key (a repeat would make a second job) and
    its index (its home) when the dead one's retention ran out. The dead job's own rewrite of
    them (with its time to live) goes out up to ``FOLLOW_WINDOW_S`` after it died, here after
    the job was made again: timed when the job died, it loses to the newer rows."""
    from timeshard.store.base import Retention

    store = CassandraStore.from_url(
        f"cassandra://{cassandra_address}/{keyspace}",
        num_shards=NUM_SHARDS,
        retention=Retention(finished_s=3600, dead_s=2, index_s=1),
    )
    await store.open()
    try:
        job = make_job("revived", key="revived-key")
        await create(store, job)
        [running] = await store.claim_jobs([claim(job)])
        assert running.job is not None
        died = await store.fail_job(job.job_id, running.job.fence, NOW + 1, "bad input", None)
        assert died.applied and died.job is not None and died.job.state is JobState.DEAD
        assert (await store.purge_job(job.job_id, died.job.fence)).applied
        [again] = await create(store, make_job("other-id", key="revived-key"))
        assert again.created and again.job.job_id == "revived"
        await asyncio.sleep(4)  # past the dead job's retention (2 s) and its index's (+1 s)
        stored = await store.get_job("revived")
        assert stored is not None and stored.state is JobState.SCHEDULED
        [repeat] = await create(store, make_job("third-id", key="revived-key"))
        assert not repeat.created and repeat.job.job_id == "revived"
    finally:
        await store.close()


async def test_a_node_that_missed_later_writes_does_not_refuse_or_stall_on_its_old_image(
    cassandra_address: str, keyspace: str
) -> None:
    """Seen in a chaos soak: node c claimed a job (fence 1) and was paused; node b released the
    expired lease and handed the job out again (fence 2). Back, c refused the new holder's
    heartbeat as stale from the image it had written itself, and, as the shard's owner again,
    could not release the second lease once it expired: the job stayed running for good."""
    async with stores(cassandra_address, keyspace, 2) as (c, b):
        job = make_job("paused-image")
        await create(c, job)
        first = await claimed(c, job, lease_ms=1_000)  # c remembers the row it wrote (fence 1)
        expired = NOW + 1_000
        released = await b.release_lease(job.job_id, first.fence, expired, expired)
        assert released.applied and released.job is not None
        request = JobClaim(
            job_id=job.job_id,
            expect_fence=released.job.fence,
            worker="w2",
            now=expired,
            lease_until=expired + 1_000,
        )
        [again] = await b.claim_jobs([request])
        assert again.applied and again.job is not None and again.job.fence == first.fence + 1
        second = again.job
        extended = await c.heartbeat(job.job_id, second.fence, second.lease_until + 500)
        assert extended.applied, f"refused on an old image: {extended.job}"
        assert extended.job is not None
        late = extended.job.lease_until
        out = await c.release_lease(job.job_id, second.fence, late, late)
        assert out.applied, f"the second lease could not be released: {out.job}"
        stored = await b.get_job(job.job_id)
        assert stored is not None and stored.state is JobState.SCHEDULED
        assert stored.fence == second.fence


async def test_a_completion_goes_out_with_the_next_write_of_its_partition(
    cassandra_address: str, keyspace: str
) -> None:
    """A result waits (``linger_s``, long here so a loaded machine can not miss it) for
    another write of its partition and shares its Paxos round; alone, it goes out when the
    linger ends, and is acknowledged only once written either way."""
    async with stores(cassandra_address, keyspace, 1) as (store,):
        shard = 6
        a, b, c = (make_job(i) for i in ids_in_shard(shard, 3, "linger"))
        await create(store, a, b, c)
        await store.acquire_shard(shard, "me", 0, minute_of(NOW))
        a = await claimed(store, a)
        before = store.stats.paxos_rounds
        completing = asyncio.ensure_future(
            store.complete_jobs([Completion(job_id=a.job_id, fence=a.fence)], NOW + 5, linger_s=1.0)
        )
        await asyncio.sleep(0.05)
        assert not completing.done()  # lingering: nothing written yet
        [b_out] = await store.claim_jobs([claim(b)])
        [a_out] = await completing
        assert b_out.applied and a_out.applied and a_out.job is not None
        assert a_out.job.state is JobState.SUCCEEDED
        assert store.stats.paxos_rounds - before == 1, "the claim and the result: one round"
        assert store.stats.rounds_by_kind["claim+complete"] == 1, store.stats.rounds_by_kind
        assert (await store.get_job(a.job_id)).state is JobState.SUCCEEDED

        b = b_out.job
        assert b is not None
        before = store.stats.paxos_rounds
        [alone] = await store.complete_jobs(
            [Completion(job_id=b.job_id, fence=b.fence)], NOW + 6, linger_s=1.0
        )
        assert alone.applied  # no other write came: it went out when the linger ended
        assert store.stats.paxos_rounds - before == 1
        assert store.stats.rounds_by_kind["complete"] == 1, store.stats.rounds_by_kind
        assert (await store.get_job(b.job_id)).state is JobState.SUCCEEDED


async def test_results_lingering_together_keep_their_own_fences(
    cassandra_address: str, keyspace: str
) -> None:
    """Results held for their partition's next write are each still conditional on their own
    fence: a stale one (its lease was taken again) fails and changes nothing, the others
    apply. And a result held with a short linger does not wait for a longer one held before
    it: the partition's timer comes forward (here, from a minute to 50 ms)."""
    async with stores(cassandra_address, keyspace, 1) as (store,):
        shard = 7
        a, b, c = (make_job(i) for i in ids_in_shard(shard, 3, "held"))
        await create(store, a, b, c)
        await store.acquire_shard(shard, "me", 0, minute_of(NOW))
        a, b, c = [await claimed(store, j) for j in (a, b, c)]
        held = [
            asyncio.ensure_future(
                store.complete_jobs([Completion(job_id=j.job_id, fence=f)], NOW + 5, linger_s=60)
            )
            for j, f in ((a, a.fence), (b, b.fence - 1))  # b's: a lease before its last
        ]
        await asyncio.sleep(0.05)
        assert not any(h.done() for h in held)  # lingering: nothing written yet
        short = store.complete_jobs(
            [Completion(job_id=c.job_id, fence=c.fence)], NOW + 6, linger_s=0.05
        )
        [a_out], [b_out], [c_out] = await asyncio.wait_for(asyncio.gather(*held, short), 30)
        assert a_out.applied and c_out.applied
        assert not b_out.applied and b_out.job is not None and b_out.job.fence == b.fence
        stored = {j.job_id: await store.get_job(j.job_id) for j in (a, b, c)}
        assert stored[a.job_id].state is JobState.SUCCEEDED
        assert stored[c.job_id].state is JobState.SUCCEEDED
        assert stored[b.job_id].state is JobState.RUNNING and stored[b.job_id].fence == b.fence
