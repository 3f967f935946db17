"""An expired lease after a start notice is a failed attempt: a job whose worker started it and
then dies or hangs is retried after its type's backoff and, at ``max_attempts``, is dead with
its history, never re-run for ever (without a notice: tests/unit/test_late_never_dead.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.helpers import START_MS, advance, all_entries, running
from timeshard.clock import FakeClock
from timeshard.errors import StaleFence
from timeshard.model import LEASE_EXPIRED, Job, JobState
from timeshard.node import Beat, JobSpec, Node, TypePolicy
from timeshard.node.retry import RetryPolicy

BACKOFF = RetryPolicy(base_s=10.0, max_backoff_s=10.0)
LEASE_S = 5.0


async def _assert_has_entry(node: Node, job: Job) -> None:
    """Invariant 2: a live job has an entry no later than it next needs attention."""
    attention = job.next_attention()
    if attention is None:
        return
    entries = await all_entries(node, job)
    assert any(e.due_at <= attention for e in entries), f"{job} has no entry by {attention}"


async def _claim_and_abandon(
    node: Node,
    clock: FakeClock,
    job_id: str,
    rounds: int,
    until: Callable[[Job], bool] | None = None,
) -> list[int]:
    """Claim the job whenever it is handed out and let its lease run out (a worker that dies
    or hangs), for ``rounds`` half-seconds, or until the job is as ``until`` says. Returns the
    fake times of the claims."""
    claims: list[int] = []
    for _ in range(rounds):
        for c in await node.claims.claim(
            worker="w", types=["poison"], limit=1, wait_s=0, lease_s=LEASE_S
        ):
            assert c.job.job_id == job_id
            claims.append(clock.now_ms())
            node.attempts.notice_starts([Beat(job_id, c.job.fence, 0.0, clock.now_ms())])
        await advance(node, clock, 0.5)
        job = await node.jobs.get(job_id)
        assert job.attempt <= job.max_attempts, f"attempt {job.attempt}/{job.max_attempts}"
        await _assert_has_entry(node, job)
        if until is not None and until(job):
            break
    return claims


async def test_a_job_whose_leases_expire_is_retried_with_backoff_then_dead() -> None:
    types = {"poison": TypePolicy(retry=BACKOFF)}
    async with running(types=types) as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="poison", payload=b"{}", run_at=START_MS, max_attempts=2)
        )
        # The first run: claimed, abandoned, its lease expires.
        # Until the first expiry: a window of fixed length also took the retry now and then
        # (its backoff is drawn from [0, 10 s], and a short one fell inside the window).
        claims = await _claim_and_abandon(
            node,
            clock,
            job.job_id,
            40,
            until=lambda j: j.attempt == 1 and j.state is JobState.SCHEDULED,
        )
        assert len(claims) == 1
        retrying = await node.jobs.get(job.job_id)
        assert retrying.state is JobState.SCHEDULED and retrying.attempt == 1
        assert retrying.last_error == LEASE_EXPIRED
        assert [a.outcome for a in retrying.history] == [LEASE_EXPIRED]
        # Retried after the type's backoff (full jitter within 10 s of the expiry), not at once.
        expired_at = retrying.history[0].finished_at
        assert expired_at is not None
        assert expired_at <= retrying.run_at <= expired_at + BACKOFF.ceiling_ms(1)

        # Long enough for the backoff, the second run and many more expiries (old code: an
        # expiry never counted, the job ran again every 5 s for ever).
        claims += await _claim_and_abandon(node, clock, job.job_id, 120)
        dead = await node.jobs.get(job.job_id)
        assert len(claims) == 2, f"claimed {len(claims)} times with max_attempts=2"
        assert claims[1] >= retrying.run_at  # never early
        assert dead.state is JobState.DEAD
        assert (dead.attempt, dead.max_attempts) == (2, 2)
        assert dead.last_error == LEASE_EXPIRED and dead.payload == b"{}"
        assert [(a.attempt, a.outcome) for a in dead.history] == [
            (1, LEASE_EXPIRED),
            (2, LEASE_EXPIRED),
        ]
        page = await node.dead_letters.page(job_type="poison", since_ms=0, limit=10, page_token="")
        assert [j.job_id for j in page.jobs] == [job.job_id]
        totals = node.metrics.totals()["poison"]
        assert totals["lease_expiries"] == 2
        assert (totals["retries"], totals["dead_lettered"]) == (1, 1)
        assert [e.kind for e in node.metrics.dead] == ["dead"]


async def test_a_heartbeat_after_the_expiry_is_refused_and_the_retry_stands() -> None:
    """The worker that lost its lease can not revive the attempt that was counted."""
    async with running(types={"poison": TypePolicy(retry=BACKOFF)}) as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="poison", payload=b"", run_at=START_MS))
        await advance(node, clock, 0.5)
        [c] = await node.claims.claim(
            worker="w", types=["poison"], limit=1, wait_s=0, lease_s=LEASE_S
        )
        node.attempts.notice_starts([Beat(job.job_id, c.job.fence, 0.0, clock.now_ms())])
        await advance(node, clock, LEASE_S + 1)
        retrying = await node.jobs.get(job.job_id)
        assert retrying.state is JobState.SCHEDULED and retrying.attempt == 1
        with pytest.raises(StaleFence):
            await node.attempts.heartbeat(job.job_id, c.job.fence, LEASE_S)
        assert await node.jobs.get(job.job_id) == retrying


class _NoBackoff(RetryPolicy):
    """A backoff drawn as 0 ms: full jitter draws it now and then (1 in 201 at a base of
    0.2 s), and then the retry's entry is the very entry that found the lease over."""

    def delay_ms(self, attempt: int, rng: object) -> int:
        return 0


async def test_a_retry_due_at_the_instant_its_lease_ended_runs() -> None:
    """The lease ends at ``t`` (a heartbeat moved it there, so a check entry is due at ``t``),
    the dispatcher finds it over at ``t`` to the millisecond, and the retry's backoff is 0: the
    retry's entry (due ``t``) is the check entry being handled. It must be looked at again,
    not dropped with it (the job stayed scheduled until the shard changed hands)."""
    policy = TypePolicy(retry=_NoBackoff(base_s=0.2, max_backoff_s=0.2))
    async with running(types={"poison": policy}) as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="poison", payload=b"", run_at=START_MS))
        await advance(node, clock, 0.5)
        [c] = await node.claims.claim(
            worker="w", types=["poison"], limit=1, wait_s=0, lease_s=LEASE_S
        )
        node.attempts.notice_starts([Beat(job.job_id, c.job.fence, 0.0, clock.now_ms())])
        await advance(node, clock, 1.0)
        beat, _ = await node.attempts.heartbeat(job.job_id, c.job.fence, LEASE_S)
        lease_end = clock.now_ms() + round(LEASE_S * 1000)
        assert beat.lease_until == lease_end
        await advance(node, clock, LEASE_S)  # steps of 0.5 s: one lands on the lease's end
        retrying = await node.jobs.get(job.job_id)
        assert retrying.state is JobState.SCHEDULED and retrying.attempt == 1
        assert retrying.run_at == lease_end == retrying.history[0].finished_at
        await advance(node, clock, 0.5)
        again = await node.claims.claim(
            worker="w2", types=["poison"], limit=1, wait_s=0, lease_s=LEASE_S
        )
        assert [a.job.job_id for a in again] == [job.job_id], "the retry was never handed out"
