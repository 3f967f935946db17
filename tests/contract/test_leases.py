"""The conditional job writes (invariant 5): each applies only with the right state and fence,
says what it found when it does not, and then has changed nothing."""

from __future__ import annotations

import asyncio

import pytest

from tests.contract.conftest import OpenStore
from tests.contract.helpers import (
    LEASE_MS,
    NOW,
    assert_stored,
    assert_unchanged,
    claim,
    claimed,
    create,
    created,
    entries_of,
    make_job,
)
from timeshard.errors import InvalidArgument
from timeshard.model import RESCHEDULED, Job, JobState
from timeshard.store.base import Completion, Store

# -- claim ------------------------------------------------------------------------------------


async def test_claim_takes_a_scheduled_job_with_its_fence(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "c1")
        [out] = await store.claim_jobs([claim(job, worker="w1", lease_ms=LEASE_MS)])
        got = await assert_stored(store, out)
        assert got.state is JobState.RUNNING
        assert (got.lease_owner, got.lease_until, got.started_at) == ("w1", NOW + LEASE_MS, NOW)
        assert (got.attempt, got.fence) == (1, 1)
        [attempt] = got.history
        assert (attempt.attempt, attempt.worker, attempt.started_at) == (1, "w1", NOW)
        assert (got.run_at, got.payload, got.job_type) == (job.run_at, job.payload, job.job_type)
        # Invariant 2: a claim writes no lease-check entry. The entry that made the job ready
        # stays pending with the shard's owner (ShardDispatcher.claimed, tested in
        # tests/unit/test_lease_checks.py), which writes a check only for a job still running
        # when that entry's minute is to be passed.
        assert await entries_of(store, got, NOW + LEASE_MS) == []


async def test_claim_with_a_stale_fence_changes_nothing(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "c2")
        [out] = await store.claim_jobs([claim(job, fence=7)])
        await assert_unchanged(store, out, job)
        assert await entries_of(store, job, NOW + LEASE_MS) == []


async def test_claim_of_a_running_job_is_rejected(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "c3")
        running = await claimed(store, job, worker="w1")
        for fence in (0, 1):
            [out] = await store.claim_jobs([claim(job, worker="w2", fence=fence)])
            await assert_unchanged(store, out, running)


async def test_claim_of_a_missing_job_reports_none(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "present")
        ghost = job.with_(job_id="ghost")
        [out] = await store.claim_jobs([claim(ghost)])
        assert not out.applied and out.job is None
        assert await store.get_job("ghost") is None


async def test_claims_in_a_batch_are_answered_in_order(open_store: OpenStore) -> None:
    async with open_store() as store:
        a = await created(store, "b-a")
        b = await created(store, "b-b")
        outs = await store.claim_jobs([claim(a), claim(b, fence=3), claim(a.with_(job_id="none"))])
        assert [o.applied for o in outs] == [True, False, False]
        assert outs[0].job is not None and outs[0].job.job_id == "b-a"
        assert outs[1].job == b and outs[2].job is None


async def test_concurrent_claims_of_one_job_have_one_winner(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "race")
        outs = await asyncio.gather(
            *(store.claim_jobs([claim(job, worker=f"w{i}")]) for i in range(8))
        )
        winners = [o for [o] in outs if o.applied]
        assert len(winners) == 1
        stored = await store.get_job("race")
        assert stored == winners[0].job
        assert stored is not None and (stored.fence, stored.attempt) == (1, 1)
        assert all(o.job == stored for [o] in outs)


# -- heartbeat ---------------------------------------------------------------------------------


async def test_a_heartbeat_moves_the_lease_forward_only(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "r1"))
        out = await store.heartbeat("r1", running.fence, NOW + 4 * 60_000)
        extended = await assert_stored(store, out)
        assert extended == running.with_(lease_until=NOW + 4 * 60_000)
        back = await store.heartbeat("r1", running.fence, NOW + 3 * 60_000)
        assert back.applied and back.job == extended  # never backwards
        assert await entries_of(store, running, NOW + 4 * 60_000) == []  # heartbeats write none


