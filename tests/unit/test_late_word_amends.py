"""Invariant 9 when the owner decided first (fake clock, embedded store): a word from the
worker about a lease that already ended — its start notice, a result, a give-back "not
started" — amends how that lease's end was counted, while the job was not claimed again; a
job claimed again, at another fence, dead or succeeded keeps what it has. (Issue 33: a
starved owner reached the lease's end before it read a message the worker had already sent.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.helpers import LEASE_S, START_MS, advance, claim_one, node_with
from timeshard.clock import FakeClock
from timeshard.errors import StaleFence
from timeshard.model import Job, JobState, WriteResult
from timeshard.node import Beat, JobSpec, Node, TypePolicy
from timeshard.node.attempts import FinishItem
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until

LATE_NOTICE = "lease expired: its start notice came after the lease's end"
FIRST_STEP = "not started: lease over before its handler's first step"


class NoticeDuringRelease(SqliteStore):
    """Runs ``during`` as a release is written: after the owner decided it, before it lands."""

    during: Callable[[], None] | None = None

    async def release_lease(self, *args: Any, **kw: Any) -> WriteResult:
        if self.during is not None:
            self.during()
        return await super().release_lease(*args, **kw)


async def released_unnoticed(node: Node, clock: FakeClock, max_attempts: int = 3) -> Job:
    """A job whose lease ran out with no start notice: back, uncounted."""
    await node.jobs.schedule(
        JobSpec(job_type="t", payload=b"{}", run_at=START_MS, max_attempts=max_attempts)
    )
    job_id, _ = await claim_one(node, clock)
    await advance(node, clock, LEASE_S + 1)
    back = await node.jobs.get(job_id)
    assert (back.state, back.attempt, back.unstarted) == (JobState.SCHEDULED, 0, 1), back
    assert back.history[-1].outcome == "not started"
    return back


async def released_counted(node: Node, clock: FakeClock, max_attempts: int = 3) -> Job:
    """A job whose lease ran out after its start notice: a failed attempt."""
    await node.jobs.schedule(
        JobSpec(job_type="t", payload=b"{}", run_at=START_MS, max_attempts=max_attempts)
    )
    job_id, fence = await claim_one(node, clock)
    node.attempts.notice_starts([Beat(job_id, fence, 0.0, clock.now_ms())])
    await advance(node, clock, LEASE_S + 1)
    back = await node.jobs.get(job_id)
    assert back.history[-1].outcome == "lease expired" and back.attempt == 1, back
    return back


async def late_notice(node: Node, clock: FakeClock, job_id: str, fence: int) -> None:
    """A start notice on a worker stream (written in the background), and its writes done."""
    node.attempts.notice_starts([Beat(job_id, fence, 0.0, clock.now_ms())])
    await wait_until(
        lambda: not any(t.get_name().startswith("start-notice-") for t in node._background),
        what="the notice's writes",
    )


def counts(job: Job) -> tuple[JobState, int, int, int]:
    return job.state, job.fence, job.attempt, job.unstarted


# -- A: its handler ran; the owner released it as not started first ----------------------------


async def test_a_start_notice_after_the_lease_end_counts_the_attempt() -> None:
    async with node_with() as (node, clock):
        back = await released_unnoticed(node, clock)
        await late_notice(node, clock, back.job_id, back.fence)
        amended = await node.jobs.get(back.job_id)
        assert counts(amended) == (JobState.SCHEDULED, back.fence, 1, 0)
        assert amended.start_noticed and amended.run_at == back.run_at
        last = amended.history[-1]
        assert (last.outcome, last.error) == ("lease expired", LATE_NOTICE)
        assert last.finished_at == back.history[-1].finished_at  # when the lease ended
        assert amended.last_error == LATE_NOTICE
        # Its result was never written: it runs again, as attempt 2 (2 runs, 2 attempts).
        await wait_until(lambda: node.ready.count() == 1, what="the job due again")
        (again,) = await node.claims.claim(
            worker="w2", types=["t"], limit=1, wait_s=0, lease_s=LEASE_S
        )
        assert (again.job.attempt, again.job.fence) == (2, back.fence + 1)
        # A second late word of the same lease changes nothing more.
        await late_notice(node, clock, back.job_id, back.fence)
        assert (await node.jobs.get(back.job_id)).attempt == 2


async def test_a_start_notice_read_while_the_release_is_written_counts_the_attempt() -> None:
    """The owner decided "no notice", then read one before its release landed: amended."""
    store = NoticeDuringRelease(":memory:", num_shards=4)
    async with node_with(store) as (node, clock):
        await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        job_id, fence = await claim_one(node, clock)

        def notice() -> None:
            node.attempts.notice_starts([Beat(job_id, fence, 0.0, clock.now_ms())])

        store.during = notice
        await advance(node, clock, LEASE_S + 1)
        amended = await node.jobs.get(job_id)
        assert counts(amended) == (JobState.SCHEDULED, fence, 1, 0)
        assert amended.history[-1].outcome == "lease expired"
        await wait_until(lambda: node.ready.count() == 1, what="the job due again")


@pytest.mark.parametrize("word", ["heartbeat", "complete", "fail"])
async def test_a_late_heartbeat_or_result_counts_the_attempt_and_is_still_refused(
    word: str,
) -> None:
    """A heartbeat carrying the notice, or a result (its handler ran), counts the attempt;
    the word itself is refused as stale, so the job runs again (at least once)."""
    async with node_with() as (node, clock):
        back = await released_unnoticed(node, clock)
        with pytest.raises(StaleFence):
            if word == "heartbeat":
                await node.attempts.heartbeat(
                    back.job_id, back.fence, LEASE_S, started_at=clock.now_ms()
                )
            elif word == "complete":
                await node.attempts.complete(back.job_id, back.fence, b"1", "json")
            else:
                await node.attempts.fail(back.job_id, back.fence, "boom", permanent=False)
        amended = await node.jobs.get(back.job_id)
        assert counts(amended) == (JobState.SCHEDULED, back.fence, 1, 0)
        assert amended.history[-1].outcome == "lease expired" and amended.result == b""


async def test_a_late_result_in_a_finish_batch_counts_the_attempt() -> None:
    async with node_with() as (node, clock):
        back = await released_unnoticed(node, clock)
        [answer] = await node.attempts.finish([FinishItem(job_id=back.job_id, fence=back.fence)])
        assert isinstance(answer, StaleFence)
        amended = await node.jobs.get(back.job_id)
        assert counts(amended) == (JobState.SCHEDULED, back.fence, 1, 0)


async def test_an_amend_that_reaches_max_attempts_never_makes_the_job_dead() -> None:
    """The amend leaves the job scheduled; its next run's end decides, by the usual rule."""
    async with node_with() as (node, clock):
        back = await released_unnoticed(node, clock, max_attempts=1)
        await late_notice(node, clock, back.job_id, back.fence)
        amended = await node.jobs.get(back.job_id)
        assert counts(amended) == (JobState.SCHEDULED, back.fence, 1, 0)
        job_id, fence = await claim_one(node, clock, worker="w2")
        assert (await node.jobs.get(job_id)).attempt == 2
        dead = await node.attempts.fail(job_id, fence, "boom", permanent=False)
        assert (dead.state, dead.attempt) == (JobState.DEAD, 2)


