"""Reading one shard's buckets, for its dispatcher: the refresh windows (what is new, the
re-read of late writes, the sweep of a minute before the cursor passes it), the reads, and the
cursor's advance past the minutes whose entries are all handled (invariants 2, 3, 4 and 7).

The entries read go into the dispatcher's ``HeldEntries``; what each one means when it comes due
is decided elsewhere (``timeshard.node.decisions``). The node-wide ``BucketRefresher`` reads
for many shards at once and hands each reader its entries through ``begin_refresh`` /
``end_refresh``; a dispatcher refreshed by itself reads with ``read_range``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable

from timeshard.clock import Clock
from timeshard.errors import NotOwner
from timeshard.model import BucketEntry, Job, JobState
from timeshard.node.dispatchconfig import DispatchConfig
from timeshard.node.held import HeldEntries
from timeshard.node.ready import ReadyQueues
from timeshard.sharding import MINUTE_MS, minute_of, minute_start
from timeshard.store.base import Store, entry_at

log = logging.getLogger("timeshard.node.dispatcher")  # part of the dispatcher: its logger


class BucketReader:
    def __init__(
        self,
        *,
        shard: int,
        epoch: int,
        cursor: int,
        store: Store,
        clock: Clock,
        ready: ReadyQueues,
        config: DispatchConfig,
        held: HeldEntries,
    ) -> None:
        self.shard = shard
        self._epoch = epoch
        self.cursor = cursor
        self._passing_to = cursor  # the cursor being saved; ``cursor`` once it is
        self._store = store
        self._clock = clock
        self._ready = ready
        self._cfg = config
        self._held = held
        self.horizon = minute_start(cursor)  # entries with due_at < horizon have been read
        self._reading_to = self.horizon
        """The horizon of the refresh in flight (else ``horizon``): an entry notified while
        it reads may have been written after its read, and is taken from the notify."""
        self.refreshed_at = -1  # when the last full refresh started
        self._stale_checked_at = -1
        self.refreshing = False  # between begin_refresh and end_refresh
        self._swept_to = -1
        """Every minute up to this one was read whole, from its start, by a refresh begun
        ``settle`` after the minute ended: the last look before the cursor passes it. An entry
        that landed behind what was read (a slow write) whose writer died before writing it
        again, due now, is found there (invariant 4 without the writer's help)."""
        self._sweeping = -1  # what the refresh in flight reads whole (see ``_swept_to``)

    @property
    def floor(self) -> int:
        """The oldest minute an entry may be taken into: the cursor's, or the minute it is
        being moved to while that is saved."""
        return max(self.cursor, self._passing_to)

    @property
    def read_to(self) -> int:
        """Entries due before this were read, or are in the range of the refresh in flight."""
        return max(self.horizon, self._reading_to)

    def cursor_settled(self, now: int) -> bool:
        """Whether the cursor's minute ended ``settle`` before ``now``: it may be passed."""
        cursor_end = minute_start(self.cursor) + MINUTE_MS
        return cursor_end + round(self._cfg.settle_s * 1000) <= now

    # -- reading buckets ------------------------------------------------------------------

    def begin_refresh(self, now: int) -> tuple[int, int]:
        """The range ``[start, horizon)`` a refresh at ``now`` reads; until ``end_refresh``,
        an entry notified with a due time in it is taken from the notify (the read may have
        passed its place before it was written)."""
        horizon = now + round(self._cfg.lookahead_s * 1000)
        start = self.horizon
        if self._cfg.reread_s > 0:  # not only what is new: the reread window too
            due_at = now
            if self.refreshed_at >= 0:
                due_at = min(now, self.refreshed_at + round(self._cfg.refresh_s * 1000))
            start = min(start, due_at - round(self._cfg.reread_s * 1000))
        settled = minute_of(now - round(self._cfg.settle_s * 1000)) - 1  # ended settle ago
        if self._cfg.reread_s > 0 and self._swept_to < self.cursor <= settled:
            start = min(start, minute_start(self.cursor))  # the cursor's minute, whole
        self._sweeping = settled if start <= minute_start(self.cursor) else -1
        self._reading_to = horizon
        self.refreshing = True
        return max(minute_start(self.cursor), start), horizon

    def minutes(self, start: int, horizon: int) -> range:
        """The bucket minutes a read of ``[start, horizon)`` looks at."""
        return range(max(self.cursor, minute_of(start)), minute_of(horizon) + 1)

    def end_refresh(
        self, now: int, horizon: int, entries: Iterable[BucketEntry], *, read: bool
    ) -> bool:
        """The refresh begun at ``now`` ended: ``read`` says whether every entry of its range
        was read (``entries``, or added already by ``read_range``). Only then does the
        horizon move on; a failed one is read again, from the same anchor, next time.
        Returns whether it gave the dispatcher's loop entries to look at: new ones, or
        stranded ones (``_recheck_stale``)."""
        added = False
        for e in entries:
            if e.minute >= self.cursor:
                added = self._held.add(e) or added
        if read:
            self.horizon = max(self.horizon, horizon)
            self._swept_to = max(self._swept_to, self._sweeping)
        self._sweeping = -1
        self._reading_to = self.horizon
        self.refreshing = False
        if not read:
            return False
        self.refreshed_at = now
        stale = self._recheck_stale(now)
        return added or bool(stale)

    async def read_range(self, start: int, horizon: int) -> None:
        for minute in self.minutes(start, horizon):
            after: tuple[int, str] | None = None
            while True:
                page = await self._store.read_bucket(
                    self.shard,
                    minute,
                    due_from=start,
                    due_to=horizon,
                    after=after,
                    limit=self._cfg.page_size,
                )
                for e in page:
                    self._held.add(e)
                if len(page) < self._cfg.page_size:
                    break
                after = (page[-1].due_at, page[-1].job_id)

    def _recheck_stale(self, now: int) -> int:
        """Every ``stale_s``: push back into the heap the pending entries long past due that
        are neither in the heap nor waiting in a ready queue; returns how many."""
        stale_ms = round(self._cfg.stale_s * 1000)
        if now - self._stale_checked_at < stale_ms:
            return 0
        self._stale_checked_at = now
        found = 0
        stale = now - stale_ms
        queued = set(self._held.heap) | {e for _, e in self._held.later}
        for minute in sorted(self._held.pending):
            if minute_start(minute) > stale:
                break
            for e in self._held.pending[minute]:
                if e.due_at <= stale and e not in queued and not self._ready_holds(e):
                    log.warning("shard %d: entry %s stranded; looking again", self.shard, e)
                    heapq.heappush(self._held.heap, e)
                    found += 1
        return found

    def _ready_holds(self, e: BucketEntry) -> bool:
        return any(self._ready.holds(t, e.job_id) for t in self._ready.types())

    # -- moving the cursor ----------------------------------------------------------------

    async def _chase_running(self) -> None:
        """Jobs claimed here and still running must not hold the cursor back: once their
        minute could be passed, each gets its lease check written (an entry due when its
        lease ends, in that minute) and the entries that made it ready are handled. A new
        owner finds the check; this one looks at the job then, as it would have."""
        settle = round(self._cfg.settle_s * 1000)
        cursor_end = minute_start(self.cursor) + MINUTE_MS
        if cursor_end + settle > self.refreshed_at or cursor_end > self.horizon:
            return
        held = [
            e for e in self._held.pending.get(self.cursor, ()) if e.job_id in self._held.claimed
        ]
        if not held:
            return
        now = self._clock.now_ms()
        checks: dict[str, BucketEntry] = {}
        for e in held:
            until = self._held.claimed[e.job_id][0]
            checks.setdefault(e.job_id, entry_at(e.shard, e.job_id, until, now, home=e.home))
        await self._store.add_entries(list(checks.values()))
        leases = {
            job_id: self._held.claimed[job_id][0]
            for job_id in checks
            if job_id in self._held.claimed
        }
        self._held.handled(held)
        for job_id, check in checks.items():
            self._held.written(check)
            if job_id in leases:  # a result through this node still handles it at once
                self._held.claimed[job_id] = (leases[job_id], [check])
        log.info("shard %d: %d running jobs got their lease check", self.shard, len(checks))

    async def _park_waiting(self) -> None:
        """Due jobs still waiting in a ready queue (no worker for their type, or its
        concurrency limit reached) must not hold the cursor back: once their minute could be
        passed, their entries are written again, due now, in the current minute, and the old
        ones handled. The job stays ready; a new owner finds the new entry (a waiting job once
        pinned the cursor for good), and the job row keeps its ``run_at``, so the job's age
        survives the move. One row read and one entry write per waiting job per minute.

        The rows are read first: a job cancelled or rescheduled through another node since it
        was made ready (this node is not told) leaves the ready queue here, and its entries are
        looked at again, which finds them handled."""
        settle = round(self._cfg.settle_s * 1000)
        cursor_end = minute_start(self.cursor) + MINUTE_MS
        if cursor_end + settle > self.refreshed_at or cursor_end > self.horizon:
            return
        waiting = [e for e in self._held.pending.get(self.cursor, ()) if self._ready_holds(e)]
        if not waiting:
            return
        now = self._clock.now_ms()
        rows = await self._store.get_jobs_for(waiting)
        waiting = [e for e in waiting if self._still_waiting(e, rows.get(e.job_id), now)]
        if not waiting:
            return
        moved = {e: entry_at(e.shard, e.job_id, now, now, home=e.home) for e in waiting}
        await self._store.add_entries(list(moved.values()))
        for old, new in moved.items():
            if self._ready_holds(old):
                self._ready.replace_entry(old, new)
                self._held.known.add(new)
                self._held.pending.setdefault(new.minute, set()).add(new)
            else:  # claimed meanwhile: the claim handled the old entry; look at the new one
                self._held.written(new)
        self._held.handled(waiting)
        log.info("shard %d: %d due jobs wait for a worker; moved on", self.shard, len(waiting))

    def _still_waiting(self, e: BucketEntry, job: Job | None, now: int) -> bool:
        """Whether the ready item of ``e``'s job still stands for the stored row ``job``:
        scheduled, due, with the fence a claim must find. If not, the item leaves the ready
        queue and its entries are looked at again (``_decide`` finds them handled, or makes
        the job ready again as it now is)."""
        item = self._ready.find(e.job_id)
        if item is None:
            return False  # claimed while the rows were read: the claim handled it
        if (
            job is not None
            and job.state is JobState.SCHEDULED
            and job.fence == item.fence
            and job.run_at <= now
        ):
            item.job, item.run_at = job, job.run_at
            return True
        self._ready.remove(e.job_id)
        self._held.recheck(item.entries)
        return False

    async def advance_cursor(self) -> None:
        await self._park_waiting()
        await self._chase_running()
        cursor = self.cursor
        settle = round(self._cfg.settle_s * 1000)
        while (
            minute_start(cursor) + MINUTE_MS + settle <= self.refreshed_at
            and minute_start(cursor) + MINUTE_MS <= self.horizon
            and (cursor <= self._swept_to or not self._cfg.reread_s)
            and not self._held.pending.get(cursor)
        ):
            self._held.pending.pop(cursor, None)
            cursor += 1
        if cursor == self.cursor:
            return
        self._passing_to = cursor
        try:
            saved = await self._store.save_cursor(self.shard, self._epoch, cursor)
        finally:
            self._passing_to = self.cursor
        if not saved:
            raise NotOwner(self.shard, self._epoch)
        self._held.known = {e for e in self._held.known if e.minute >= cursor}
        self._held.rows = {e: j for e, j in self._held.rows.items() if e.minute >= cursor}
        self.cursor = self._passing_to = cursor