async def test_a_heartbeat_with_a_stale_fence_or_state_is_rejected(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "r2")
        out = await store.heartbeat("r2", 0, NOW + 60_000)  # not running
        await assert_unchanged(store, out, job)
        running = await claimed(store, job)
        stale = await store.heartbeat("r2", running.fence - 1, NOW + 60_000)
        await assert_unchanged(store, stale, running)
        missing = await store.heartbeat("nope", 1, NOW)
        assert not missing.applied and missing.job is None


# -- complete ---------------------------------------------------------------------------------


async def test_complete_finishes_the_lease_holder(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "d1"))
        out = await store.complete_job("d1", running.fence, NOW + 500)
        done = await assert_stored(store, out)
        assert done.state is JobState.SUCCEEDED and done.finished_at == NOW + 500
        assert done.fence == running.fence and done.attempt == 1
        [attempt] = done.history
        assert (attempt.finished_at, attempt.outcome) == (NOW + 500, "succeeded")
        again = await store.complete_job("d1", running.fence, NOW + 900)
        await assert_unchanged(store, again, done)


async def test_complete_with_a_stale_fence_changes_nothing(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "d2")
        early = await store.complete_job("d2", 0, NOW)  # scheduled, never claimed
        await assert_unchanged(store, early, job)
        running = await claimed(store, job)
        stale = await store.complete_job("d2", running.fence + 1, NOW)
        await assert_unchanged(store, stale, running)


async def test_completions_in_one_call_are_each_conditional_and_answered_in_order(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        first = await claimed(store, await created(store, "d3"))
        stale = await claimed(store, await created(store, "d4"))
        second = await claimed(store, await created(store, "d5"))
        outs = await store.complete_jobs(
            [
                Completion("d3", first.fence, b'{"n":1}', "json"),
                Completion("d4", stale.fence + 1),
                Completion("no-such-job", 1),
                Completion("d5", second.fence),
            ],
            NOW + 500,
        )
        assert [o.applied for o in outs] == [True, False, False, True]
        done = await assert_stored(store, outs[0])
        assert done.state is JobState.SUCCEEDED and (done.result, done.result_encoding) == (
            b'{"n":1}',
            "json",
        )
        await assert_unchanged(store, outs[1], stale)  # its own fence failed; the rest applied
        assert outs[2].job is None
        assert (await assert_stored(store, outs[3])).finished_at == NOW + 500


async def test_completions_with_a_bad_result_write_nothing(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "d6"))
        with pytest.raises(InvalidArgument):
            await store.complete_jobs(
                [Completion("d6", running.fence), Completion("d6", running.fence, b"x", "nope")],
                NOW,
            )
        assert await store.get_job("d6") == running


# -- fail -------------------------------------------------------------------------------------


async def test_fail_with_a_retry_time_schedules_the_job_again(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "f1"))
        retry_at = NOW + 5 * 60_000
        out = await store.fail_job("f1", running.fence, NOW + 100, "timeout", retry_at)
        retrying = await assert_stored(store, out)
        assert retrying.state is JobState.SCHEDULED and retrying.run_at == retry_at
        assert retrying.last_error == "timeout" and retrying.fence == running.fence
        [attempt] = retrying.history
        assert (attempt.error, attempt.finished_at) == ("timeout", NOW + 100)
        assert [e.due_at for e in await entries_of(store, retrying, retry_at)] == [retry_at]
        # The next claim moves the fence on from where the failed one left it.
        [again] = await store.claim_jobs([claim(retrying, worker="w2")])
        second = await assert_stored(store, again)
        assert (second.attempt, second.fence, len(second.history)) == (2, 2, 2)


async def test_fail_without_a_retry_time_makes_the_job_dead(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "f2"))
        out = await store.fail_job("f2", running.fence, NOW + 100, "bad input", None)
        dead = await assert_stored(store, out)
        assert dead.state is JobState.DEAD and dead.last_error == "bad input"
        assert dead.finished_at == NOW + 100 and dead.history[-1].error == "bad input"
        assert dead.payload == running.payload  # kept for inspection and replay


