"""Cron schedules at run time: firing occurrences, called by the shard dispatcher when a
schedule's bucket entry comes due (a person's changes are ``node.scheduleops``).

Each occurrence is an ordinary job whose id derives from ``(schedule_id, scheduled_time)``,
created with a conditional insert, so two dispatchers can never create the same run
(invariant 8). The order of writes makes a crash anywhere safe: occurrences first (idempotent),
then the entry of the next fire, then the schedule row (conditional on its version).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from timeshard.clock import Clock
from timeshard.cron import (
    CronSpec,
    fire_times_between,
    newest_fire_times,
    next_fire,
)
from timeshard.errors import (
    InvalidArgument,
)
from timeshard.ledger import DAY_MS, LedgerRow, Reason
from timeshard.model import (
    SCHEDULE_ENTRY_PREFIX,
    BucketEntry,
    Job,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
)
from timeshard.node.decided import Decided, Made, decide, dst_decided, ledger_rows, span_of
from timeshard.sharding import shard_of
from timeshard.store.base import Store, entry_at, entry_for, repeats_due, schedule_entry

log = logging.getLogger(__name__)

QUEUE_RECHECK_MS = 1000
"""How often a schedule with a queued occurrence looks whether the previous one finished."""
COUNT_LIMIT = 10_000
"""Dropped occurrences counted per catch-up (into ``skipped``); beyond it the count is a lower
bound. Counting every one would cost more than the catch-up itself (a per-second schedule
paused for a day has 86,399 to drop), and nothing else needs them listed."""
_COUNT_CHUNK = 500


def spec_of(s: Schedule) -> CronSpec:
    return CronSpec(
        expression=s.cron,
        timezone=s.timezone,
        dst_gap=s.dst_gap or None,  # type: ignore[arg-type]
        dst_fold=s.dst_fold or None,  # type: ignore[arg-type]
    )


def stored_spec(s: Schedule) -> CronSpec | None:
    """The spec of a stored schedule, or None if it no longer checks: a row written before a
    rule got stricter (a day-of-month that never occurs under the AND rule, say)."""
    try:
        return spec_of(s)
    except InvalidArgument:
        return None


class FireResult(enum.Enum):
    HANDLED = "handled"  # the entry is done with
    CONFLICT = "conflict"  # a concurrent update won: look again now
    MISSING = "missing"  # no schedule row (deleted, or not written yet)


@dataclass(frozen=True, kw_only=True, slots=True)
class FirePlan:
    run: list[int]  # scheduled times to create occurrences for
    skipped: int  # occurrences dropped (misfire skip, overlap skip, queue overflow)
    queued_at: int  # a time waiting for the previous run (overlap=queue), or 0
    next_fire: int
    decided: tuple[Decided, ...] = field(default=(), compare=False)
    """What became of each due occurrence (runs of alike ones as one): the ledger's rows."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Times:
    """Due times, ascending: ``head``, then the spec's fire times in ``(after, until]``.

    Never listed whole: an outage can leave a great many (86,400 a day for a per-second
    schedule); each question reads only the few it needs."""

    head: tuple[int, ...]
    spec: CronSpec
    after: int
    until: int

    def oldest(self, n: int) -> list[int]:
        lazy = fire_times_between(self.spec, self.after, self.until, n - len(self.head))
        return [*self.head, *lazy][:n]

    def newest(self, n: int) -> list[int]:
        if n <= 0:
            return []
        return [*self.head, *newest_fire_times(self.spec, self.after, self.until, n)][-n:]

    async def count(self, limit: int) -> int:
        """How many, counting no further than ``limit``; yields to the loop between chunks."""
        counted, after = len(self.head), self.after
        while counted < limit:
            want = min(_COUNT_CHUNK, limit - counted)
            chunk = fire_times_between(self.spec, after, self.until, want)
            counted += len(chunk)
            if len(chunk) < want:
                break
            after = chunk[-1]
            await asyncio.sleep(0)
        return counted


