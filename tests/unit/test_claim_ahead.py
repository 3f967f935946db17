"""Claims ahead (``DispatchConfig.claim_ahead_ms``, ``node.ahead``): the owner claims jobs due
within the window before they are due and holds them; at due time a waiting claim gets them
with no store call, never before their due time. A cancel through the owner drops a held job;
a held job no worker took is released, not started, at its lease's end."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from tests.unit.helpers import START_MS, advance, running, settle
from timeshard.clock import FakeClock
from timeshard.errors import FailedPrecondition
from timeshard.limits import START_GRACE_MS
from timeshard.model import Job, JobState, WriteResult
from timeshard.node import JobSpec, TypePolicy
from timeshard.node.ahead import HELD
from timeshard.node.claims import Claimed
from timeshard.node.dispatcher import DispatchConfig
from timeshard.store.base import JobClaim
from timeshard.testing.waits import wait_until

DUE = START_MS + 2000


def spy_claims(node: object) -> list[tuple[int, list[JobClaim]]]:
    """Each ``claim_jobs`` call: the (fake) time it was made and its claims."""
    store = node.store  # type: ignore[attr-defined]
    original = store.claim_jobs
    calls: list[tuple[int, list[JobClaim]]] = []

    async def claim_jobs(claims: Sequence[JobClaim]) -> list[WriteResult]:
        calls.append((node.clock.now_ms(), list(claims)))  # type: ignore[attr-defined]
        return await original(claims)

    store.claim_jobs = claim_jobs
    return calls


def waiting_claim(node: object, job_type: str = "t") -> asyncio.Task:  # type: ignore[type-arg]
    return asyncio.create_task(
        node.claims.claim(  # type: ignore[attr-defined]
            worker="w", types=[job_type], limit=10, wait_s=60, lease_s=30
        )
    )


async def schedule(node: object, n: int, job_type: str = "t", run_at: int = DUE) -> list[str]:
    jobs = node.jobs  # type: ignore[attr-defined]
    return [
        (await jobs.schedule(JobSpec(job_type=job_type, payload=b"", run_at=run_at)))[0].job_id
        for _ in range(n)
    ]


async def pushed(node: Any, clock: FakeClock, lease_s: float = 30) -> Claimed:
    """The one job scheduled (due at ``DUE``), claimed ahead and pushed 100 ms before it is
    due to worker ``w``, which starts jobs on its own clock and asked for ``lease_s``."""
    claim = asyncio.create_task(
        node.claims.claim(worker="w", types=["t"], limit=1, wait_s=60, lease_s=lease_s, early=True)
    )
    await advance(node, clock, 1.9, step=0.1)
    await wait_until(claim.done, 10, "the held job pushed to a worker that starts it later")
    (c,) = claim.result()
    return c


async def test_jobs_are_claimed_ahead_and_handed_over_at_due_time_without_a_store_call() -> None:
    async with running(claim_ahead_ms=300) as (node, clock):
        calls = spy_claims(node)
        ids = await schedule(node, 3)
        claim = waiting_claim(node)
        await advance(node, clock, 1.9, step=0.1)  # 100 ms before due: inside half the window
        await settle(node)

        async def rows_now() -> list[Job]:
            return [await node.jobs.get(i) for i in ids]

        # (the fake clock stands still meanwhile: a loaded machine's store thread is slower)
        rows = await wait_until(
            rows_now,
            10,
            "the claims ahead",
            until=lambda rs: all(r.state is JobState.RUNNING for r in rs),
        )
        assert all(r.lease_owner == node.ahead.holder for r in rows)
        assert all(r.started_at == DUE for r in rows)  # the attempt is claimed at due time
        assert calls and all(at < DUE for at, _ in calls)
        assert all(c.ahead_ms == node.ahead.reach_ms == 1200 for _, cs in calls for c in cs)
        assert not claim.done(), "a held job was handed over before its due time"
        made = len(calls)
        await advance(node, clock, 0.15, step=0.05)
        await wait_until(claim.done, 5, "the waiting claim to get the held jobs")
        got = claim.result()
        while len(got) < len(ids):  # (each shard hands its own over: claims go on)
            more = waiting_claim(node)
            await wait_until(more.done, 5, "the next claim to get the other held jobs")
            got += more.result()
        assert sorted(c.job.job_id for c in got) == sorted(ids)
        assert node.clock.now_ms() >= DUE
        assert len(calls) == made, "the hand-over made a store call"
        for c in got:  # the lease left when it was handed over: from due time on
            assert 0 < c.lease_ms <= c.job.lease_until - DUE


async def test_a_cancel_through_the_owner_drops_a_held_job() -> None:
    async with running(claim_ahead_ms=300) as (node, clock):
        (job_id,) = await schedule(node, 1)
        claim = waiting_claim(node)
        await advance(node, clock, 1.9, step=0.1)
        await settle(node)
        assert (await node.jobs.get(job_id)).state is JobState.RUNNING  # held
        cancelled = await node.jobs.cancel(job_id, wait_s=0.0)
        assert cancelled.state is JobState.CANCELLED and not cancelled.start_noticed
        await advance(node, clock, 1.0, step=0.1)
        await settle(node)
        assert not claim.done(), "a cancelled held job was handed to a worker"
        assert node.ready.count() == 0
        claim.cancel()


async def test_nothing_is_claimed_ahead_without_a_waiting_claim_or_under_a_limit() -> None:
    types = {"limited": TypePolicy(concurrency=2)}
    async with running(types=types, claim_ahead_ms=300) as (node, clock):
        (idle,) = await schedule(node, 1)  # no claim waits for "t"
        (limited,) = await schedule(node, 1, job_type="limited")
        claim = waiting_claim(node, "limited")
        await advance(node, clock, 1.9, step=0.1)
        await settle(node)
        assert (await node.jobs.get(idle)).state is JobState.SCHEDULED
        assert (await node.jobs.get(limited)).state is JobState.SCHEDULED
        await advance(node, clock, 0.3, step=0.1)
        await wait_until(claim.done, 5, "the limited job claimed at its due time")
        assert [c.job.job_id for c in claim.result()] == [limited]


async def test_a_held_job_no_worker_takes_is_released_not_started_at_its_lease_end() -> None:
    async with running(claim_ahead_ms=300) as (node, clock):
        (job_id,) = await schedule(node, 1)
        claim = waiting_claim(node)
        await advance(node, clock, 1.9, step=0.1)
        await settle(node)
        held = await node.jobs.get(job_id)
        assert held.state is JobState.RUNNING
        claim.cancel()  # the worker went away before the job was due
        await advance(node, clock, 0.3 + node.config.default_lease_s + 1, step=0.5)
        await settle(node)
        back = await node.jobs.get(job_id)
        assert back.state is JobState.SCHEDULED and back.attempt == 0 and back.unstarted == 1
        again = waiting_claim(node)
        await advance(node, clock, 1.0, step=0.1)
        await wait_until(again.done, 5, "the released job claimed again")
        (c,) = again.result()
        assert c.job.job_id == job_id and c.job.attempt == 1


@pytest.mark.parametrize(
    ("ahead_ms", "problem"), [(-1, "negative"), (5000, "less than the lookahead")]
)
def test_a_bad_window_is_refused(ahead_ms: int, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        DispatchConfig(claim_ahead_ms=ahead_ms)


async def test_a_cancel_through_a_node_that_did_not_push_it_waits_until_its_latest_start() -> None:
    """A job another node claimed ahead may sit with a worker that starts it on its own clock:
    a cancel answered elsewhere waits until that worker can no longer start it (its due time
    plus the start's grace), so no handler starts after the cancel is acknowledged."""
    async with running() as (node, clock):
        (job_id,) = await schedule(node, 1)
        job = await node.jobs.get(job_id)
        claim = JobClaim(
            job_id=job_id,
            expect_fence=job.fence,
            worker=f"other{HELD}",
            now=clock.now_ms(),
            lease_until=DUE + 30_000,
            ahead_ms=5000,
            known=job,
        )
        (out,) = await node.store.claim_jobs([claim])
        assert out.applied
        cancel = asyncio.create_task(node.jobs.cancel(job_id, wait_s=30))
        await advance(node, clock, (DUE + START_GRACE_MS - clock.now_ms()) / 1000 - 0.1, 0.1)
        await settle(node)
        assert not cancel.done(), "answered while a worker could still start it"
        await advance(node, clock, 1.0, step=0.1)
        await wait_until(cancel.done, 5, "the cancel's answer")
        assert cancel.result().state is JobState.CANCELLED


async def test_a_held_job_cancelled_after_a_claim_took_it_is_not_handed_out() -> None:
    """A claim that took a held job (lingering, say) and a cancel through the owner before it
    hands the job out: the owner drops it (``forget``), and the claim gives nothing."""
    async with running(claim_ahead_ms=300) as (node, clock):
        (job_id,) = await schedule(node, 1)
        claim = waiting_claim(node)
        await advance(node, clock, 1.9, step=0.1)
        await settle(node)
        job = await wait_until(
            lambda: node.jobs.get(job_id), 10, "held", until=lambda j: j.state is JobState.RUNNING
        )
        claim.cancel()
        d = node.dispatchers[job.shard]
        item = d._holding.items[job_id]
        assert d.forget(job_id) is True  # still held: no worker got it
        assert item.dropped
        assert node.claims._hand_out([item], "w", 30_000, clock.now_ms()) == []


async def test_a_held_job_rescheduled_through_the_owner_moves_and_is_not_handed_out() -> None:
    """A job claimed ahead and held, rescheduled before it is due: answered at once (no
    worker got it), ``scheduled`` at the time asked with the attempt not counted, and handed
    out at its new time, not its old one."""
    async with running(claim_ahead_ms=300) as (node, clock):
        (job_id,) = await schedule(node, 1)
        claim = waiting_claim(node)
        await advance(node, clock, 1.9, step=0.1)
        held = await wait_until(
            lambda: node.jobs.get(job_id), 10, "held", until=lambda j: j.state is JobState.RUNNING
        )
        later = DUE + 5000
        moved = await asyncio.wait_for(node.jobs.reschedule(job_id, later), 10)
        assert (moved.state, moved.run_at, moved.attempt) == (JobState.SCHEDULED, later, 0)
        assert moved.fence == held.fence + 1 and not moved.start_noticed
        await advance(node, clock, 1.0, step=0.1)
        await settle(node)
        assert not claim.done(), "a rescheduled held job was handed out at its old time"
        await advance(node, clock, (later - clock.now_ms()) / 1000 + 0.2, step=0.1)
        await wait_until(claim.done, 10, "the job at its new time")
        (c,) = claim.result()
        assert c.job.job_id == job_id and clock.now_ms() >= later


@pytest.mark.parametrize("started", [False, True])
async def test_a_pushed_job_rescheduled_is_answered_with_the_workers_revoke(
    started: bool,
) -> None:
    """Pushed with ``starts_in`` and rescheduled before its due time: the lease ends, the
    push is revoked, and the answer waits for the worker's word. Not started: the job is at
    the time asked. Started (the handler began at the due time as the reschedule came): the
    answer says so, the attempt counts, and the job runs again no earlier than that lease's
    end, so the two runs can not overlap."""
    async with running(claim_ahead_ms=300) as (node, clock):
        (job_id,) = await schedule(node, 1)
        c = await pushed(node, clock)
        assert clock.now_ms() < DUE
        revoked: list[tuple[str, int]] = []
        node.starts.pushed(job_id, c.job.fence, DUE + START_GRACE_MS, lambda *r: revoked.append(r))
        later = DUE + 5000
        move = asyncio.create_task(node.jobs.reschedule(job_id, later))
        await wait_until(lambda: revoked, 10, "the revoke on the worker's stream")
        assert revoked == [(job_id, c.job.fence)]
        await settle(node)
        assert not move.done(), "answered before the worker answered the revoke"
        node.starts.answered(job_id, c.job.fence, started)
        out = await asyncio.wait_for(move, 10)
        assert out.state is JobState.SCHEDULED and out.start_noticed is started
        assert out.fence == c.job.fence + 1
        if started:
            assert out.attempt == 1 and out.run_at == c.job.lease_until
        else:
            assert out.attempt == 0 and out.run_at == later
        assert await node.jobs.get(job_id) == out


async def test_a_job_claimed_ahead_that_is_due_can_not_be_rescheduled() -> None:
    async with running(claim_ahead_ms=300) as (node, clock):
        (job_id,) = await schedule(node, 1)
        await pushed(node, clock)
        await advance(node, clock, 0.2, step=0.1)  # due now: its handler may have started
        assert clock.now_ms() >= DUE
        with pytest.raises(FailedPrecondition, match="claimed ahead that is not yet due"):
            await node.jobs.reschedule(job_id, DUE + 60_000)
        assert (await node.jobs.get(job_id)).state is JobState.RUNNING


async def test_the_worker_a_held_job_went_to_is_named_by_its_first_write() -> None:
    """Claimed ahead in its owner's name, handed to worker ``w`` with no write: the lease's
    first heartbeat names ``w`` as its owner, and its result names ``w`` as the attempt's
    worker (a job claimed at its due time is named by its claim)."""
    async with running(claim_ahead_ms=300) as (node, clock):
        ids = await schedule(node, 2)
        got: list = []  # type: ignore[type-arg]
        await advance(node, clock, 1.8, step=0.1)
        while len(got) < len(ids):
            claim = asyncio.create_task(
                node.claims.claim(
                    worker="w", types=["t"], limit=10, wait_s=60, lease_s=30, early=True
                )
            )
            await advance(node, clock, 0.1, step=0.05)
            await wait_until(claim.done, 10, "the held jobs pushed to w")
            got += claim.result()
        one, two = got
        assert one.job.lease_owner == node.ahead.holder  # (as the row says until a write)
        await advance(node, clock, 0.3, step=0.1)  # due
        beat, _ = await node.attempts.heartbeat(one.job.job_id, one.job.fence, 30)
        assert beat.lease_owner == "w" and beat.history[-1].worker == "w"
        done = await node.attempts.complete(one.job.job_id, one.job.fence)
        failed = await node.attempts.fail(two.job.job_id, two.job.fence, "boom", permanent=True)
        for job in (done, failed, await node.jobs.get(two.job.job_id)):
            assert [a.worker for a in job.history] == ["w"]


async def test_a_job_claimed_ahead_takes_the_lease_its_workers_ask_for() -> None:
    """Not the node's default lease: a worker lost with the job frees it after the lease it
    asked for, counted from the due time, as a claim at due time would."""
    async with running(claim_ahead_ms=300) as (node, clock):
        await schedule(node, 1)
        c = await pushed(node, clock, lease_s=2)
        assert c.job.lease_until == DUE + 2000 != DUE + node.config.lease_ms(0)
        assert c.lease_ms == DUE + 2000 - clock.now_ms()


def block_due_time_claims(node: object) -> asyncio.Event:
    """Claims at due time (a worker's) wait in their store write until the event is set, as a
    Paxos round keeps them on Cassandra; claims ahead (the owner's) go through."""
    store = node.store  # type: ignore[attr-defined]
    original = store.claim_jobs
    release = asyncio.Event()

    async def claim_jobs(claims: Sequence[JobClaim]) -> list[WriteResult]:
        if any(c.worker != node.ahead.holder for c in claims):  # type: ignore[attr-defined]
            await release.wait()
        return await original(claims)

    store.claim_jobs = claim_jobs
    return release


@pytest.mark.parametrize("backlog", [False, True])
async def test_a_claim_writing_due_jobs_lets_the_next_be_claimed_ahead_unless_a_backlog(
    backlog: bool,
) -> None:
    """A worker's claims may all be writing jobs claimed at their due time when the next jobs
    come within the window: the worker is there all the same, so those are claimed ahead (had
    they been claimed at due time too, the claims would keep writing, and the node would not
    go back to claiming ahead). A job of the type ready for over ``AHEAD_BACKLOG_MS`` (the
    claim took one of two) still means a backlog: the next are claimed at their due time."""
    async with running(claim_ahead_ms=300) as (node, clock):
        release = block_due_time_claims(node)
        first = await schedule(node, 2 if backlog else 1)  # no claim yet: not held
        (later,) = await schedule(node, 1, run_at=DUE + 1500)  # beyond the first's reach
        await advance(node, clock, 2.1, step=0.1)
        await wait_until(lambda: node.ready.count() == len(first), 5, "the first ready")
        writing = asyncio.create_task(
            node.claims.claim(worker="w", types=["t"], limit=1, wait_s=60, lease_s=30)
        )
        await wait_until(lambda: node.ready.count() == len(first) - 1, 5, "the claim's take")
        await advance(node, clock, 1.3, step=0.1)  # the later job is within half the window
        row = await node.jobs.get(later)
        if backlog:
            assert node.claims.may_claim_ahead("t") is False
            assert row.state is JobState.SCHEDULED
        else:
            row = await wait_until(
                lambda: node.jobs.get(later),
                10,
                "the later job claimed ahead while the claim writes",
                until=lambda j: j.state is JobState.RUNNING,
            )
            assert row.lease_owner == node.ahead.holder and row.started_at == DUE + 1500
        release.set()
        await wait_until(writing.done, 5, "the claim's write")
        took = [c.job.job_id for c in writing.result()]
        assert len(took) == 1 and took[0] in first
        got: list[str] = []
        while later not in got:  # (the other first job, under a backlog, goes before it)
            claim = waiting_claim(node)
            await advance(node, clock, 0.2, step=0.05)
            await wait_until(claim.done, 5, "the later job claimed")
            got += [c.job.job_id for c in claim.result()]
        assert clock.now_ms() >= DUE + 1500
        assert sorted(got) == sorted([*(set(first) - set(took)), later])


async def test_a_job_handed_out_early_is_held_no_more() -> None:
    """A held job that a claim whose worker starts it on its own clock (``early``) took from
    the early lane is held no more: its due time is not among the times the dispatcher's loop
    waits for (it would wake it for nothing), and a cancel finds it with its worker."""
    async with running(claim_ahead_ms=300) as (node, clock):
        (job_id,) = await schedule(node, 1)
        claim = asyncio.create_task(
            node.claims.claim(worker="w", types=["t"], limit=10, wait_s=60, lease_s=30, early=True)
        )
        await advance(node, clock, 1.9, step=0.1)  # 100 ms before due: in the early lane
        await wait_until(claim.done, 10, "the early claim")
        assert [c.job.job_id for c in claim.result()] == [job_id]
        d = node.dispatchers[claim.result()[0].job.shard]
        assert job_id not in d._holding.items
        assert d._holding.next_time() is None, "its due time still wakes the dispatcher"
        assert d.forget(job_id) is False  # with its worker, not held here