async def test_fail_with_a_stale_fence_changes_nothing(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "f3"))
        out = await store.fail_job("f3", running.fence - 1, NOW, "x", NOW + 5 * 60_000)
        await assert_unchanged(store, out, running)
        assert await entries_of(store, running, NOW + 5 * 60_000) == []


# -- release ----------------------------------------------------------------------------------


async def test_release_of_an_expired_lease_is_a_failed_attempt_retried(
    open_store: OpenStore,
) -> None:
    """After a start notice (here the owner's, ``started=True``) an expired lease is a
    failed attempt."""
    async with open_store() as store:
        running = await claimed(store, await created(store, "l1"), lease_ms=30_000)
        retry_at = NOW + 5 * 60_000
        early = await store.release_lease("l1", running.fence, NOW + 29_999, retry_at, started=True)
        await assert_unchanged(store, early, running)
        out = await store.release_lease("l1", running.fence, NOW + 30_000, retry_at, started=True)
        back = await assert_stored(store, out)
        assert back.state is JobState.SCHEDULED and back.fence == running.fence
        assert back.lease_owner == "" and back.run_at == retry_at
        assert back.last_error == "lease expired"
        [attempt] = back.history
        assert (attempt.outcome, attempt.error) == ("lease expired", "lease expired")
        assert attempt.finished_at == NOW + 30_000
        # Invariant 2: the retry has its entry at the retry time.
        assert [e.due_at for e in await entries_of(store, back, retry_at)] == [retry_at]
        # The worker that lost the lease can no longer finish the job...
        late = await store.complete_job("l1", running.fence, NOW + 31_000)
        await assert_unchanged(store, late, back)
        # ...and the next claim fences it out for good.
        [again] = await store.claim_jobs([claim(back, worker="w2")])
        nxt = await assert_stored(store, again)
        assert nxt.fence == running.fence + 1 and nxt.attempt == 2


async def test_release_at_the_last_attempt_makes_the_job_dead(open_store: OpenStore) -> None:
    """The retry decided from the stored row, as the node does: attempts used up -> dead."""
    async with open_store() as store:
        job = await created(store, "l3", max_attempts=2)
        seen: list[tuple[int, int]] = []

        def retry_at(j: Job) -> int | None:
            seen.append((j.attempt, j.max_attempts))
            return None if j.attempt >= j.max_attempts else NOW

        first = await claimed(store, job, lease_ms=1_000)
        out = await store.release_lease("l3", first.fence, NOW + 1_000, retry_at, started=True)
        retried = await assert_stored(store, out)
        assert (retried.state, retried.attempt) == (JobState.SCHEDULED, 1)
        second = await claimed(store, retried, lease_ms=1_000)
        assert not second.start_noticed  # a claim is a delivery: no start yet
        # The start notice written with a heartbeat: any later owner counts the attempt.
        beat = await store.heartbeat("l3", second.fence, NOW + 1_500, started=True)
        assert (await assert_stored(store, beat)).start_noticed
        out = await store.release_lease("l3", second.fence, NOW + 2_000, retry_at)
        dead = await assert_stored(store, out)
        assert dead.state is JobState.DEAD and dead.attempt == dead.max_attempts == 2
        assert dead.finished_at == NOW + 2_000 and dead.last_error == "lease expired"
        assert [(a.attempt, a.outcome) for a in dead.history] == [
            (1, "lease expired"),
            (2, "lease expired"),
        ]
        assert dead.payload == job.payload  # kept for inspection and replay
        assert seen[-1] == (2, 2)
        # A dead job can not be claimed: it never runs a third time.
        [again] = await store.claim_jobs([claim(dead, worker="w3")])
        await assert_unchanged(store, again, dead)