def _due(s: Schedule, spec: CronSpec, now: int) -> tuple[_Times, _Times]:
    """The due times — ``s.next_fire`` and the fire times after it up to ``now`` — split into
    missed (older than ``misfire_grace``) and on time."""
    first, cutoff = s.next_fire, now - s.misfire_grace_ms - 1
    if first > now:
        none = _Times(head=(), spec=spec, after=now, until=now)
        return none, none
    if first > cutoff:
        missed = _Times(head=(), spec=spec, after=first, until=first)
        return missed, _Times(head=(first,), spec=spec, after=first, until=now)
    missed = _Times(head=(first,), spec=spec, after=first, until=cutoff)
    return missed, _Times(head=(), spec=spec, after=cutoff, until=now)


async def plan_fire(s: Schedule, now: int, still_active: int, *, paused: bool = False) -> FirePlan:
    """What to do when ``s`` comes due at ``now`` with ``still_active`` unfinished runs, and
    the decision for each due occurrence (``decided``: ``node.decided``); ``paused``: the
    missed ones were due while the schedule was paused.

    The work is bounded whatever the outage: the missed runs kept (one, or ``max_catchup``) are
    found from the newest backwards, and dropped ones are only counted, up to ``COUNT_LIMIT``,
    yielding to the event loop as it goes."""
    spec = spec_of(s)
    missed, on_time = _due(s, spec, now)
    keep_n = {MisfirePolicy.SKIP: 0, MisfirePolicy.ONCE: 1}.get(s.misfire, s.max_catchup)
    keep = missed.newest(keep_n)
    n_missed = await missed.count(COUNT_LIMIT)
    if n_missed >= COUNT_LIMIT:
        log.info("schedule %s: %d+ missed runs (counted no further)", s.schedule_id, n_missed)
    total = len(keep) + await on_time.count(COUNT_LIMIT)  # the candidates: keep, then on time

    def oldest(n: int) -> list[int]:
        return [*keep, *on_time.oldest(n - len(keep))][:n]

    def newest(n: int) -> list[int]:
        latest = on_time.newest(n)
        return [*keep[len(keep) - (n - len(latest)) :], *latest] if len(latest) < n else latest

    def at(i: int) -> int:  # the i-th candidate
        return keep[i] if i < len(keep) else on_time.oldest(i - len(keep) + 1)[-1]

    capacity = max(0, (s.max_concurrent if s.overlap is OverlapPolicy.ALLOW else 1) - still_active)
    if s.queued_at:  # the one that waited goes first, then the oldest
        run = [s.queued_at, *oldest(capacity - 1)] if capacity else []
        rest = total + 1 - len(run)
        first_rest = s.queued_at if not run else (oldest(capacity)[-1] if rest else 0)
        rest_from = max(len(run) - 1, 0)  # the candidates not run: [rest_from, total)
    else:  # more due than may run: the newest win
        run = newest(capacity) if capacity else []
        rest = total - len(run)
        first_rest = oldest(1)[0] if rest else 0
        rest_from = 0
    queued_at = 0
    if s.overlap is OverlapPolicy.QUEUE and rest:
        queued_at = first_rest  # the oldest waiting keeps its place; later ones are skipped
        rest -= 1
    n_drop = n_missed - len(keep)
    skip_from = rest_from + (1 if queued_at and queued_at != s.queued_at else 0)
    unqueued = s.queued_at if s.queued_at and not run and not queued_at else 0
    decided = decide(
        s,
        run=run,
        kept=set(keep),
        queued=queued_at if queued_at != s.queued_at else 0,
        dropped=(missed.oldest(1)[0], missed.newest(len(keep) + 1)[0], n_drop) if n_drop else None,
        overlapped=span_of(at, skip_from, skip_from + rest - (1 if unqueued else 0)),
        unqueued=unqueued,
        still_active=still_active,
        paused=paused,
    )
    nxt = next_fire(spec, now)
    return FirePlan(
        run=run, skipped=n_drop + rest, queued_at=queued_at, next_fire=nxt, decided=decided
    )


def purge_time(store: Store, deleted_at: int) -> int:
    """When a schedule deleted at ``deleted_at`` is purged: after the ledger retention, so its
    history and its ledger answer as long as the ledger keeps rows of it."""
    return deleted_at + store.retention.ledger_s * 1000


