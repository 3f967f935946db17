"""Deadlines: a job not started by its deadline is never run and ends ``expired`` with a reason,
whichever way it would have started late: found late by its dispatcher (the cluster was down),
held in a ready queue past it (no worker, a concurrency limit), taken by a claim after it, or
retried after it. Counted, listed by state, and refused when it could never start."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from tests.unit.helpers import START_MS, advance, make_node, running
from timeshard.clock import FakeClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import InvalidArgument
from timeshard.model import Job, JobState, WriteResult
from timeshard.node import JobSpec, Node, TypePolicy, dispatcher
from timeshard.sharding import shard_of
from timeshard.store.base import JobClaim
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.views.metrics import node_registry
from timeshard.views.page import render
from timeshard.views.status import node_status


async def state_becomes(node: Node, job_id: str, state: JobState, timeout: float = 10) -> Job:
    """The job once it is in ``state`` (the dispatcher writes it on its own time)."""
    return await wait_until(
        lambda: node.jobs.get(job_id),
        timeout,
        f"job {job_id} to be {state.value}",
        until=lambda job: job.state is state,
    )


def expired_count(node: object, job_type: str) -> float:
    text = generate_latest(node_registry(node)).decode()  # type: ignore[arg-type]
    line = f'timeshard_jobs_expired_total{{type="{job_type}"}} '
    values = [float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line)]
    return values[0] if values else 0.0


async def test_a_job_held_with_no_worker_expires_at_its_deadline() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(
                job_type="remind", payload=b"", run_at=START_MS + 1000, deadline=START_MS + 5000
            )
        )
        await advance(node, clock, 2)
        await wait_until(lambda: node.ready.count() == 1, what="the job ready")
        await advance(node, clock, 2.5)  # just before its deadline: still ready, still due
        assert (await node.jobs.get(job.job_id)).state is JobState.SCHEDULED
        assert node.ready.count() == 1
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == 0, what="the job out of the ready queue")
        got = await state_becomes(node, job.job_id, JobState.EXPIRED)
        assert got.state.terminal and got.history == () and got.attempt == 0
        assert "not started by its deadline 2027-01-15T08:00:05Z" in got.last_error
        assert START_MS + 5000 < got.finished_at <= clock.now_ms()
        assert expired_count(node, "remind") == 1
        page = await node.jobs.list_jobs(
            state=JobState.EXPIRED, job_type=None, limit=10, page_token=""
        )
        assert [j.job_id for j in page.jobs] == [job.job_id]
        # Nothing can start it any more.
        assert (
            await node.claims.claim(worker="w", types=["remind"], limit=1, wait_s=0, lease_s=30)
            == []
        )
        # The status page counts it, apart from lease expiries.
        page = render(await node_status(node))
        assert ">past deadline</th>" in page and ">lease expired</th>" in page
        row = page.split("<td>remind</td>")[1].split("</tr>")[0]
        cells = [c.split("<")[0] for c in row.split('class="num">')[1:]]
        # scheduled ... past deadline, not started, never started
        assert cells == ["1", "0", "0", "0", "0", "0", "0", "1", "0", "0"]


async def test_a_job_waiting_for_minutes_still_expires_at_its_deadline() -> None:
    """A due job waiting longer than a minute has its entry written again every minute (so it
    never pins the cursor): its deadline still holds through those moves."""
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="remind", payload=b"", run_at=START_MS, deadline=START_MS + 150_000)
        )
        await advance(node, clock, 149, step=5)
        assert (await node.jobs.get(job.job_id)).state is JobState.SCHEDULED
        assert node.ready.count() == 1
        await advance(node, clock, 5, step=1)
        await state_becomes(node, job.job_id, JobState.EXPIRED)
        # Its entries are handled: the cursor moves past its minutes.
        await advance(node, clock, 120, step=10)
        cursor = (await node.store.get_shard(job.shard)).cursor
        assert cursor * 60_000 > START_MS + 60_000


async def test_a_job_held_by_a_concurrency_limit_expires_too() -> None:
    types = {"limited": TypePolicy(concurrency=1)}
    async with running(types=types) as (node, clock):
        first, _ = await node.jobs.schedule(
            JobSpec(job_type="limited", payload=b"", run_at=START_MS)
        )
        held, _ = await node.jobs.schedule(
            JobSpec(
                job_type="limited", payload=b"", run_at=START_MS + 100, deadline=START_MS + 3000
            )
        )
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == 2, what="both jobs ready")
        [c] = await node.claims.claim(worker="w", types=["limited"], limit=2, wait_s=0, lease_s=60)
        assert c.job.job_id == first.job_id  # the older one; the other waits for room
        assert node.ready.count() == 1
        await advance(node, clock, 3)
        await wait_until(lambda: node.ready.count() == 0, what="the held job expired")
        await state_becomes(node, held.job_id, JobState.EXPIRED)


async def test_a_job_found_after_its_deadline_is_not_run(tmp_path: Path) -> None:
    """The cluster was down through the job's deadline: its dispatcher finds it late and
    expires it rather than hand it out hours late."""
    db = tmp_path / "down.db"
    node, clock = make_node(db)
    await node.start()
    job, _ = await node.jobs.schedule(
        JobSpec(job_type="remind", payload=b"", run_at=START_MS + 1000, deadline=START_MS + 2000)
    )
    await node.stop()
    clock.advance(3600)
    again, _ = make_node(db, clock)
    await again.start()
    try:
        await advance(again, clock, 2)
        await wait_until(
            lambda: expired_count(again, "remind") == 1, timeout=10, what="the job expired"
        )
        got = await again.jobs.get(job.job_id)
        assert got.state is JobState.EXPIRED and got.history == ()
        late_s = float(got.last_error.split("(expired ")[1].split("s after")[0])
        assert 3598 <= late_s <= 3600  # how late it was found
        assert again.ready.count() == 0
    finally:
        await again.stop()


class RecordingStore(SqliteStore):
    """Records the jobs every claim write names."""

    claimed_ids: list[str]

    async def claim_jobs(self, claims: Sequence[JobClaim]) -> list[WriteResult]:
        self.claimed_ids = [*getattr(self, "claimed_ids", []), *(c.job_id for c in claims)]
        return await super().claim_jobs(claims)


async def test_a_claim_taking_a_job_after_its_deadline_does_not_start_it() -> None:
    """The claim checks the deadline itself, before it writes: a job its dispatcher has not
    expired yet (the clock moved on, the loop did not) is handed back to be expired, and the
    claim's write never names it."""
    clock = FakeClock(START_MS)
    store = RecordingStore(":memory:", num_shards=4)
    node = Node(store=store, coordinator=LocalCoordinator(), clock=clock, node_id="test-node")
    await node.start()
    try:
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="remind", payload=b"", run_at=START_MS, deadline=START_MS + 1000)
        )
        await advance(node, clock, 0.5)
        await wait_until(lambda: node.ready.count() == 1, what="the job ready")
        clock.advance(1)  # past the deadline; the dispatcher has not run since
        assert (
            await node.claims.claim(worker="w", types=["remind"], limit=1, wait_s=0, lease_s=30)
            == []
        )
        assert job.job_id not in getattr(store, "claimed_ids", [])
        await state_becomes(node, job.job_id, JobState.EXPIRED)
    finally:
        await node.stop()