async def test_release_with_no_start_notice_gives_the_job_back_uncounted(
    open_store: OpenStore,
) -> None:
    """Invariant 9: a lease that ran out before its handler started spends no attempt; the job
    is due again at once (its run_at kept), and its history says why."""
    async with open_store() as store:
        job = await created(store, "u1", max_attempts=1)
        running = await claimed(store, job, lease_ms=1_000)
        assert running.attempt == 1
        out = await store.release_lease(
            "u1", running.fence, NOW + 1_000, lambda j: None, max_unstarted=20
        )
        back = await assert_stored(store, out)
        assert back.state is JobState.SCHEDULED and back.attempt == 0 and back.unstarted == 1
        assert back.run_at == NOW + 1_000 and back.lease_owner == ""
        [delivery] = back.history
        assert delivery.outcome == "not started"
        assert delivery.error == "not started: lease over with no start notice from worker w1"
        assert back.last_error == delivery.error
        # Invariant 2: due now, so an entry at the release time.
        assert NOW + 1_000 in [e.due_at for e in await entries_of(store, back, NOW + 1_000)]
        # The next delivery is attempt 1 again; a result counts it.
        [again] = await store.claim_jobs([claim(back, worker="w2")])
        nxt = await assert_stored(store, again)
        assert nxt.attempt == 1 and nxt.fence == running.fence + 1
        done = await assert_stored(store, await store.complete_job("u1", nxt.fence, NOW + 1_100))
        assert done.state is JobState.SUCCEEDED and done.attempt == 1 and done.unstarted == 1


async def test_deliveries_without_a_start_are_bounded(open_store: OpenStore) -> None:
    """A job that can never be started ends dead, "never started", after ``max_unstarted``
    deliveries, whether given back unstarted or released with no start notice; a replay
    starts the count again."""
    async with open_store() as store:
        job = await created(store, "u2", max_attempts=5)
        first = await claimed(store, job, lease_ms=1_000)
        out = await store.give_back_job(
            "u2",
            first.fence,
            NOW + 10,
            "not started: lease over before the worker received it",
            not_started=True,
            max_unstarted=2,
        )
        back = await assert_stored(store, out)
        assert (back.state, back.attempt, back.unstarted) == (JobState.SCHEDULED, 0, 1)
        assert back.history[-1].outcome == "not started"
        assert back.history[-1].error == "not started: lease over before the worker received it"
        second = await claimed(store, back, lease_ms=1_000)
        out = await store.release_lease(
            "u2", second.fence, NOW + 2_000, lambda j: NOW, max_unstarted=2
        )
        dead = await assert_stored(store, out)
        assert dead.state is JobState.DEAD and dead.unstarted == 2 and dead.attempt == 0
        assert dead.last_error.startswith("never started: 2 deliveries ended without a handler")
        assert dead.finished_at == NOW + 2_000
        out = await store.replay_job("u2", dead.fence, NOW + 3_000, NOW + 3_000)
        replayed = await assert_stored(store, out)
        assert (replayed.state, replayed.unstarted, replayed.attempt) == (JobState.SCHEDULED, 0, 0)


async def test_release_with_a_stale_fence_changes_nothing(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "l2"), lease_ms=1_000)
        out = await store.release_lease("l2", running.fence + 1, NOW + 60_000, NOW + 60_000)
        await assert_unchanged(store, out, running)
        assert await entries_of(store, running, NOW + 60_000) == []


async def test_give_back_reschedules_now_without_counting_the_attempt(
    open_store: OpenStore,
) -> None:
    """A worker shutting down hands its job back: it runs again at once, and the attempt it
    did not finish does not use up one of ``max_attempts``."""
    async with open_store() as store:
        job = await created(store, "g1", max_attempts=1)
        running = await claimed(store, job)
        stale = await store.give_back_job("g1", running.fence + 1, NOW + 50, "worker shut down")
        await assert_unchanged(store, stale, running)
        out = await store.give_back_job("g1", running.fence, NOW + 100, "worker shut down")
        back = await assert_stored(store, out)
        assert (back.state, back.run_at, back.attempt) == (JobState.SCHEDULED, NOW + 100, 0)
        assert back.fence == running.fence and back.lease_owner == ""
        [attempt] = back.history
        assert (attempt.outcome, attempt.error) == ("given back", "worker shut down")
        assert NOW + 100 in [e.due_at for e in await entries_of(store, back, NOW + 100)]
        # The old holder's result is refused; the one attempt is still there to run.
        late = await store.complete_job("g1", running.fence, NOW + 200)
        await assert_unchanged(store, late, back)
        [again] = await store.claim_jobs([claim(back, worker="w2")])
        nxt = await assert_stored(store, again)
        assert (nxt.attempt, nxt.fence, len(nxt.history)) == (1, running.fence + 1, 2)