def run_time(s: Schedule, occurrence_id: str, nominal: int) -> int:
    """When the occurrence of ``nominal`` runs: its spread offset (the same for every
    occurrence of the schedule) and its jitter after the nominal time, never before it."""
    return nominal + s.spread_offset + jitter_of(occurrence_id, s.jitter_ms)


def jitter_of(occurrence_id: str, jitter_ms: int) -> int:
    """A stable jitter per occurrence: every dispatcher computes the same run_at."""
    return zlib.crc32(occurrence_id.encode()) % (jitter_ms + 1) if jitter_ms else 0


class Land(Protocol):
    """``Node._land``: notify the dispatchers of entries just written, and write again (due
    now) the ones that landed late, and ``again``, before returning."""

    def __call__(
        self, entries: Sequence[BucketEntry], /, *, again: Sequence[BucketEntry] = ()
    ) -> Awaitable[None]: ...


Counted = Callable[[list[Job], int], None]
"""``NodeMetrics.scheduled``: jobs just created, and when the call that made them started."""


def _not_counted(jobs: list[Job], started_ms: int) -> None:
    pass


Decisions = Callable[[Schedule, list[LedgerRow]], None]
"""``NodeMetrics.decided``: the ledger rows a fire of the schedule just wrote."""


def _not_told(s: Schedule, rows: list[LedgerRow]) -> None:
    pass


