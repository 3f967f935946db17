"""A claim writes no lease-check entry: the entry that made the job ready stays pending with
its owner until the run ends, and a lease check is written only for a job still running when
its minute is to be passed. Most jobs finish within seconds, so most never cost that entry's
write, its read when it comes due, and the row read behind it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.helpers import START_MS, advance, all_entries, make_node
from timeshard.clock import FakeClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import LEASE_EXPIRED, NOT_STARTED, JobState
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.sharding import MINUTE_MS, minute_of
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until


async def _claim_one(node: Node, lease_s: float) -> str:
    """A job claimed by a worker that starts its handler (its start notice written with a
    heartbeat, as every heartbeat of a started handler carries it) and then goes silent."""
    claimed = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=lease_s)
    assert len(claimed) == 1
    job = claimed[0].job
    await node.attempts.heartbeat(job.job_id, job.fence, lease_s, started_at=node.clock.now_ms())
    return job.job_id


async def test_a_job_finished_through_its_owner_never_gets_a_lease_check(tmp_path: Path) -> None:
    node, clock = make_node(tmp_path / "a.db")
    await node.start()
    try:
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        await advance(node, clock, 1.5)
        fence = (await node.jobs.get(await _claim_one(node, lease_s=30))).fence
        await node.attempts.complete(job.job_id, fence)
        entries = await all_entries(node, job)
        assert [e.due_at for e in entries] == [START_MS + 1000], "an entry beside the job's own"
        await advance(node, clock, 70)  # minute 0 ended and settled: the cursor passes it
        assert (await node.store.get_shard(job.shard)).cursor > minute_of(START_MS)
    finally:
        await node.stop()


async def test_a_job_still_running_past_its_minute_gets_its_check_and_a_new_owner_expires_it(
    tmp_path: Path,
) -> None:
    """Claimed with a 5-minute lease and abandoned: when the owner is to pass the claim's
    minute it writes the lease check (due when the lease ends) and the cursor moves on. The
    owner then dies; the next one, reading from the cursor, finds the check and expires the
    lease on time. Without the check the job would have run for ever as far as the store
    knows (its only other entry is behind the cursor)."""
    db = tmp_path / "a.db"
    node, clock = make_node(db)
    await node.start()
    try:
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000, max_attempts=1)
        )
        await advance(node, clock, 1.5)
        await _claim_one(node, lease_s=300)
        await advance(node, clock, 70, step=1)
        lease_until = (await node.jobs.get(job.job_id)).lease_until
        checks = [e for e in await all_entries(node, job) if e.due_at == lease_until]
        assert len(checks) == 1, await all_entries(node, job)
        assert (await node.store.get_shard(job.shard)).cursor > minute_of(START_MS)
    finally:
        await node.stop()
    again, _ = make_node(db, clock=clock)
    await again.start()
    try:
        assert isinstance(clock, FakeClock)
        await advance(again, clock, (lease_until - clock.now_ms()) / 1000 + 2, step=5)
        dead = await again.jobs.get(job.job_id)
        assert dead.state is JobState.DEAD and dead.last_error == LEASE_EXPIRED
        assert dead.finished_at is not None and dead.finished_at <= lease_until + 10_000
    finally:
        await again.stop()


async def test_a_lease_that_ends_is_still_found_on_time_by_its_owner(tmp_path: Path) -> None:
    """No check entry: the owner looks at the job again when its lease ends (the entries the
    claim left pending come up then), and the expiry is a failed attempt as before."""
    node, clock = make_node(tmp_path / "a.db")
    await node.start()
    try:
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000, max_attempts=1)
        )
        await advance(node, clock, 1.5)
        await _claim_one(node, lease_s=5)
        await advance(node, clock, 6, step=0.5)
        dead = await node.jobs.get(job.job_id)
        assert dead.state is JobState.DEAD and dead.last_error == LEASE_EXPIRED
        assert dead.finished_at is not None
        assert dead.finished_at - (START_MS + 1500) < 5000 + MINUTE_MS // 60
    finally:
        await node.stop()


class _CursorGate(SqliteStore):
    """The embedded store, holding one shard's next cursor write until ``release`` is set:
    its dispatcher waits there, between writing its lease checks and looking at what is due."""

    def __init__(self) -> None:
        super().__init__(":memory:", num_shards=4)
        self.shard = -1
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        if shard == self.shard:
            self.shard = -1
            self.entered.set()
            await self.release.wait()
        return await super().save_cursor(shard, epoch, cursor)


async def test_a_give_back_in_the_millisecond_of_the_lease_check_leaves_the_job_due() -> None:
    """What left a job ``scheduled`` and never run in the overload load test. The owner passes
    the claim's minute after the lease ended: the lease check it writes is due at once, now.
    In that same millisecond the job is given back unstarted: its entry, due now, is the very
    same entry (shard, minute, due time, job). The give-back ends the run, which handles the
    check; the entry the give-back wrote must still be looked at, or the job is never made
    ready again and the cursor passes it (invariant 3)."""
    store = _CursorGate()
    clock = FakeClock(START_MS)
    # Each dispatcher refreshes itself: one step reads, moves the cursor (writing the checks),
    # then looks at what is due, so the check comes before the lease's own expiry.
    config = NodeConfig(dispatch=DispatchConfig(node_refresh=False))
    node = Node(
        store=store, coordinator=LocalCoordinator(), clock=clock, config=config, node_id="n"
    )
    await node.start()
    try:
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 1000)
        )
        await advance(node, clock, 1.5)
        (claimed,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=5)
        store.shard = job.shard
        clock.advance(64.5)  # minute 0 settled, the lease over: the check is due now
        await wait_until(store.entered.is_set, what="the owner writing its cursor")
        now = clock.now_ms()
        checks = [e for e in await all_entries(node, job) if e.due_at >= now]
        assert len(checks) == 1 and checks[0].due_at == now, await all_entries(node, job)
        back = await node.attempts.give_back(
            job.job_id, claimed.job.fence, f"{NOT_STARTED}: push behind", not_started=True
        )
        assert (back.state, back.run_at) == (JobState.SCHEDULED, now)
        # One entry: the check is the give-back's entry too.
        assert [e for e in await all_entries(node, job) if e.due_at >= now] == checks
        store.release.set()
        await wait_until(lambda: node.ready.count() == 1, what="the job due again")
        (again,) = await node.claims.claim(worker="w2", types=["t"], limit=1, wait_s=0, lease_s=5)
        done = await node.attempts.complete(job.job_id, again.job.fence)
        assert (done.state, done.attempt, done.unstarted) == (JobState.SUCCEEDED, 1, 1)
    finally:
        await node.stop()
