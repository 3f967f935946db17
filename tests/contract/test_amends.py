"""``Store.amend_lease_end`` (invariant 9): a late word from a lease's worker amends how the
lease's end was counted — one conditional write, applied only while the job is ``scheduled``
at that fence with that lease's end as its newest history entry; a claim racing it wins or
loses whole."""

from __future__ import annotations

import dataclasses

from tests.contract.conftest import OpenStore
from tests.contract.helpers import (
    NOW,
    assert_stored,
    assert_unchanged,
    claim,
    claimed,
    created,
)
from timeshard.model import Job, JobState
from timeshard.store.base import Store

LATE_NOTICE = "lease expired: its start notice came after the lease's end"
FIRST_STEP = "not started: lease over before its handler's first step"
ENDS = NOW + 1_000  # the lease's end
RETRY = NOW + 60_000


async def released(
    store: Store, job_id: str, *, started: bool, max_attempts: int = 3, max_unstarted: int = 20
) -> Job:
    """``job_id`` claimed, and its one-second lease released at its end: counted after a
    start notice (retried at ``RETRY`` while attempts remain), uncounted without."""
    job = await created(store, job_id, max_attempts=max_attempts)
    running = await claimed(store, job, lease_ms=1_000)
    out = await store.release_lease(
        job_id,
        running.fence,
        ENDS,
        lambda j: RETRY if j.attempt < j.max_attempts else None,
        started=started,
        max_unstarted=max_unstarted,
    )
    return await assert_stored(store, out)


async def test_a_late_start_notice_counts_a_lease_released_as_not_started(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        back = await released(store, "a1", started=False)
        assert (back.attempt, back.unstarted) == (0, 1)
        out = await store.amend_lease_end("a1", back.fence, ENDS + 500, started=True)
        amended = await assert_stored(store, out)
        assert (amended.state, amended.fence, amended.run_at) == (
            JobState.SCHEDULED,
            back.fence,
            back.run_at,
        )
        assert (amended.attempt, amended.unstarted, amended.start_noticed) == (1, 0, True)
        [entry] = amended.history
        assert (entry.attempt, entry.outcome, entry.error) == (1, "lease expired", LATE_NOTICE)
        assert entry.finished_at == ENDS and amended.last_error == LATE_NOTICE
        # Once: the same word again, or the other direction, changes nothing.
        again = await store.amend_lease_end("a1", back.fence, ENDS + 600, started=True)
        await assert_unchanged(store, again, amended)
        # A claim computed from the row before the amend does not undo it.
        stale = dataclasses.replace(claim(back, worker="w2"), known=back)
        [taken] = await store.claim_jobs([stale])
        nxt = await assert_stored(store, taken)
        assert (nxt.attempt, nxt.unstarted, nxt.fence) == (2, 0, back.fence + 1)
        assert [a.outcome for a in nxt.history] == ["lease expired", ""]


async def test_a_late_give_back_uncounts_a_lease_end_counted_as_expired(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        back = await released(store, "b1", started=True)
        assert (back.attempt, back.unstarted, back.run_at) == (1, 0, RETRY)
        out = await store.amend_lease_end(
            "b1", back.fence, ENDS + 500, started=False, reason=FIRST_STEP
        )
        amended = await assert_stored(store, out)
        assert (amended.state, amended.fence, amended.run_at) == (
            JobState.SCHEDULED,
            back.fence,
            RETRY,
        )
        assert (amended.attempt, amended.unstarted, amended.start_noticed) == (0, 1, False)
        [entry] = amended.history
        assert (entry.outcome, entry.error, entry.finished_at) == ("not started", FIRST_STEP, ENDS)
        assert amended.last_error == FIRST_STEP
        again = await store.amend_lease_end(
            "b1", back.fence, ENDS + 600, started=False, reason=FIRST_STEP
        )
        await assert_unchanged(store, again, amended)


async def test_an_amend_never_applies_to_the_other_count(open_store: OpenStore) -> None:
    """A notice amends only an end counted as not started for want of one; a give-back only
    a counted ``lease expired``."""
    async with open_store() as store:
        counted = await released(store, "c1", started=True)
        out = await store.amend_lease_end("c1", counted.fence, ENDS + 1, started=True)
        await assert_unchanged(store, out, counted)
        unstarted = await released(store, "c2", started=False)
        out = await store.amend_lease_end(
            "c2", unstarted.fence, ENDS + 1, started=False, reason=FIRST_STEP
        )
        await assert_unchanged(store, out, unstarted)


async def test_no_amend_once_claimed_again_or_at_another_fence(open_store: OpenStore) -> None:
    async with open_store() as store:
        back = await released(store, "d1", started=False)
        for fence in (back.fence - 1, back.fence + 1):
            out = await store.amend_lease_end("d1", fence, ENDS + 1, started=True)
            await assert_unchanged(store, out, back)
        running = await claimed(store, back, worker="w2")
        out = await store.amend_lease_end("d1", back.fence, ENDS + 2, started=True)
        await assert_unchanged(store, out, running)
        counted = await released(store, "d2", started=True)
        running = await claimed(store, counted, worker="w2")
        out = await store.amend_lease_end(
            "d2", counted.fence, ENDS + 2, started=False, reason=FIRST_STEP
        )
        await assert_unchanged(store, out, running)


async def test_no_amend_of_a_dead_succeeded_or_replayed_job(open_store: OpenStore) -> None:
    async with open_store() as store:
        never = await released(store, "e1", started=False, max_unstarted=1)
        assert never.state is JobState.DEAD
        out = await store.amend_lease_end("e1", never.fence, ENDS + 1, started=True)
        await assert_unchanged(store, out, never)
        spent = await released(store, "e2", started=True, max_attempts=1)
        assert spent.state is JobState.DEAD
        out = await store.amend_lease_end(
            "e2", spent.fence, ENDS + 1, started=False, reason=FIRST_STEP
        )
        await assert_unchanged(store, out, spent)
        # A replay starts the count again: the old lease's word amends nothing.
        for job in (never, spent):
            replayed = await assert_stored(
                store, await store.replay_job(job.job_id, job.fence, ENDS + 2, ENDS + 2)
            )
            for started in (True, False):
                out = await store.amend_lease_end(
                    job.job_id, job.fence, ENDS + 3, started=started, reason=FIRST_STEP
                )
                await assert_unchanged(store, out, replayed)
        running = await claimed(store, await created(store, "e3"))
        done = await assert_stored(store, await store.complete_job("e3", running.fence, NOW + 1))
        for started in (True, False):
            out = await store.amend_lease_end(
                "e3", running.fence, NOW + 2, started=started, reason=FIRST_STEP
            )
            await assert_unchanged(store, out, done)
