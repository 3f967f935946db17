"""What a due entry of a shard means, decided by its dispatcher when the entry comes due: the
job is made ready (to the ready queue of its type); its lease ran out (after a start notice, a
failed attempt; without one, due again uncounted, invariant 9); it is past its deadline (not
run: ``expired``); heartbeats moved its lease on (a later check is written: the chase); it
finished, or moved to a later time (the entry is handled); or the entry is a schedule's, and
the schedule fires. A row not there yet is looked at again soon.

The entries come from the dispatcher's ``HeldEntries``, which takes them back (``handled``,
``recheck``); the dispatcher is told of the entries written here (``notify``) and of each
deadline to time (``remember_deadline``).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable

from timeshard.clock import format_rfc3339
from timeshard.model import NOT_STARTED, SCHEDULE_ENTRY_PREFIX, BucketEntry, Job, JobState
from timeshard.node.amends import amend_lease_end
from timeshard.node.dispatchparts import DispatchParts
from timeshard.node.held import HeldEntries
from timeshard.node.ready import ReadyItem
from timeshard.node.schedules import FireResult
from timeshard.store.base import entry_for

log = logging.getLogger("timeshard.node.dispatcher")  # part of the dispatcher: its logger


class EntryDecider:
    def __init__(
        self,
        *,
        shard: int,
        parts: DispatchParts,
        held: HeldEntries,
        notify: Callable[[Iterable[BucketEntry]], object],
        remember_deadline: Callable[[Job], None],
        epoch: int = 0,
    ) -> None:
        """``parts``: the node's, as its dispatcher got them; ``held``, ``notify`` and
        ``remember_deadline``: the dispatcher's."""
        self.shard = shard
        self.epoch = epoch  # the shard's, under which its schedules' decisions are made
        self._store = parts.store
        self._ready = parts.ready
        self._cfg = parts.config
        self._held = held
        self._metrics = parts.metrics
        self._notify = notify  # the dispatcher's: entries written here, to hold
        self._remember_deadline = remember_deadline  # the dispatcher's deadline timer
        self._retry_at = parts.retry_at
        self._started = parts.started  # whether a start notice for (job_id, fence) came
        self._max_unstarted = parts.max_unstarted
        self._on_released = parts.on_released
        self._on_finished = parts.on_finished  # a job this dispatcher made dead (its waiters)
        self._firer = parts.firer

    def dispatched(self, job: Job, now: int) -> None:
        """``job`` goes to the ready queue now (counted as the entries decided here are)."""
        self._metrics.dispatched(job, now)

    async def handle(self, due: list[BucketEntry], now: int) -> None:
        schedules = [e for e in due if e.job_id.startswith(SCHEDULE_ENTRY_PREFIX)]
        if schedules:
            await self._fire(schedules, now)
            due = [e for e in due if not e.job_id.startswith(SCHEDULE_ENTRY_PREFIX)]
        if not due:
            return
        # A job this node just created is taken as written (see ``notify``): one read of
        # the store less between its due time and its claim.
        jobs = {e.job_id: j for e in due if (j := self._held.rows.pop(e, None)) is not None}
        unread = [e for e in due if e.job_id not in jobs]
        if unread:
            jobs.update(await self._store.get_jobs_for(unread))
        chased: list[BucketEntry] = []
        chases: list[BucketEntry] = []
        for e in due:
            chase = await self._decide(e, jobs.get(e.job_id), now)
            if chase is not None:
                chased.append(e)
                chases.append(chase)
        if chases:
            await self._store.add_entries(chases)
            self._notify(chases)
            self._held.handled(chased)  # only once the later check is durable

    async def _fire(self, entries: list[BucketEntry], now: int) -> None:
        for e in entries:
            schedule_id = e.job_id.removeprefix(SCHEDULE_ENTRY_PREFIX)
            if self._firer is None:
                self._held.handled([e])
                continue
            fired = await self._firer.fire(schedule_id, e.due_at, epoch=self.epoch)
            if fired is FireResult.HANDLED:
                self._held.handled([e])
            elif fired is FireResult.CONFLICT:
                self._held.recheck([e])
            else:
                self._missing(e, now)

    def _missing(self, e: BucketEntry, now: int) -> None:
        """The entry's row is not there (yet): look again soon, or let it go when old."""
        if now - e.due_at < self._cfg.missing_grace_s * 1000:
            retry = now + round(self._cfg.missing_retry_s * 1000)
            heapq.heappush(self._held.later, (retry, e))
        else:
            log.info(
                "shard %d: %s has no row after %.0fs; done with it",
                self.shard,
                e,
                self._cfg.missing_grace_s,
            )
            self._held.handled([e])

    async def _decide(self, e: BucketEntry, job: Job | None, now: int) -> BucketEntry | None:
        """Ready the job, or mark the entry handled. Returns an entry to write when a lease was
        extended past this check (the chase), else None."""
        if job is None:
            self._missing(e, now)
            return None
        attention = job.next_attention()
        if attention is None:
            self._held.handled([e])
            return None
        if attention > now:
            if job.state is JobState.RUNNING:
                return entry_for(job, attention, now)  # heartbeats moved the lease on
            self._held.handled([e])  # rescheduled or retrying later: that writer wrote the entry
            return None
        if job.state is JobState.RUNNING:
            held = self._ready.find(job.job_id)
            if held is not None and held.claimed and held.fence == job.fence:
                self._ready.remove(job.job_id)  # claimed ahead, never taken: not handed out now
            await self._expire(e, job, now)
            return None
        if job.past_deadline(now):
            held = self._ready.remove(job.job_id)  # (if another entry of the job put it there)
            await self._expire_late(e, job, now)
            if held is not None:
                self._held.recheck([x for x in held.entries if x != e])
            return None
        self._metrics.dispatched(job, now)
        self._ready.push(
            ReadyItem(
                job_id=job.job_id,
                job_type=job.job_type,
                shard=self.shard,
                fence=job.fence,
                run_at=job.run_at,
                entries=[e],
                job=job,
                priority=job.priority,
                deadline=job.deadline,
            )
        )
        if job.deadline:
            self._remember_deadline(job)
        return None

    async def _expire_late(self, e: BucketEntry, job: Job, now: int) -> None:
        """A job not started by its deadline is not run: ``expired``, saying why. If the row
        moved on meanwhile (claimed before the deadline, cancelled), it is looked at again."""
        reason = (
            f"not started by its deadline {format_rfc3339(job.deadline)} "
            f"(expired {(now - job.deadline) / 1000:.3f}s after it)"
        )
        out = await self._store.expire_job(job.job_id, job.fence, now, reason)
        if not out.applied or out.job is None:
            self._held.recheck([e]) if out.job is not None else self._held.handled([e])
            return
        self._metrics.deadline_expired(out.job, now)
        if self._on_finished is not None:
            self._on_finished(out.job)
        log.info("job %s: %s", job.job_id, reason)
        self._held.handled([e])

    async def _expire(self, e: BucketEntry, job: Job, now: int) -> None:
        """The lease ran out without a result. After a start notice: a failed attempt
        (``"lease expired"``), retried after the type's backoff while attempts remain, else
        dead. With none, the handler never started: due again at once, uncounted, bounded by
        the type's ``max_unstarted`` (invariant 9). The store wrote the retry's entry with the
        row; this one is handled."""
        noticed = self._started(job.job_id, job.fence)
        out = await self._store.release_lease(
            job.job_id,
            job.fence,
            now,
            lambda j: self._retry_at(j, now),
            started=noticed,
            max_unstarted=self._max_unstarted,
        )
        if not out.applied or out.job is None:
            self._held.recheck([e]) if out.job is not None else self._held.handled([e])
            return
        released = out.job
        late = not noticed and self._started(job.job_id, job.fence)  # came during the write
        if self._on_released is not None:
            self._on_released(released)
        if released.history and released.history[-1].outcome == NOT_STARTED:
            self._metrics.unstarted(released)
            if released.state is JobState.SCHEDULED:
                log.info(
                    "job %s: lease of %s over with no start notice; due again (%d deliveries "
                    "without a start)",
                    job.job_id,
                    job.lease_owner,
                    released.unstarted,
                )
                if late:
                    await self._amend_noticed(job, now)
                # (An entry equal to ``e``, the store wrote the very entry being looked at,
                # stays pending: ``HeldEntries.written``.)
                self._notify([entry_for(released, released.run_at, now)])
            elif self._on_finished is not None:
                self._on_finished(released)
            self._held.handled([e])
            return
        self._metrics.lease_expired(released)
        if self._on_finished is not None and released.state.terminal:
            self._on_finished(released)
        if released.state is JobState.SCHEDULED:
            log.info(
                "job %s: lease of %s expired (attempt %d/%d); runs again at %d",
                job.job_id,
                job.lease_owner,
                released.attempt,
                released.max_attempts,
                released.run_at,
            )
            self._notify([entry_for(released, released.run_at, now)])
        self._held.handled([e])

    async def _amend_noticed(self, job: Job, now: int) -> None:
        """The lease's start notice reached this node while its release, decided without one,
        was being written: the release is amended as the worker's late word would amend it
        (``Store.amend_lease_end``, invariant 9). ``run_at`` stays, so its entry does too."""
        amended = await amend_lease_end(
            self._store,
            job,
            now,
            started=True,
            log=log,
            not_amended="start notice not amended into its release",
        )
        if amended is not None:
            log.info(
                "job %s: its start notice came as its lease's end was written: counted "
                "(attempt %d/%d)",
                job.job_id,
                amended.attempt,
                amended.max_attempts,
            )