# -- cancel -----------------------------------------------------------------------------------


async def test_cancel_a_scheduled_job(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "x1")
        wrong_state = await store.cancel_job("x1", JobState.RUNNING, 0, NOW)
        await assert_unchanged(store, wrong_state, job)
        stale = await store.cancel_job("x1", JobState.SCHEDULED, 5, NOW)
        await assert_unchanged(store, stale, job)
        out = await store.cancel_job("x1", JobState.SCHEDULED, 0, NOW + 1)
        cancelled = await assert_stored(store, out)
        assert cancelled.state is JobState.CANCELLED and cancelled.fence == 1
        assert cancelled.finished_at == NOW + 1
        [late_claim] = await store.claim_jobs([claim(job)])
        await assert_unchanged(store, late_claim, cancelled)


async def test_cancel_a_running_job_revokes_its_lease(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "x2"))
        out = await store.cancel_job("x2", JobState.RUNNING, running.fence, NOW + 5)
        cancelled = await assert_stored(store, out)
        assert cancelled.state is JobState.CANCELLED and cancelled.fence == running.fence + 1
        assert cancelled.history[-1].outcome == "cancelled"
        for write in (
            store.heartbeat("x2", running.fence, NOW + 90_000),
            store.complete_job("x2", running.fence, NOW + 6),
            store.fail_job("x2", running.fence, NOW + 6, "boom", NOW + 60_000),
        ):
            await assert_unchanged(store, await write, cancelled)


async def test_cancel_a_finished_job_is_rejected(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "x3"))
        done = await assert_stored(store, await store.complete_job("x3", running.fence, NOW))
        for state in (JobState.SUCCEEDED, JobState.RUNNING):
            out = await store.cancel_job("x3", state, done.fence, NOW)
            await assert_unchanged(store, out, done)


# -- reschedule -------------------------------------------------------------------------------


async def test_reschedule_moves_run_at_and_writes_its_entry(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "s1", run_at=NOW + 10_000)
        out = await store.reschedule_job("s1", 0, NOW + 3_600_000, NOW)
        moved = await assert_stored(store, out)
        assert moved == job.with_(run_at=NOW + 3_600_000)
        assert [e.due_at for e in await entries_of(store, moved, NOW + 3_600_000)] == [
            NOW + 3_600_000
        ]
        past = await store.reschedule_job("s1", 0, NOW - 60_000, NOW)  # into the past: due now
        assert (await assert_stored(store, past)).run_at == NOW - 60_000
        assert NOW in [e.due_at for e in await entries_of(store, moved, NOW)]
        assert await entries_of(store, moved, NOW - 60_000) == []


async def test_reschedule_with_a_stale_fence_or_state_is_rejected(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "s2")
        later = NOW + 10 * 60_000
        stale = await store.reschedule_job("s2", 1, later, NOW)
        await assert_unchanged(store, stale, job)
        running = await claimed(store, job)
        busy = await store.reschedule_job("s2", running.fence, later, NOW)
        await assert_unchanged(store, busy, running)
        assert await entries_of(store, job, later) == []


async def _claimed_ahead(store: Store, job_id: str) -> Job:
    """A job due 400 ms after NOW, claimed ahead at NOW (``JobClaim.ahead_ms``)."""
    from dataclasses import replace

    job = await created(store, job_id, run_at=NOW + 400)
    ahead = replace(claim(job), now=NOW, lease_until=NOW + 400 + LEASE_MS, ahead_ms=500)
    [out] = await store.claim_jobs([ahead])
    got = await assert_stored(store, out)
    assert (got.state, got.attempt, got.started_at) == (JobState.RUNNING, 1, NOW + 400)
    return got


