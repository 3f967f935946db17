"""The lease protocol's state transitions, shared by every store.

Each conditional write of the contract is a ``Transition``: the condition the stored job must
meet, the job it becomes, and the bucket entry the new job needs (invariant 2). A store only
decides how to apply one atomically: SQLite in one transaction, Cassandra as a lightweight
transaction on the row image it read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from timeshard.limits import DEFAULT_MAX_UNSTARTED
from timeshard.model import GIVEN_BACK, LEASE_EXPIRED, NEVER_STARTED, NOT_STARTED, Job, JobState
from timeshard.store.base import JobClaim, MaxUnstarted, RetryAt
from timeshard.store.history import finish_attempt, new_attempt


def _no_entry(_: Job) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class Transition:
    condition: Callable[[Job], bool]
    change: Callable[[Job], Job]
    entry_at: Callable[[Job], int | None] = _no_entry
    """When the changed job needs the dispatcher's attention, or None."""
    now: int = 0
    kind: str = ""
    """What it is (``claim``, ``complete``...): the store counts its rounds by kind."""


def _running_with(fence: int) -> Callable[[Job], bool]:
    return lambda j: j.state is JobState.RUNNING and j.fence == fence


def claim(c: JobClaim) -> Transition:
    """Never early: a job rescheduled to later since it was made ready does not apply. Never
    late: a job past its deadline does not apply either (the dispatcher expires it). A claim
    ahead (``ahead_ms``) takes a job due within that time: its owner holds it until it is due,
    so the attempt's claim time is the due time (the handler never starts before it).

    No entry is written: the entry that made the job ready stays pending with its owner, which
    looks at the job again when the lease ends, and writes a lease check only for a job still
    running when its minute is to be passed (``ShardDispatcher.claimed``)."""
    return Transition(
        lambda j: (
            j.state is JobState.SCHEDULED
            and j.fence == c.expect_fence
            and j.run_at <= c.now + c.ahead_ms
            and not j.past_deadline(max(c.now, j.run_at))
        ),
        lambda j: j.with_(
            state=JobState.RUNNING,
            lease_owner=c.worker,
            lease_until=c.lease_until,
            attempt=j.attempt + 1,  # the number the attempt will have once its handler starts
            fence=j.fence + 1,
            started_at=max(c.now, j.run_at),
            start_noticed=False,
            history=(*j.history, new_attempt(j, c.worker, max(c.now, j.run_at))),
        ),
        now=c.now,
        kind="claim",
    )


def heartbeat(fence: int, lease_until: int, started: bool = False) -> Transition:
    """The lease extended (never shortened); ``started``: the heartbeat carries the worker's
    start notice, kept with the row so that any later owner counts the attempt."""
    return Transition(
        _running_with(fence),
        lambda j: j.with_(
            lease_until=max(j.lease_until, lease_until),
            start_noticed=j.start_noticed or started,
        ),
        kind="heartbeat",
    )


def complete(fence: int, now: int, result: bytes = b"", result_encoding: str = "") -> Transition:
    """The handler's result is stored with the succeeded job (checked by ``Job``: size and
    encoding)."""
    return Transition(
        _running_with(fence),
        lambda j: j.with_(
            state=JobState.SUCCEEDED,
            finished_at=now,
            start_noticed=True,  # a result: its handler ran
            lease_owner="",
            history=finish_attempt(j, now, "succeeded"),
            result=result,
            result_encoding=result_encoding,
        ),
        kind="complete",
    )


def _failed(
    now: int, error: str, retry: RetryAt, outcome: str | None = None, traceback: str = ""
) -> Callable[[Job], Job]:
    """A failed attempt: ``scheduled`` at the retry time, or ``dead`` without one. ``outcome``
    names the closed attempt (default: ``retry`` or ``dead``)."""

    def change(j: Job) -> Job:
        retry_at = retry(j) if callable(retry) else retry
        if retry_at is None:
            return j.with_(
                state=JobState.DEAD,
                finished_at=now,
                lease_owner="",
                last_error=error,
                history=finish_attempt(j, now, outcome or "dead", error, traceback),
            )
        return j.with_(
            state=JobState.SCHEDULED,
            run_at=retry_at,
            lease_owner="",
            last_error=error,
            history=finish_attempt(j, now, outcome or "retry", error, traceback),
        )

    return change


def _retry_entry(j: Job) -> int | None:
    return j.run_at if j.state is JobState.SCHEDULED else None


def fail(fence: int, now: int, error: str, retry: RetryAt, traceback: str = "") -> Transition:
    return Transition(
        _running_with(fence),
        _failed(now, error, retry, traceback=traceback),
        _retry_entry,
        now,
        kind="fail",
    )