async def test_a_retry_never_starts_after_the_deadline() -> None:
    """Failed once, the job's retry (due before or after the deadline: the backoff is random)
    does not run after the deadline: it expires, the first attempt in its history."""
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="remind", payload=b"", run_at=START_MS, deadline=START_MS + 500)
        )
        await advance(node, clock, 0.2)
        [c] = await node.claims.claim(worker="w", types=["remind"], limit=1, wait_s=0, lease_s=30)
        failed = await node.attempts.fail(job.job_id, c.job.fence, "boom", permanent=False)
        assert failed.state is JobState.SCHEDULED
        await advance(node, clock, 600, step=5)  # past any backoff, with no claim
        got = await state_becomes(node, job.job_id, JobState.EXPIRED)
        assert got.attempt == 1 and [a.outcome for a in got.history] == ["retry"]


async def test_a_deadline_before_run_at_and_a_reschedule_past_it_are_refused() -> None:
    async with running() as (node, _):
        with pytest.raises(InvalidArgument) as bad:
            await node.jobs.schedule(
                JobSpec(
                    job_type="remind", payload=b"", run_at=START_MS + 2000, deadline=START_MS + 1000
                )
            )
        assert bad.value.field == "deadline" and "could never start" in str(bad.value)
        with pytest.raises(InvalidArgument) as negative:
            await node.jobs.schedule(
                JobSpec(job_type="remind", payload=b"", run_at=START_MS, deadline=-1)
            )
        assert negative.value.field == "deadline"
        job, _ = await node.jobs.schedule(
            JobSpec(
                job_type="remind", payload=b"", run_at=START_MS + 1000, deadline=START_MS + 5000
            )
        )
        with pytest.raises(InvalidArgument) as late:
            await node.jobs.reschedule(job.job_id, START_MS + 6000)
        assert late.value.field == "run_at" and "deadline" in str(late.value)
        moved = await node.jobs.reschedule(job.job_id, START_MS + 5000)
        assert moved.run_at == START_MS + 5000 and moved.deadline == START_MS + 5000