async def test_reschedule_of_a_job_claimed_ahead_ends_its_lease_uncounted(
    open_store: OpenStore,
) -> None:
    """A job claimed ahead and not yet due can be moved: its lease ends (``fence + 1``: its
    worker's writes are refused), the attempt does not count and is closed ``rescheduled``,
    and the job waits at least until that lease's end (a handler nobody has yet said never
    started must not overlap the next run). Then it moves as any scheduled job."""
    async with open_store() as store:
        ahead = await _claimed_ahead(store, "ra1")
        soon = NOW + 1_000
        out = await store.reschedule_job(
            "ra1", ahead.fence, soon, NOW, expect_state=JobState.RUNNING
        )
        got = await assert_stored(store, out)
        assert (got.state, got.fence, got.attempt, got.unstarted, got.start_noticed) == (
            JobState.SCHEDULED,
            ahead.fence + 1,
            0,
            0,
            False,
        )
        assert got.run_at == ahead.lease_until  # not the time asked: the lease is not over
        [closed] = got.history
        assert (closed.outcome, closed.finished_at) == (RESCHEDULED, NOW)
        assert got.run_at in [e.due_at for e in await entries_of(store, got, got.run_at)]
        late = await store.complete_job("ra1", ahead.fence, NOW + 500)  # its worker, stale
        await assert_unchanged(store, late, got)
        moved = await store.reschedule_job("ra1", got.fence, soon, NOW)
        assert (await assert_stored(store, moved)).run_at == soon
        far = await _claimed_ahead(store, "ra2")  # a time after the lease's end is kept
        out = await store.reschedule_job(
            "ra2", far.fence, NOW + 3_600_000, NOW, expect_state=JobState.RUNNING
        )
        assert (await assert_stored(store, out)).run_at == NOW + 3_600_000