class ScheduleFirer:
    """Fires schedules whose entries come due; used by the shard dispatcher.

    ``counted`` is told of each occurrence job this firer creates (never one a repeated fire
    found made already), as the JobService's creates are, so the node's per-type count of
    scheduled jobs includes cron runs."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        default_max_attempts: int,
        land: Land,
        *,
        counted: Counted = _not_counted,
        node_id: str = "",
        decided: Decisions = _not_told,
    ) -> None:
        self._store = store
        self._clock = clock
        self._default_max_attempts = default_max_attempts
        self._land = land
        self._counted = counted
        self._node_id = node_id
        self._decided = decided

    async def fire(self, schedule_id: str, due_at: int, *, epoch: int = 0) -> FireResult:
        """Look at a schedule whose entry at ``due_at`` came due, on the shard ``epoch``.

        A stored schedule that no longer checks is logged and let go (HANDLED) rather than
        raised: raising would put the entry back and hold up every other entry due on the
        shard, for good. It fires again once an update gives it a valid spec (a row that cannot
        be read at all can only be deleted)."""
        try:
            s = await self._store.get_schedule(schedule_id)
        except InvalidArgument as exc:  # the row no longer makes a valid Schedule
            log.error("schedule %s cannot fire: %s; delete and create it again", schedule_id, exc)
            return FireResult.HANDLED
        now = self._clock.now_ms()
        if s is None:
            return await self._gone(schedule_id, now)
        try:
            spec = spec_of(s)
        except InvalidArgument as exc:  # its spec no longer checks (see stored_spec)
            log.error("schedule %s cannot fire: %s; update or delete it", schedule_id, exc)
            return FireResult.HANDLED
        if s.paused:
            return await self._paused(s, now, epoch)  # resume writes a new entry
        wake = min(s.next_fire, s.queued_at or s.next_fire)
        if wake > now:
            return FireResult.HANDLED  # moved later by an update; that writer wrote its entry
        active = await self._store.get_jobs(list(s.active)) if s.active else {}
        still = [j for j in active.values() if not j.state.terminal]
        plan = await plan_fire(s, now, len(still), paused=await self._was_paused(s, now))
        made = await self._create_occurrences(s, plan.run, now)
        attention = (
            min(plan.next_fire, now + QUEUE_RECHECK_MS) if plan.queued_at else plan.next_fire
        )
        updated = s.with_(
            next_fire=plan.next_fire,
            queued_at=plan.queued_at,
            active=tuple(j.job_id for j in still) + tuple(m.job_id for m in made.values()),
            skipped=s.skipped + plan.skipped,
            last_skip_at=now if plan.skipped else s.last_skip_at,
            last_fire_at=now if made else s.last_fire_at,
        )
        entry = schedule_entry(s, attention, now)
        decided = dst_decided(spec, s.next_fire, now) + plan.decided  # (+ the DST rule's)
        rows = ledger_rows(s, spec, decided, made, node=self._node_id, epoch=epoch, now=now)
        applied, _ = await self._store.update_schedule(updated, s.version, entry, ledger=rows)
        if applied:
            self._decided(s, rows)
            await self._land([entry])
        if plan.skipped:
            log.info("schedule %s: skipped %d occurrence(s)", schedule_id, plan.skipped)
        return FireResult.HANDLED if applied else FireResult.CONFLICT

    async def _gone(self, schedule_id: str, now: int) -> FireResult:
        """No live row: a deleted schedule is purged once past the ledger retention (else its
        entry is written for then); no row at all is MISSING (not written yet, or purged)."""
        keep_ms = purge_time(self._store, 0)
        deleted_at = await self._store.purge_schedule(schedule_id, deleted_before=now - keep_ms)
        if deleted_at is None:
            return FireResult.MISSING
        if deleted_at:  # (an entry of its life before the delete, or the retention grew)
            shard = shard_of(schedule_id, self._store.num_shards)
            later = entry_at(shard, SCHEDULE_ENTRY_PREFIX + schedule_id, deleted_at + keep_ms, now)
            await self._store.add_entries([later])
            await self._land([later])
        else:
            days = keep_ms / DAY_MS
            log.info("schedule %s: deleted over %g days ago, purged", schedule_id, days)
        return FireResult.HANDLED

    async def _paused(self, s: Schedule, now: int, epoch: int) -> FireResult:
        """The entry of ``s.next_fire`` came due while paused: the ledger says so (the row is
        left as it is otherwise: resume decides the runs due meanwhile by the misfire policy,
        and ``_was_paused`` finds this row then)."""
        if s.next_fire > now:
            return FireResult.HANDLED
        row = LedgerRow(
            schedule_id=s.schedule_id,
            nominal=s.next_fire,
            reason=Reason.PAUSED,
            revision=s.revision,
            node=self._node_id,
            epoch=epoch,
            decided_at=now,
            notes=("due while the schedule was paused; resume decides it by the misfire policy",),
        )
        applied, _ = await self._store.update_schedule(s, s.version, None, ledger=[row])
        return FireResult.HANDLED if applied else FireResult.CONFLICT  # (counted on resume)

    async def _was_paused(self, s: Schedule, now: int) -> bool:
        """Whether the missed runs of ``s`` (if any) were due while it was paused: the ledger
        row of its next fire says so (``_paused``). Read only when runs were missed."""
        if s.next_fire >= now - s.misfire_grace_ms:
            return False
        found = await self._store.read_ledger(s.schedule_id, at_or_before=s.next_fire, limit=1)
        return bool(found) and found[0].nominal == s.next_fire and found[0].reason is Reason.PAUSED

    async def _create_occurrences(self, s: Schedule, times: list[int], now: int) -> dict[int, Made]:
        jobs = []
        for t in times:
            job_id = s.occurrence_id(t)
            job = Job(
                job_id=job_id,
                shard=shard_of(job_id, self._store.num_shards),
                job_type=s.job_type,
                payload=s.payload,
                run_at=run_time(s, job_id, t),
                created_at=now,
                max_attempts=s.max_attempts or self._default_max_attempts,
            )
            jobs.append((job, entry_for(job, job.run_at, now)))
        if not jobs:
            return {}
        results = await self._store.create_jobs(jobs)
        self._counted([r.job for r in results if r.created], now)
        # Made already (a fire cut off before it advanced the schedule): its entry may be
        # unread, so one is written again, due now, before the schedule moves on.
        landing = [e for (_, e), r in zip(jobs, results, strict=True) if r.created]
        await self._land(landing, again=repeats_due(results, now))
        return {
            t: Made(job_id=r.job.job_id, run_at=r.job.run_at, deduped=not r.created)
            for t, r in zip(times, results, strict=True)
        }