async def test_a_waiter_hears_of_an_expired_job() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="remind", payload=b"", run_at=START_MS, deadline=START_MS + 1000)
        )
        got = []

        async def wait() -> None:
            async for j in node.wait([job.job_id], 30):
                got.append(j)

        waiter = asyncio.create_task(wait())
        await advance(node, clock, 2)
        await asyncio.wait_for(waiter, 10)
        assert [j.state for j in got] == [JobState.EXPIRED]


async def test_deadline_timers_of_claimed_jobs_do_not_pile_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs claimed before their (far) deadline leave timers behind; once those outnumber the
    jobs held, the next job made ready rebuilds the heap from the jobs held, and a held job
    still expires at its deadline."""
    monkeypatch.setattr(dispatcher, "DEADLINE_TIMERS_SLACK", 10)
    async with running() as (node, clock):
        far = START_MS + 86_400_000
        for _ in range(300):
            await node.jobs.schedule(
                JobSpec(job_type="busy", payload=b"", run_at=START_MS, deadline=far)
            )
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == 300, what="all ready")
        while await node.claims.claim(
            worker="w", types=["busy"], limit=1000, wait_s=0, lease_s=600
        ):
            pass
        assert sum(len(d._deadlines) for d in node.dispatchers.values()) == 300
        # Two held jobs in each shard: a shard where none is made ready keeps its timers
        # until one is (random ids left one shard without, now and then, and the test failed).
        shards = node.store.num_shards
        ids = [f"idle-{n}" for n in range(1000)]
        per_shard = [[i for i in ids if shard_of(i, shards) == s][:2] for s in range(shards)]
        assert all(len(two) == 2 for two in per_shard)
        held = [
            (
                await node.jobs.schedule(
                    JobSpec(
                        job_type="idle",
                        payload=b"",
                        run_at=START_MS + 1000,
                        deadline=START_MS + 3000,
                        job_id=job_id,
                    )
                )
            )[0]
            for two in per_shard
            for job_id in two
        ]
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == len(held), what="the idle jobs ready")
        assert sum(len(d._deadlines) for d in node.dispatchers.values()) <= len(held) + shards * 11
        await advance(node, clock, 2)
        for j in held:
            await state_becomes(node, j.job_id, JobState.EXPIRED)