async def test_reschedule_of_a_running_job_applies_only_to_one_claimed_ahead_not_yet_due(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        ahead = await _claimed_ahead(store, "ra3")
        for fence, now in ((ahead.fence - 1, NOW), (ahead.fence, NOW + 400)):  # stale; due
            out = await store.reschedule_job(
                "ra3", fence, NOW + 60_000, now, expect_state=JobState.RUNNING
            )
            await assert_unchanged(store, out, ahead)
        noticed = await store.heartbeat("ra3", ahead.fence, ahead.lease_until, started=True)
        started = await assert_stored(store, noticed)
        out = await store.reschedule_job(
            "ra3", ahead.fence, NOW + 60_000, NOW, expect_state=JobState.RUNNING
        )
        await assert_unchanged(store, out, started)
        due = await claimed(store, await created(store, "ra4"))  # claimed at its due time
        out = await store.reschedule_job(
            "ra4", due.fence, NOW + 60_000, NOW, expect_state=JobState.RUNNING
        )
        await assert_unchanged(store, out, due)


async def test_a_handler_started_before_its_reschedule_counts_its_attempt(
    open_store: OpenStore,
) -> None:
    """Its worker said the handler had started (the revoke's answer): the attempt counts, once;
    the job stays where the reschedule put it, after that lease's end."""
    async with open_store() as store:
        ahead = await _claimed_ahead(store, "ra5")
        out = await store.reschedule_job(
            "ra5", ahead.fence, NOW + 1_000, NOW, expect_state=JobState.RUNNING
        )
        moved = await assert_stored(store, out)
        counted = await store.amend_lease_end("ra5", moved.fence, NOW + 450, started=True)
        got = await assert_stored(store, counted)
        assert (got.attempt, got.unstarted, got.start_noticed) == (1, 0, True)
        assert (got.state, got.run_at, got.fence) == (JobState.SCHEDULED, moved.run_at, moved.fence)
        assert got.history[-1].outcome == RESCHEDULED
        again = await store.amend_lease_end("ra5", moved.fence, NOW + 460, started=True)
        await assert_unchanged(store, again, got)


async def test_the_writes_of_a_lease_claimed_ahead_name_its_worker(open_store: OpenStore) -> None:
    """Claimed in its owner's name, the lease's heartbeat, result or failure with ``worker``
    names that worker as the lease's owner and the attempt's worker; without, the name stays."""
    async with open_store() as store:
        ahead = await _claimed_ahead(store, "nw1")
        same = await store.heartbeat("nw1", ahead.fence, ahead.lease_until)
        assert (await assert_stored(store, same)).lease_owner == "w1"
        beat = await store.heartbeat("nw1", ahead.fence, ahead.lease_until, worker="w9")
        got = await assert_stored(store, beat)
        assert (got.lease_owner, [a.worker for a in got.history]) == ("w9", ["w9"])
        done = await store.complete_job("nw1", ahead.fence, NOW + 500, worker="w9")
        assert [a.worker for a in (await assert_stored(store, done)).history] == ["w9"]
        other = await _claimed_ahead(store, "nw2")
        [out] = await store.complete_jobs([Completion("nw2", other.fence, worker="w8")], NOW + 500)
        assert [a.worker for a in (await assert_stored(store, out)).history] == ["w8"]
        third = await _claimed_ahead(store, "nw3")
        failed = await store.fail_job("nw3", third.fence, NOW + 500, "boom", None, worker="w7")
        got = await assert_stored(store, failed)
        assert got.state is JobState.DEAD and [a.worker for a in got.history] == ["w7"]


async def test_claim_with_the_row_the_caller_read_is_right_even_when_that_row_is_stale(
    open_store: OpenStore,
) -> None:
    """``JobClaim.known`` lets a store skip its read; a stale one must cost a retry,
    never a wrong claim."""
    from dataclasses import replace

    async with open_store() as store:
        job = await created(store, "known-fresh")
        [out] = await store.claim_jobs([replace(claim(job), known=job)])
        assert out.applied and out.job is not None and out.job.fence == job.fence + 1
        assert await assert_stored(store, out) == out.job

        other = await created(store, "known-stale")
        rescheduled = await store.reschedule_job(other.job_id, other.fence, NOW - 5, NOW)
        assert rescheduled.applied  # the row moved on; `other` is now a stale image
        [out] = await store.claim_jobs([replace(claim(other), known=other)])
        assert out.applied and out.job is not None and out.job.run_at == NOW - 5

        done = await created(store, "known-done")
        taken = await claimed(store, done)
        [out] = await store.claim_jobs([replace(claim(done), known=done)])  # stale: it runs
        assert not out.applied and out.job == taken


async def test_a_claim_never_applies_before_the_job_is_due(open_store: OpenStore) -> None:
    """Never early, whatever the caller read: a job made ready and then rescheduled an hour
    later is not claimed with the image read before (it once ran at its old time)."""
    from dataclasses import replace

    async with open_store() as store:
        job = await created(store, "later")
        moved = await store.reschedule_job(job.job_id, job.fence, NOW + 3_600_000, NOW)
        assert moved.applied and moved.job is not None
        for known in (job, None):  # the stale image the ready queue held, or none
            [out] = await store.claim_jobs([replace(claim(job), known=known)])
            await assert_unchanged(store, out, moved.job)
        [late] = await store.claim_jobs([claim(moved.job)])  # at its new time it applies
        assert late.applied and late.job is not None and late.job.started_at == NOW + 3_600_000


@pytest.mark.parametrize("rival", ["cancel", "reschedule"])
async def test_a_claim_racing_a_cancel_or_reschedule_has_one_winner(
    open_store: OpenStore, rival: str
) -> None:
    """Sent at once, many times: exactly one of the two applies and the stored row is the
    winner's (a two-client version runs on Cassandra in integration)."""
    async with open_store() as store:
        jobs = [make_job(f"race-{rival}-{i}") for i in range(10)]
        await create(store, *jobs)
        for i, job in enumerate(jobs):
            other = (
                store.cancel_job(job.job_id, JobState.SCHEDULED, 0, NOW)
                if rival == "cancel"
                else store.reschedule_job(job.job_id, 0, NOW + 3_600_000, NOW)
            )
            claiming = store.claim_jobs([claim(job)])
            pair = (claiming, other) if i % 2 else (other, claiming)  # both orders
            first, second = await asyncio.gather(*pair)
            [claimed], moved = (first, second) if i % 2 else (second, first)
            assert claimed.applied != moved.applied, f"{job.job_id}: both or neither applied"
            winner = claimed if claimed.applied else moved
            assert await store.get_job(job.job_id) == winner.job
