"""The lease protocol's state transitions, shared by every store.

Each conditional write of the contract is a ``Transition``: the condition the stored job must
meet, the job it becomes, and the bucket entry the new job needs (invariant 2). A store only
decides how to apply one atomically: SQLite in one transaction, Cassandra as a lightweight
transaction on the row image it read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from timeshard.limits import DEFAULT_MAX_UNSTARTED
from timeshard.model import (
    GIVEN_BACK,
    LEASE_EXPIRED,
    NEVER_STARTED,
    NOT_STARTED,
    RESCHEDULED,
    Job,
    JobState,
)
from timeshard.store.base import JobClaim, MaxUnstarted, RetryAt
from timeshard.store.history import amend_attempt, finish_attempt, new_attempt

NO_START_NOTICE = f"{NOT_STARTED}: lease over with no start notice"
"""How the history of a lease that ran out with no start notice begins (``release``): the one
uncounted end a late start notice amends (``amend``)."""
LATE_START_NOTICE = f"{LEASE_EXPIRED}: its start notice came after the lease's end"
BEFORE_DUE = "rescheduled before it was due; its handler had not started"
"""The error of a lease claimed ahead and ended by a reschedule (``reschedule_ahead``)."""
STARTED_BEFORE_MOVE = "its handler had started when the job was rescheduled"
"""The error of that lease once its worker said the handler had started (``amend``)."""
"""The error of an attempt counted by ``amend``: the owner released it before the notice."""


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


def named(j: Job, worker: str) -> Job:
    """``j`` with its lease and running attempt in ``worker``'s name: a job claimed ahead was
    claimed in its owner's name, and handed to a worker with no write; the first write of that
    worker's lease names it ("": as it is)."""
    if not worker or not j.history or j.history[-1].worker == worker:
        return j
    last = replace(j.history[-1], worker=worker)
    return j.with_(lease_owner=worker, history=(*j.history[:-1], last))


def heartbeat(fence: int, lease_until: int, started: bool = False, worker: str = "") -> Transition:
    """The lease extended (never shortened); ``started``: the heartbeat carries the worker's
    start notice, kept with the row so that any later owner counts the attempt. ``worker``:
    the lease is named after it (``named``)."""
    return Transition(
        _running_with(fence),
        lambda j: named(j, worker).with_(
            lease_until=max(j.lease_until, lease_until),
            start_noticed=j.start_noticed or started,
        ),
        kind="heartbeat",
    )


def complete(
    fence: int, now: int, result: bytes = b"", result_encoding: str = "", worker: str = ""
) -> Transition:
    """The handler's result is stored with the succeeded job (checked by ``Job``: size and
    encoding); ``worker``: the attempt is named after it (``named``)."""

    def change(j: Job) -> Job:
        j = named(j, worker)
        return j.with_(
            state=JobState.SUCCEEDED,
            finished_at=now,
            start_noticed=True,  # a result: its handler ran
            lease_owner="",
            history=finish_attempt(j, now, "succeeded"),
            result=result,
            result_encoding=result_encoding,
        )

    return Transition(_running_with(fence), change, kind="complete")


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


