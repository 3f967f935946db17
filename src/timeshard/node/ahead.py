"""Claims ahead: a shard's owner claims the jobs due within ``claim_ahead_ms`` before they are
due, and holds them until then.

At a trickle a claim at due time is one conditional write (a Paxos round on Cassandra) per job,
on the path between the due time and the handler's start, queued behind whatever else the
store does. Claimed ahead, the jobs of one bucket partition due in the window go in one
conditional batch, and at due time the owner hands them to a waiting worker with no store call
(``Claims``: a held item is given as claimed).

What does not change: the row's fence is taken by the claim (invariant 5), so a second holder
is impossible; the job's lease starts at its due time (the attempt's claim time) and is the one
the latest claim for its type asked (``Claims.asked_lease``), so a lease check, a heartbeat, a
result and a lost worker's lease work as for a claim at due time; a held job no worker took by its
lease's end is released as not started (invariant 9), and is due again at once. What is held:

- only a job whose type a claim on this node is in flight for (waiting for jobs, or writing
  those it took), with nothing of the type queued ready (so under a backlog jobs are claimed
  at due time, as before, and a held job does not wait for a worker long);
- no job of a type with a concurrency limit, a rate or a pause (decided at the claim), and
  no job with a deadline (it is expired at its due time if it is late).

How far ahead: a claim ahead is made once the first job not yet claimed is due within half
the window, and takes every job due within the window; at a trickle that is one job or two a
round, so while it has fewer than ``AHEAD_BATCH`` it also takes the jobs due within the *reach*
(``reach_ms``: a few windows, less than the lookahead less a refresh and half the lease) whose
rows lie in a partition it writes anyway. No job waits for more to come (a burst fills the
batch within the window), and nothing goes to a worker earlier: the early lane still takes a
held job a window before it is due, whenever it was claimed.

A held job goes to the early lane of the ready queues (``ReadyQueues.push_early``) a window
before it is due (put off to the node's next 50 ms tick, ``hand_over_at``): a worker stream
that accepts ``starts_in`` takes it from there, and its worker starts it on its own monotonic
clock, never before the due time (``api.work``). At its due time a job still in the lane goes
to the ready queue, for any claim.

A cancel through the owner drops a held job (``ShardDispatcher.forget``), and revokes one
handed over (``StartNotices.started_by``); a cancel through another node is written there and
then revoked through the owner the same way (``node.revokes``; docs/architecture.md, "Claims
ahead").
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from timeshard.errors import NotOwner, TimeshardError
from timeshard.model import SCHEDULE_ENTRY_PREFIX, BucketEntry, Job, JobState
from timeshard.node.ready import ReadyItem
from timeshard.store.base import JobClaim, Store

HELD = " (held until due)"
"""Ends the lease owner a job claimed ahead shows (its owner node's id before it) until a
worker's heartbeat: a node that did not push it can tell it may wait on a worker's clock."""
MAX_AHEAD = 2000
"""Jobs one dispatcher claims ahead in one step at most (the rest at their due time)."""
AHEAD_BATCH = 16
"""A claim ahead with fewer jobs due within the window takes jobs due within the reach too,
up to this many in all: one Paxos round costs about the same for 1 row as for 16."""
AHEAD_STRETCH = 4
"""The reach is at most this many windows..."""
REACH_MAX_MS = 2000
"""...and at most this long, unless the window itself is longer."""


def reach_ms(window_ms: int, lookahead_s: float, refresh_s: float, lease_ms: int) -> int:
    """How far ahead a claim ahead may take a job (0: claims ahead are off): ``AHEAD_STRETCH``
    windows and ``REACH_MAX_MS``, but less than the lookahead less one refresh (the entries
    read ahead) and at most half the lease (as the window); never less than the window."""
    if window_ms <= 0:
        return 0
    bound = min(
        AHEAD_STRETCH * window_ms,
        REACH_MAX_MS,
        round((lookahead_s - refresh_s) * 1000) - 1,
        lease_ms // 2,
    )
    return max(window_ms, bound)


HAND_OVER_TICK_MS = 50
"""Held jobs go to the early lane on this tick of the clock (``hand_over_at``)."""


def hand_over_at(run_at: int, window_ms: int) -> int:
    """When a held job due at ``run_at`` goes to the early lane: a window before it is due,
    put off to the next multiple of ``HAND_OVER_TICK_MS`` (of an eighth of the window, if
    that is shorter) of the clock, so the held jobs of every shard of the node going out
    about then share a push (at a trickle each went in a push, a stream message, of its own).
    Never earlier than a window before ``run_at``."""
    at = run_at - window_ms
    tick = min(HAND_OVER_TICK_MS, window_ms // 8)
    return at if tick <= 1 else -(-at // tick) * tick


def take_ahead(
    heap: list[BucketEntry],
    now: int,
    window_ms: int,
    reach: int,
    pending: Callable[[BucketEntry], bool],
) -> list[BucketEntry]:
    """Pop from ``heap`` (entries by due time) those a claim ahead at ``now`` takes, and return
    the ``pending`` ones: none while the first is due later than half the window from now
    (then a claim takes at least half a window's jobs); then every one due within the window
    and, while fewer than ``AHEAD_BATCH`` are taken, those due within ``reach`` whose row lies
    in a partition already taken (no round more). Those due by ``now`` stay: they are
    decided at once."""
    if not heap or heap[0].due_at > now + window_ms // 2:
        return []
    taken: list[BucketEntry] = []
    partitions: set[int] = set()
    while heap and now < heap[0].due_at <= now + reach:
        e = heap[0]
        home = e.minute if e.home is None else e.home
        if e.due_at > now + window_ms and (len(taken) >= AHEAD_BATCH or home not in partitions):
            break
        heapq.heappop(heap)
        if pending(e):
            taken.append(e)
            partitions.add(home)
    return taken


class Holding:
    """A dispatcher's jobs claimed ahead: held until due (by job id), when each goes to the
    early lane (``at``: a window before it is due) and when it is due (``due``), those of them
    in the early lane now, and its claims ahead in flight."""

    def __init__(self) -> None:
        self.items: dict[str, ReadyItem] = {}
        self.at: list[tuple[int, str]] = []  # (hand-over time, job id)
        self.due: list[tuple[int, str]] = []  # (due, job id)
        self.early: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def clear(self) -> None:
        self.items.clear()
        self.at.clear()
        self.due.clear()
        self.early.clear()

    def next_time(self) -> int | None:
        """When the next job held goes to the early lane or comes due (None: none held). The
        times of jobs no longer held (handed out early, or dropped) are passed over: at a
        steady rate most go to a worker from the early lane, and their due times would each
        wake the dispatcher for nothing."""
        for h in (self.at, self.due):
            while h and h[0][1] not in self.items:
                heapq.heappop(h)
        return min((h[0][0] for h in (self.at, self.due) if h), default=None)


class Holder(Protocol):
    """What a claim ahead needs of the shard's dispatcher (``ShardDispatcher``)."""

    shard: int

    def rows_for(self, entries: Iterable[BucketEntry]) -> dict[str, Job]: ...

    def hold(self, item: ReadyItem) -> None: ...


class AheadClaims:
    def __init__(
        self,
        *,
        store: Store,
        holder: str,
        lease_ms: int,
        reach_ms: int,
        eligible: Callable[[str], bool],
        lease_for: Callable[[str], int | None] = lambda _: None,
    ) -> None:
        self._store = store
        self.holder = holder
        """The lease owner a held job shows until a worker's start notice."""
        self._lease_ms = lease_ms
        self.reach_ms = reach_ms
        """How far ahead a job may be claimed (``reach_ms``)."""
        self._eligible = eligible
        self._lease_for = lease_for
        """By job type: the lease its workers ask for (None: ``lease_ms``)."""

    async def claim(self, d: Holder, entries: list[BucketEntry], now: int) -> list[BucketEntry]:
        """Claim the jobs of ``entries`` (due within the reach) that may be held, and hand
        them to ``d`` to hold; returns the entries to look at again at their due time."""
        rows: Mapping[str, Job] = d.rows_for(entries)
        unread = [
            e
            for e in entries
            if e.job_id not in rows and not e.job_id.startswith(SCHEDULE_ENTRY_PREFIX)
        ]
        if unread:
            rows = {**rows, **(await self._store.get_jobs_for(unread))}
        take: list[tuple[BucketEntry, Job]] = []
        later: list[BucketEntry] = []
        for e in entries:
            job = rows.get(e.job_id)
            if job is not None and len(take) < MAX_AHEAD and self._holds(e, job):
                take.append((e, job))
            else:
                later.append(e)
        if not take:
            return later
        claims = [
            JobClaim(
                job_id=job.job_id,
                expect_fence=job.fence,
                worker=self.holder,
                now=now,
                lease_until=job.run_at + (self._lease_for(job.job_type) or self._lease_ms),
                ahead_ms=self.reach_ms,
                known=job,
            )
            for _, job in take
        ]
        try:
            outcomes = await self._store.claim_jobs(claims)
        except NotOwner:
            raise
        except TimeshardError:
            return [*later, *(e for e, _ in take)]  # at their due time, as without
        for (e, job), out in zip(take, outcomes, strict=True):
            if out.applied and out.job is not None:
                d.hold(
                    ReadyItem(
                        job_id=job.job_id,
                        job_type=job.job_type,
                        shard=d.shard,
                        fence=out.job.fence,
                        run_at=job.run_at,
                        entries=[e],
                        job=out.job,
                        priority=job.priority,
                        claimed=True,
                    )
                )
            else:
                later.append(e)
        return later

    def _holds(self, e: BucketEntry, job: Job) -> bool:
        return (
            job.state is JobState.SCHEDULED
            and job.run_at == e.due_at
            and not job.deadline
            and self._eligible(job.job_type)
        )
