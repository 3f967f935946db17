"""The shard dispatcher: the sub-scheduler of one shard, run by the shard's owner.

It keeps a cursor (the oldest minute bucket not yet fully handled), reads bucket partitions from
the cursor up to ``now + lookahead``, holds the entries it read ahead in a heap and, at each
entry's exact time, looks at its job: a due job goes to the ready queue of its type, an expired
lease is a failed attempt (retried after a backoff, or dead), an extended lease gets a fresh
check entry, and a job past its deadline is not run: it ends ``expired``.

Deadlines are checked wherever a job could start late: when its entry comes due, while it
waits in a ready queue (whatever holds it there: no worker, a concurrency limit, a hold on its
type), each followed by the job's own deadline timer here, and by every claim (``Claims`` and
the store's claim condition both refuse it).

An entry is *handled* when its job was claimed, finished, cancelled or moved to a later time
(whoever moved it wrote the later entry). The cursor passes a minute only when every entry in it
is handled and the minute ended ``settle`` ago, and every cursor write is conditional on the
shard's epoch (invariants 3, 4, 7).

``ShardDispatcher`` is the loop, the deadline timers of the jobs it made ready, and what the
rest of the node tells it (``notify``, ``claimed``, ``ran``, ``recheck``, ``forget``,
``expire_overdue``). It composes three parts: ``HeldEntries`` (``node.held``: the entries it
holds and the order it looks at them in), which the other two share; a ``BucketReader``
(``node.buckets``: the refresh windows, the reads and the cursor's advance); and an
``EntryDecider`` (``node.decisions``: what a due entry means, and acting on it). What every
dispatcher of a node shares (the store, the clock, the ready queues, the node's timer, and the
hooks into the rest of the node) comes in one ``DispatchParts`` (``node.dispatchparts``), built
once by the node; the dispatcher passes it on to its decider.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections.abc import Iterable, Mapping

from timeshard.clock import wake
from timeshard.errors import NotOwner, TimeshardError
from timeshard.model import BucketEntry, Job, JobState
from timeshard.node.ahead import Holding, hand_over_at, take_ahead
from timeshard.node.buckets import BucketReader
from timeshard.node.decisions import EntryDecider
from timeshard.node.dispatchconfig import READ_MARGIN_S, DispatchConfig
from timeshard.node.dispatchparts import DispatchParts
from timeshard.node.held import HeldEntries
from timeshard.node.ready import ReadyItem
from timeshard.sharding import minute_start

log = logging.getLogger(__name__)

# The config is its own module so the parts the dispatcher composes can read it; its users
# import it from here, with the dispatcher it configures.
__all__ = ["READ_MARGIN_S", "DispatchConfig", "ShardDispatcher"]

DEADLINE_TIMERS_SLACK = 1024
"""Deadline timers of jobs no longer held that a dispatcher keeps before it rebuilds its heap."""


class ShardDispatcher:
    refreshed_by_node: bool
    """After its first refresh, the node's ``BucketRefresher`` reads this shard's buckets
    (with every other shard's, in a few queries) and hands the entries in through
    ``begin_refresh`` / ``end_refresh``; the loop then wakes only when an entry comes due,
    one is added, or the cursor may move: no timer per shard while nothing is due."""

    def __init__(self, *, shard: int, epoch: int, cursor: int, parts: DispatchParts) -> None:
        """``shard`` from its ``epoch`` on, read from ``cursor``; ``parts``: what every
        dispatcher of the node shares (``node.dispatchparts``)."""
        self.shard = shard
        self._timer = parts.timer  # (the node's)
        self.epoch = epoch
        self._clock = parts.clock
        self._ready = parts.ready
        self._cfg = parts.config
        self._on_deposed = parts.on_deposed
        self._held = HeldEntries(wake=self._wake_up)
        self._reader = BucketReader(
            shard=shard,
            epoch=epoch,
            cursor=cursor,
            store=parts.store,
            clock=parts.clock,
            ready=parts.ready,
            config=parts.config,
            held=self._held,
        )
        self._decider = EntryDecider(
            shard=shard,
            parts=parts,
            held=self._held,
            notify=self.notify,
            remember_deadline=self._remember_deadline,
            epoch=epoch,
        )
        self._deadlines: list[tuple[int, str]] = []  # (deadline, job id) of jobs made ready
        self._waker: asyncio.Future[None] | None = None  # set while the loop waits
        self._wait_until = math.inf
        """While the loop waits: when it looks again by itself (ms; inf: only when woken)."""
        self._task: asyncio.Task[None] | None = None
        self.deposed = False
        self.refreshed_by_node = parts.config.node_refresh
        self._cursor_check = False  # a refresh ended: the cursor may move (node-refreshed)
        self._ahead = parts.ahead if parts.config.claim_ahead_ms else None
        self._holding = Holding()  # jobs claimed ahead, held until due

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"dispatcher-{self.shard}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for task in list(self._holding.tasks):
            task.cancel()
        await asyncio.gather(*self._holding.tasks, return_exceptions=True)
        self._ready.drop_shard(self.shard)
        self._holding.clear()
        self._timer.note_due(self.shard, None)

    @property
    def cursor(self) -> int:
        """The oldest minute bucket not yet fully handled, as saved (``BucketReader``)."""
        return self._reader.cursor

    def next_due(self) -> int | None:
        """When the earliest entry this dispatcher holds comes due (None: none held)."""
        return self._held.heap[0].due_at if self._held.heap else None

    def next_hand_over(self) -> int | None:
        """When the next job held ahead goes to the early lane (None: none held)."""
        at = self._holding.at
        return at[0][0] if at else None

    @property
    def in_memory(self) -> int:
        return sum(len(s) for s in self._held.pending.values())

    @property
    def waiting(self) -> int:
        """Due jobs this shard holds ready, not claimed yet."""
        return self._ready.count(self.shard)

    def backlog(self, now: int) -> tuple[int, int | None]:
        """Entries due by ``now`` that this dispatcher has not yet acted on (not made ready,
        fired or found finished), and the oldest due time among them or among the entries
        not read yet when the reads are behind: ``now`` minus it is the shard's dispatch lag,
        how far its owner is behind. Left out: entries waiting for their row to appear, and
        jobs already made ready and waiting for a claim: their entry is written again, due
        now, every minute (``BucketReader._park_waiting``), so its due time says nothing of how
        long they wait; ``ReadyQueues.unclaimed`` tells that, per type, from the job's own due
        time."""
        waiting = {e for _, e in self._held.later}
        ready = self._ready.job_ids(self.shard)
        due = [
            e.due_at
            for minute, entries in self._held.pending.items()
            if minute_start(minute) <= now
            for e in entries
            if e.due_at <= now and e not in waiting and e.job_id not in ready
        ]
        oldest = min(due, default=None)
        horizon = self._reader.horizon
        if horizon <= now:  # entries due since the last read are not even known yet
            oldest = horizon if oldest is None else min(oldest, horizon)
        return len(due), oldest

    # -- what other parts of the node tell us ---------------------------------------------

    def notify(
        self, entries: Iterable[BucketEntry], jobs: Mapping[str, Job] | None = None
    ) -> list[BucketEntry]:
        """Entries this node just wrote for this shard: no need to wait for a refresh.
        ``jobs``: the rows written with them (a create), by job id. When the entry comes due,
        the job goes to the ready queue as written, without reading its row again: the claim
        compares the row it finds with that image, so a job changed meanwhile (cancelled,
        rescheduled) is read and decided again then, never claimed early (invariant 5).

        Returns the entries behind the cursor (or behind the minute it is being moved to):
        not taken, and not read by a later owner either. An entry taken holds the cursor at
        its minute until it is handled; one equal to an entry handled before is pending again
        (``HeldEntries.written``)."""
        soonest = math.inf
        behind: list[BucketEntry] = []
        held_to = self._reader.read_to
        floor = self._reader.floor
        for e in entries:
            if e.minute < floor:
                behind.append(e)
            elif e.due_at < held_to and self._held.written(e):
                soonest = min(soonest, e.due_at)
                job = jobs.get(e.job_id) if jobs else None
                if job is not None and job.state is JobState.SCHEDULED and job.run_at == e.due_at:
                    self._held.rows[e] = job
        if soonest < math.inf:
            self._timer.note_due(self.shard, self.next_due())
            self._wake_before(self._looks_at(soonest))
        return behind

    def deposed_by_store(self) -> None:
        """A write of ours was rejected by a newer epoch: stop, as if the cursor write was."""
        if self._task is not None and not self.deposed:
            self._task.cancel()
            self._task = None
            self.deposed = True
            self._ready.drop_shard(self.shard)
            self._timer.note_due(self.shard, None)
            if self._on_deposed is not None:
                self._on_deposed(self.shard)

    def handled(self, entries: Iterable[BucketEntry]) -> None:
        self._held.handled(entries)

    def claimed(self, entries: Iterable[BucketEntry], job: Job) -> None:
        """A claim of ``job`` applied: the entries that made it ready stay pending (they hold
        the cursor at their minute, where a new owner reads them and finds the job running)
        and come up again when the lease ends, to expire it, chase a lease heartbeats moved
        on, or find the job finished. No lease-check entry is written for a job that ends
        before its minute is passed (most do): ``ran`` handles the entries when a result
        comes through this node, and ``BucketReader._chase_running`` writes the check for the
        others."""
        held = list(entries)
        for e in held:
            heapq.heappush(self._held.later, (job.lease_until, e))
        was = self._held.claimed.get(job.job_id)
        if was is not None:
            held += was[1]
        self._held.claimed[job.job_id] = (job.lease_until, held)
        if self._held.later[0][0] == job.lease_until:  # now the earliest: the loop's timer moves
            self._wake_up()

    def ran(self, job_id: str) -> None:
        """``job_id``'s run ended by a write of this node: its pending entries are handled."""
        held = self._held.claimed.pop(job_id, None)
        if held is not None:
            self.handled(held[1])

    def recheck(self, entries: Iterable[BucketEntry]) -> None:
        """A claim did not apply: look at these jobs again now."""
        self._held.recheck(entries)

    def forget(self, job_id: str, fence: int | None = None) -> bool:
        """A write of this node moved ``job_id`` out of the state its ready item stands for
        (cancelled, rescheduled): out of the ready queue now, and its entries looked at again
        (found handled, or the job made ready again as it now is). True if it was a job
        claimed ahead and still held here: no worker got it. ``fence``: another node's cancel
        ended that lease (``node.revokes``): only a job claimed ahead under it is forgotten."""
        if fence is not None:
            found = self._holding.items.get(job_id) or self._ready.find(job_id)
            if found is None or not found.claimed or found.fence != fence:
                return False
        held = self._holding.items.pop(job_id, None)
        self._holding.early.discard(job_id)
        item = self._ready.remove(job_id) or held
        if item is not None:
            item.dropped = True  # (a claim that took it already hands it out no more)
            self.recheck(item.entries)
        return item is not None and item.claimed

    # -- the loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except NotOwner:
                log.warning("shard %d: deposed at epoch %d; stopping", self.shard, self.epoch)
                self.deposed = True
                self._ready.drop_shard(self.shard)
                self._timer.note_due(self.shard, None)
                if self._on_deposed is not None:
                    self._on_deposed(self.shard)
                return
            except TimeshardError as exc:
                log.warning("shard %d: %s; retrying in %.1fs", self.shard, exc, self._cfg.retry_s)
                await self._clock.sleep(self._cfg.retry_s)
            await self._wait()

    async def _step(self) -> None:
        now = self._clock.now_ms()
        if self.refreshes_itself and now - self._reader.refreshed_at >= self._cfg.refresh_s * 1000:
            await self._refresh(now)
            await self._reader.advance_cursor()
        elif self._cursor_check and not self._reader.refreshing:
            self._cursor_check = False
            await self._reader.advance_cursor()
        while self._held.later and self._held.later[0][0] <= now:
            heapq.heappush(self._held.heap, heapq.heappop(self._held.later)[1])
        self._expire_held(now)
        if self._ahead is not None:
            self._hand_over_held(now)
        due: list[BucketEntry] = []
        while self._held.heap and self._held.heap[0].due_at <= now:
            e = heapq.heappop(self._held.heap)
            if e in self._held.pending.get(e.minute, ()):
                due.append(e)
            else:
                self._held.rows.pop(e, None)
        if due:
            try:
                await self._decider.handle(due, now)
            except BaseException:
                for e in due:
                    heapq.heappush(self._held.heap, e)
                raise
        if self._ahead is not None:
            self._claim_ahead(self._clock.now_ms())

    async def _wait(self) -> None:
        now = self._clock.now_ms()
        self._timer.note_due(self.shard, self.next_due())
        times = [
            *([self._reader.refreshed_at + self._cfg.refresh_s * 1000] * self.refreshes_itself),
            *([self._held.heap[0].due_at] if self._held.heap else []),
            *([self._held.later[0][0]] if self._held.later else []),
            *([self._deadlines[0][0] + 1] if self._deadlines else []),
            *([held] if (held := self._holding.next_time()) is not None else []),
        ]
        if self._ahead is not None and self._held.heap:  # the next claim ahead
            times.append(self._looks_at(self._held.heap[0].due_at))
        if self._cursor_check and not self._reader.refreshing:
            return
        self._waker = asyncio.get_running_loop().create_future()
        self._wait_until = min(times, default=math.inf)
        try:
            if not times:  # nothing due, refreshed by the node: until woken
                await self._waker
                return
            delay = (min(times) - now) / 1000
            if delay <= 0:
                await asyncio.sleep(0)
                return
            await self._timer.sleep(delay, self._waker)
        finally:
            self._waker = None

    @property
    def refreshes_itself(self) -> bool:
        """Whether this dispatcher's loop reads its buckets: always, unless refreshed by the
        node, and then until its first read (from its cursor) is done."""
        return not self.refreshed_by_node or self._reader.refreshed_at < 0

    @property
    def running(self) -> bool:
        return self._task is not None

    def _wake_up(self) -> None:
        """Cut the loop's wait short (a wake-up while it is not waiting is not needed: it
        looks at its heap before it waits again)."""
        if self._waker is not None:
            wake(self._waker)

    def _wake_before(self, at: float) -> None:
        """Cut the loop's wait short if it would look again only after ``at`` (ms): an entry
        written with a due time further off than what the loop waits for now (a job created
        seconds ahead, while jobs come due every few milliseconds) is looked at then, with no
        step of its own."""
        if self._waker is not None and at < self._wait_until:
            wake(self._waker)

    def _looks_at(self, due_at: float) -> float:
        """When the loop must look at an entry held due at ``due_at``: then, or with claims
        ahead half a window before (``_claim_ahead``)."""
        return due_at - self._cfg.claim_ahead_ms // 2 if self._ahead is not None else due_at

    # -- claims ahead (``DispatchConfig.claim_ahead_ms``) ---------------------------------

    def _claim_ahead(self, now: int) -> None:
        """Entries due soon (``node.ahead.take_ahead``: within the window, and at a trickle
        within the reach): their jobs claimed now, in one call (the store writes a conditional
        batch per partition), and held until due. Those not taken (another kind of entry, a
        job not eligible, a claim that did not apply, the store away) are looked at again at
        their due time, as without claims ahead."""
        assert self._ahead is not None
        pending = self._held.pending
        soon = take_ahead(
            self._held.heap,
            now,
            self._cfg.claim_ahead_ms,
            self._ahead.reach_ms,
            lambda e: e in pending.get(e.minute, ()),
        )
        if not soon:
            return
        task = asyncio.create_task(self._claim_soon(soon, now), name=f"ahead-{self.shard}")
        self._holding.tasks.add(task)
        task.add_done_callback(self._holding.tasks.discard)

    async def _claim_soon(self, soon: list[BucketEntry], now: int) -> None:
        """One claim ahead, beside the loop (which goes on deciding what is due meanwhile)."""
        assert self._ahead is not None
        later = soon
        try:
            later = await self._ahead.claim(self, soon, now)
        except NotOwner:
            self.deposed_by_store()
        except Exception:  # (decided at their due time, as without a claim ahead)
            log.exception("shard %d: a claim ahead failed", self.shard)
        finally:
            for e in later:
                heapq.heappush(self._held.later, (e.due_at, e))
            self._wake_up()

    def hold(self, item: ReadyItem) -> None:
        """A job claimed ahead (``AheadClaims``): held until due, then ready; its entries stay
        pending and come up at its lease's end (``claimed``)."""
        assert item.job is not None
        if self._task is None:  # stopped or deposed meanwhile: its lease's end releases it
            return
        for e in item.entries:
            self._held.rows.pop(e, None)  # (the image of the row before the claim)
        self._holding.items[item.job_id] = item
        at = hand_over_at(item.run_at, self._cfg.claim_ahead_ms)
        heapq.heappush(self._holding.at, (at, item.job_id))
        heapq.heappush(self._holding.due, (item.run_at, item.job_id))
        self.claimed(item.entries, item.job)

    def handed_out(self, job_id: str) -> None:
        """A job claimed ahead went to a worker (``Claims._hand_out``), from the early lane
        or the ready queue: held no more (its due time has nothing left to do)."""
        if self._holding.items.pop(job_id, None) is not None:
            self._holding.early.discard(job_id)

    def rows_for(self, entries: Iterable[BucketEntry]) -> dict[str, Job]:
        """The rows this node wrote with ``entries`` (a create), by job id: no read needed."""
        rows = self._held.rows
        return {e.job_id: job for e in entries if (job := rows.get(e)) is not None}

    def _hand_over_held(self, now: int) -> None:
        """Jobs held due within the window go to the early lane, where a claim whose worker
        starts them on its own clock takes them (``starts_in``); those due now and not taken
        go to the ready queue, for any claim."""
        h = self._holding
        while h.at and h.at[0][0] <= now:
            _, job_id = heapq.heappop(h.at)
            item = h.items.get(job_id)
            if item is not None and item.job is not None and item.run_at > now:
                self._decider.dispatched(item.job, now)
                h.early.add(job_id)
                self._ready.push_early(item)
        while h.due and h.due[0][0] <= now:
            _, job_id = heapq.heappop(h.due)
            item = h.items.pop(job_id, None)
            if item is None or item.job is None:
                continue
            if job_id in h.early:
                h.early.discard(job_id)
                if self._ready.due_early(job_id, item.job_type) is None:
                    continue  # handed over early
            else:
                self._decider.dispatched(item.job, now)
            self._ready.push(item)

    # -- reading buckets (``BucketReader``) -----------------------------------------------

    async def _refresh(self, now: int) -> None:
        """Read every entry due before ``now + lookahead`` not read yet, re-reading ``reread``
        before the time this refresh is due (late writes from other nodes land there).

        The window is anchored at the last refresh that succeeded, not at ``now``: after the
        store was away for longer than ``reread_s``, an entry another node wrote just before
        the outage, due during it, lies further back than ``now - reread_s``, and must still
        be read (invariant 2)."""
        start, horizon = self.begin_refresh(now)
        read = False
        try:
            await self._reader.read_range(start, horizon)
            read = True
        finally:
            self.end_refresh(now, horizon, [], read=read)

    def begin_refresh(self, now: int) -> tuple[int, int]:
        """The range ``[start, horizon)`` a refresh at ``now`` reads (see
        ``BucketReader.begin_refresh``)."""
        return self._reader.begin_refresh(now)

    def minutes(self, start: int, horizon: int) -> range:
        """The bucket minutes a read of ``[start, horizon)`` looks at."""
        return self._reader.minutes(start, horizon)

    def end_refresh(
        self, now: int, horizon: int, entries: Iterable[BucketEntry], *, read: bool
    ) -> None:
        """The refresh begun at ``now`` ended (see ``BucketReader.end_refresh``). Refreshed by
        the node, the loop wakes for what it brought, and to move the cursor once its minute
        has settled."""
        brought = self._reader.end_refresh(now, horizon, entries, read=read)
        if read and self.refreshed_by_node and self._task is not None:
            if self._reader.cursor_settled(now):
                self._cursor_check = True
            if brought or self._cursor_check:
                self._wake_up()

    # -- deadline timers of the jobs made ready -------------------------------------------

    def _expire_held(self, now: int) -> None:
        """Jobs still held in a ready queue past their deadline leave it and are looked at
        again now, which expires them (``EntryDecider._decide``)."""
        overdue: list[ReadyItem] = []
        while self._deadlines and self._deadlines[0][0] < now:
            deadline, job_id = heapq.heappop(self._deadlines)
            item = self._ready.find(job_id)
            if item is not None and item.shard == self.shard and item.deadline == deadline:
                overdue.append(item)
        self.expire_overdue(overdue)

    def expire_overdue(self, items: Iterable[ReadyItem]) -> None:
        """Ready items of this shard whose deadline passed before they could be claimed: out
        of the ready queue, and their entries looked at again at once, as the rows they
        hold, which expires them (or, if a row moved on meanwhile, decides it as it is).
        Whatever holds a due job back uses this (or keeps it in the ready queues, which does)."""
        woke = False
        for item in items:
            self._ready.remove(item.job_id)
            for e in item.entries:
                if item.job is not None:
                    self._held.rows[e] = item.job
                if e in self._held.known:
                    heapq.heappush(self._held.heap, e)
                    woke = True
        if woke:
            self._wake_up()

    def _remember_deadline(self, job: Job) -> None:
        """The job's deadline timer. Timers of jobs claimed meanwhile stay in the heap until
        they come due; when they outnumber the jobs held, the heap is rebuilt from those."""
        heapq.heappush(self._deadlines, (job.deadline, job.job_id))
        if len(self._deadlines) > 2 * self._ready.count(self.shard) + DEADLINE_TIMERS_SLACK:
            held = (self._ready.find(i) for i in self._ready.job_ids(self.shard))
            self._deadlines = [(i.deadline, i.job_id) for i in held if i and i.deadline]
            heapq.heapify(self._deadlines)