def fail(
    fence: int, now: int, error: str, retry: RetryAt, traceback: str = "", worker: str = ""
) -> Transition:
    """``worker``: the attempt is named after it (``named``)."""
    failed = _failed(now, error, retry, traceback=traceback)
    return Transition(
        _running_with(fence),
        lambda j: failed(named(j, worker)),
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
        lambda j: f"{NO_START_NOTICE} from worker {j.lease_owner}",
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


def _released_from(fence: int, j: Job) -> bool:
    """The lease ``fence`` ended (released or given back) and the job was not claimed again:
    ``scheduled`` at that fence (only a claim moves it), its newest history entry that
    lease's, closed."""
    return (
        j.state is JobState.SCHEDULED
        and j.fence == fence
        and bool(j.history)
        and j.history[-1].finished_at is not None
    )


def _ended_unnoticed(j: Job) -> bool:
    """Released uncounted because no start notice had come (``release``). ``unstarted`` and
    the attempt numbers tell it from a replay of a job dead with that entry last."""
    last = j.history[-1]
    return (
        last.outcome == NOT_STARTED
        and last.error.startswith(NO_START_NOTICE)
        and not j.start_noticed
        and j.unstarted >= 1
        and j.attempt == last.attempt - 1
    )


def _moved_unstarted(j: Job) -> bool:
    """Ended by a reschedule before it was due (``reschedule_ahead``), not counted."""
    last = j.history[-1]
    return (
        last.outcome == RESCHEDULED
        and last.error == BEFORE_DUE
        and not j.start_noticed
        and j.attempt == last.attempt - 1
    )


def _ended_counted(j: Job) -> bool:
    """Released as a failed attempt after a start notice (``release``: ``lease expired``),
    counted (not a replay, which starts the count again)."""
    last = j.history[-1]
    return last.outcome == LEASE_EXPIRED and j.attempt >= 1 and j.attempt == last.attempt


def amend(fence: int, now: int, *, started: bool, reason: str = "") -> Transition:
    """A late word from the worker of the lease ``fence`` amends how that lease's end was
    counted, while the job was not claimed again (invariant 9: an attempt counts when a
    handler started). ``started`` (its start notice, a heartbeat carrying it, a result) on a
    lease released as ``not started`` for want of a notice: the attempt counts (``attempt +
    1``, ``unstarted - 1``), its history entry becomes ``lease expired`` (``LATE_START_NOTICE``);
    on a lease a reschedule ended before it was due (``reschedule_ahead``): the attempt counts
    (``attempt + 1``), its entry stays ``rescheduled``, with ``STARTED_BEFORE_MOVE``.
    Not ``started`` (a give-back "not started", ``reason``) on a lease released as a counted
    ``lease expired``: the attempt does not count (``attempt - 1``, ``unstarted + 1``), its
    entry becomes ``not started`` with ``reason``.

    Only the counts, the entry, ``last_error`` and ``start_noticed`` change: the job stays
    ``scheduled`` at its ``run_at`` and its entry (no backoff added, none taken away), and an
    amend never makes a job dead. A count that reaches ``max_attempts`` (or ``max_unstarted``)
    so is decided by the next end of an attempt as any other: the next delivery runs, and its
    failure or expiry makes the job dead."""
    if started:

        def counted(j: Job) -> Job:
            if _moved_unstarted(j):
                return j.with_(
                    attempt=j.attempt + 1,
                    start_noticed=True,
                    last_error=STARTED_BEFORE_MOVE,
                    history=amend_attempt(j, RESCHEDULED, STARTED_BEFORE_MOVE),
                )
            return j.with_(
                attempt=j.attempt + 1,
                unstarted=j.unstarted - 1,
                start_noticed=True,
                last_error=LATE_START_NOTICE,
                history=amend_attempt(j, LEASE_EXPIRED, LATE_START_NOTICE),
            )

        return Transition(
            lambda j: _released_from(fence, j) and (_ended_unnoticed(j) or _moved_unstarted(j)),
            counted,
            now=now,
            kind="amend",
        )
    return Transition(
        lambda j: _released_from(fence, j) and _ended_counted(j),
        lambda j: j.with_(
            attempt=j.attempt - 1,
            unstarted=j.unstarted + 1,
            start_noticed=False,
            last_error=reason,
            history=amend_attempt(j, NOT_STARTED, reason),
        ),
        now=now,
        kind="amend",
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


def reschedule_as(expect_state: JobState, fence: int, run_at: int, now: int) -> Transition:
    """``reschedule`` of a job ``scheduled``, ``reschedule_ahead`` of one ``running``."""
    if expect_state is JobState.RUNNING:
        return reschedule_ahead(fence, run_at, now)
    return reschedule(fence, run_at, now)


def reschedule_ahead(fence: int, run_at: int, now: int) -> Transition:
    """A job claimed ahead and not yet due (``running`` at ``fence``, ``run_at`` after
    ``now``, no start notice in the row) is rescheduled: its lease ends (``fence + 1``, so
    its worker is stale and the owner revokes the push), the attempt is not counted
    (``attempt - 1``) and is closed ``rescheduled``, and the job is ``scheduled`` again, no
    earlier than the lease's end: until its worker has said that it never started the handler,
    another run must not overlap one it may start. The caller then moves ``run_at`` to the time
    asked (``reschedule``), or, if the handler had started, counts the attempt (``amend``)."""
    return Transition(
        lambda j: (
            j.state is JobState.RUNNING
            and j.fence == fence
            and not j.start_noticed
            and j.run_at > now
        ),
        lambda j: j.with_(
            state=JobState.SCHEDULED,
            run_at=max(run_at, j.lease_until),
            fence=j.fence + 1,
            attempt=max(0, j.attempt - 1),
            lease_owner="",
            history=finish_attempt(j, now, RESCHEDULED, BEFORE_DUE),
        ),
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