# -- B: its handler never stepped; the owner counted the lease's end first ----------------------


async def test_a_give_back_not_started_after_a_counted_lease_end_uncounts_it() -> None:
    async with node_with() as (node, clock):
        back = await released_counted(node, clock)
        with pytest.raises(StaleFence):
            await node.attempts.give_back(back.job_id, back.fence, FIRST_STEP, not_started=True)
        amended = await node.jobs.get(back.job_id)
        assert counts(amended) == (JobState.SCHEDULED, back.fence, 0, 1)
        assert not amended.start_noticed and amended.run_at == back.run_at
        last = amended.history[-1]
        assert (last.outcome, last.error) == ("not started", FIRST_STEP)
        assert amended.last_error == FIRST_STEP
        # Once only: the same give-back again changes nothing.
        with pytest.raises(StaleFence):
            await node.attempts.give_back(back.job_id, back.fence, FIRST_STEP, not_started=True)
        assert counts(await node.jobs.get(back.job_id)) == (JobState.SCHEDULED, back.fence, 0, 1)


async def test_a_give_back_after_a_handler_ran_does_not_uncount() -> None:
    """A shutdown give-back (its handler started) is not "not started": no amend."""
    async with node_with() as (node, clock):
        back = await released_counted(node, clock)
        with pytest.raises(StaleFence):
            await node.attempts.give_back(back.job_id, back.fence, "worker shut down")
        assert counts(await node.jobs.get(back.job_id)) == (JobState.SCHEDULED, back.fence, 1, 0)


# -- what a late word never amends --------------------------------------------------------------


async def test_a_job_claimed_again_keeps_its_count() -> None:
    async with node_with() as (node, clock):
        back = await released_unnoticed(node, clock)
        job_id, fence = await claim_one(node, clock, worker="w2")
        assert fence == back.fence + 1
        await late_notice(node, clock, job_id, back.fence)
        with pytest.raises(StaleFence):
            await node.attempts.complete(job_id, back.fence)
        now = await node.jobs.get(job_id)
        assert counts(now) == (JobState.RUNNING, fence, 1, 1)
        assert not now.start_noticed


async def test_a_word_of_another_fence_amends_nothing() -> None:
    async with node_with() as (node, clock):
        back = await released_unnoticed(node, clock)
        for fence in (back.fence - 1, back.fence + 1):
            await late_notice(node, clock, back.job_id, fence)
            with pytest.raises(StaleFence):
                await node.attempts.complete(back.job_id, fence)
        assert await node.jobs.get(back.job_id) == back


async def test_a_dead_job_stays_dead() -> None:
    types = {"t": TypePolicy(max_unstarted=1)}
    async with node_with(types=types) as (node, clock):
        await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        job_id, fence = await claim_one(node, clock)
        await advance(node, clock, LEASE_S + 1)  # no notice: dead, never started
        dead = await node.jobs.get(job_id)
        assert counts(dead) == (JobState.DEAD, fence, 0, 1)
        await late_notice(node, clock, job_id, fence)
        with pytest.raises(StaleFence):
            await node.attempts.complete(job_id, fence)
        assert await node.jobs.get(job_id) == dead


async def test_a_counted_lease_end_that_made_the_job_dead_is_not_uncounted() -> None:
    async with node_with() as (node, clock):
        dead = await released_counted(node, clock, max_attempts=1)
        assert counts(dead) == (JobState.DEAD, dead.fence, 1, 0)
        with pytest.raises(StaleFence):
            await node.attempts.give_back(dead.job_id, dead.fence, FIRST_STEP, not_started=True)
        assert await node.jobs.get(dead.job_id) == dead


async def test_a_succeeded_job_keeps_its_count() -> None:
    async with node_with() as (node, clock):
        await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        job_id, fence = await claim_one(node, clock)
        done = await node.attempts.complete(job_id, fence)
        with pytest.raises(StaleFence):
            await node.attempts.give_back(job_id, fence, FIRST_STEP, not_started=True)
        await late_notice(node, clock, job_id, fence)
        assert await node.jobs.get(job_id) == done
        assert (done.state, done.attempt, done.unstarted) == (JobState.SUCCEEDED, 1, 0)