def release(
    fence: int,
    now: int,
    retry: RetryAt,
    *,
    started: bool = False,
    max_unstarted: MaxUnstarted = DEFAULT_MAX_UNSTARTED,
) -> Transition:
    """An expired lease after a start notice (``started``: the owner holds one; or one written
    with the row) is a failed attempt: retried at ``retry`` like a retryable failure, or dead
    when there is none (attempts exhausted). With no start notice the handler is taken as never
    started: the job goes back uncounted (``unstarted``), invariant 9."""
    failed = _failed(now, LEASE_EXPIRED, retry, LEASE_EXPIRED)
    back = _unstarted(
        now,
        lambda j: f"{NOT_STARTED}: lease over with no start notice from worker {j.lease_owner}",
        max_unstarted,
    )

    def change(j: Job) -> Job:
        return failed(j) if started or j.start_noticed else back(j)

    return Transition(
        lambda j: _running_with(fence)(j) and j.lease_until <= now,
        change,
        _retry_entry,
        now,
        kind="release",
    )


def _unstarted(
    now: int, reason: Callable[[Job], str], max_unstarted: MaxUnstarted
) -> Callable[[Job], Job]:
    """A delivery whose handler never started: ``scheduled`` again at once (``run_at`` now,
    the time its entry is written for, invariant 2), the attempt not counted,
    ``unstarted`` one more; dead once that reaches ``max_unstarted``. ``reason(job)`` says why,
    in the history and as the last error."""

    def change(j: Job) -> Job:
        why = reason(j)
        unstarted = j.unstarted + 1
        history = finish_attempt(j, now, NOT_STARTED, why)
        bound = max_unstarted(j) if callable(max_unstarted) else max_unstarted
        if unstarted >= bound:
            return j.with_(
                state=JobState.DEAD,
                finished_at=now,
                attempt=max(0, j.attempt - 1),
                unstarted=unstarted,
                lease_owner="",
                start_noticed=False,
                last_error=(
                    f"{NEVER_STARTED}: {unstarted} deliveries ended without a handler start "
                    f"(the last: {why})"
                ),
                history=history,
            )
        return j.with_(
            state=JobState.SCHEDULED,
            run_at=max(j.run_at, now),
            attempt=max(0, j.attempt - 1),
            unstarted=unstarted,
            lease_owner="",
            start_noticed=False,
            last_error=why,
            history=history,
        )

    return change


def give_back(
    fence: int,
    now: int,
    reason: str,
    *,
    not_started: bool = False,
    max_unstarted: MaxUnstarted = DEFAULT_MAX_UNSTARTED,
) -> Transition:
    """The lease holder hands the job back unfinished: ``scheduled`` now, and the attempt is
    not counted (``attempt - 1``; its history entry stays, as ``given back``). ``not_started``:
    its handler never started (a delivery, not an attempt: ``unstarted`` one more, bounded by
    ``max_unstarted``)."""
    if not_started:
        back = _unstarted(now, lambda _: reason, max_unstarted)
        return Transition(_running_with(fence), back, _retry_entry, now, kind="give_back")
    return Transition(
        _running_with(fence),
        lambda j: j.with_(
            state=JobState.SCHEDULED,
            run_at=now,
            attempt=max(0, j.attempt - 1),
            lease_owner="",
            last_error=reason,
            history=finish_attempt(j, now, GIVEN_BACK, reason),
        ),
        _retry_entry,
        now,
        kind="give_back",
    )


def expire(fence: int, now: int, reason: str) -> Transition:
    """A job still ``scheduled`` after its deadline is not run: ``expired``, with ``reason``
    as its last error. Only once the deadline has passed, so a claim and an expiry of the same
    job can never both apply (the claim requires ``now <= deadline``)."""
    return Transition(
        lambda j: j.state is JobState.SCHEDULED and j.fence == fence and j.past_deadline(now),
        lambda j: j.with_(
            state=JobState.EXPIRED, finished_at=now, lease_owner="", last_error=reason
        ),
        kind="expire",
    )


def cancel(expect_state: JobState, fence: int, now: int) -> Transition:
    return Transition(
        lambda j: j.state is expect_state and j.fence == fence and not j.state.terminal,
        lambda j: j.with_(
            state=JobState.CANCELLED,
            fence=j.fence + 1,
            finished_at=now,
            lease_owner="",
            history=finish_attempt(j, now, "cancelled")
            if j.state is JobState.RUNNING
            else j.history,
        ),
        kind="cancel",
    )


def reschedule(fence: int, run_at: int, now: int) -> Transition:
    return Transition(
        lambda j: j.state is JobState.SCHEDULED and j.fence == fence,
        lambda j: j.with_(run_at=run_at),
        lambda j: j.run_at,
        now,
        kind="reschedule",
    )


def replay(fence: int, run_at: int, now: int) -> Transition:
    return Transition(
        lambda j: j.state is JobState.DEAD and j.fence == fence,
        lambda j: j.with_(
            state=JobState.SCHEDULED, run_at=run_at, attempt=0, unstarted=0, finished_at=0
        ),
        lambda j: j.run_at,
        now,
        kind="replay",
    )


def purge(fence: int) -> Transition:
    """Only a dead job, at the fence its caller saw, is purged; the store deletes its row (and
    nothing else: its key and index keep the time to live they got when it died)."""
    return Transition(
        lambda j: j.state is JobState.DEAD and j.fence == fence, lambda j: j, kind="purge"
    )
