"""Cron schedules at run time: firing occurrences (called by the shard dispatcher when a
schedule's bucket entry comes due) and the schedule operations of the JobService.

Each occurrence is an ordinary job whose id derives from ``(schedule_id, scheduled_time)``,
created with a conditional insert, so two dispatchers can never create the same run
(invariant 8). The order of writes makes a crash anywhere safe: occurrences first (idempotent),
then the entry of the next fire, then the schedule row (conditional on its version).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import uuid
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from timeshard.clock import Clock
from timeshard.cron import (
    CronSpec,
    PreviewEntry,
    fire_times_between,
    newest_fire_times,
    next_fire,
    next_fire_times,
    preview,
)
from timeshard.cron.zones import local_time
from timeshard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RevisionNotFound,
)
from timeshard.limits import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, MAX_PREVIEW_COUNT, check_range
from timeshard.model import (
    ANONYMOUS,
    BucketEntry,
    Change,
    ChangeKind,
    Job,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleRevision,
    validate_schedule_id,
)
from timeshard.sharding import shard_of
from timeshard.store.base import Store, entry_for, repeats_due, schedule_entry

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


async def plan_fire(s: Schedule, now: int, still_active: int) -> FirePlan:
    """What to do when ``s`` comes due at ``now`` with ``still_active`` unfinished runs.

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

    capacity = max(0, (s.max_concurrent if s.overlap is OverlapPolicy.ALLOW else 1) - still_active)
    if s.queued_at:  # the one that waited goes first, then the oldest
        run = [s.queued_at, *oldest(capacity - 1)] if capacity else []
        rest = total + 1 - len(run)
        first_rest = s.queued_at if not run else (oldest(capacity)[-1] if rest else 0)
    else:  # more due than may run: the newest win
        run = newest(capacity) if capacity else []
        rest = total - len(run)
        first_rest = oldest(1)[0] if rest else 0
    queued_at = 0
    if s.overlap is OverlapPolicy.QUEUE and rest:
        queued_at = first_rest  # the oldest waiting keeps its place; later ones are skipped
        rest -= 1
    return FirePlan(
        run=run,
        skipped=n_missed - len(keep) + rest,
        queued_at=queued_at,
        next_fire=next_fire(spec, now),
    )


SPREAD_CHECK_FIRES = 50
"""A spread is checked against the gaps between this many of the schedule's next fire times."""


def check_spread(s: Schedule, spec: CronSpec, now: int) -> None:
    """A spread must be shorter than the time between two fire times: an occurrence moved
    past the next one's nominal time would still be waiting when that one fires, and the
    overlap policy would skip (or queue) runs because of the spread alone."""
    if not s.spread_ms:
        return
    times = next_fire_times(spec, now, SPREAD_CHECK_FIRES)
    gap = min((b - a for a, b in itertools.pairwise(times)), default=None)
    if gap is not None and s.spread_ms >= gap:
        raise InvalidArgument(
            "spread",
            f"{s.spread_ms / 1000:g}s is not shorter than the {gap / 1000:g}s between two "
            "fire times of this schedule: occurrences would overlap; use a smaller spread",
        )


def run_time(s: Schedule, occurrence_id: str, nominal: int) -> int:
    """When the occurrence of ``nominal`` runs: its spread offset (the same for every
    occurrence of the schedule) and its jitter after the nominal time, never before it."""
    return nominal + s.spread_offset + jitter_of(occurrence_id, s.jitter_ms)


@dataclass(frozen=True, kw_only=True, slots=True)
class PreviewTime:
    """A previewed fire time and, with a spread, when its occurrence runs."""

    fire: PreviewEntry
    runs_at: int
    runs_at_local: str


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
    ) -> None:
        self._store = store
        self._clock = clock
        self._default_max_attempts = default_max_attempts
        self._land = land
        self._counted = counted

    async def fire(self, schedule_id: str, due_at: int) -> FireResult:
        """Look at a schedule whose entry at ``due_at`` came due.

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
            return FireResult.MISSING  # deleted, or its row not written yet
        try:
            spec_of(s)
        except InvalidArgument as exc:  # its spec no longer checks (see stored_spec)
            log.error("schedule %s cannot fire: %s; update or delete it", schedule_id, exc)
            return FireResult.HANDLED
        if s.paused:
            return FireResult.HANDLED  # resume writes a new entry
        wake = min(s.next_fire, s.queued_at or s.next_fire)
        if wake > now:
            return FireResult.HANDLED  # moved later by an update; that writer wrote its entry
        active = await self._store.get_jobs(list(s.active)) if s.active else {}
        still = [j for j in active.values() if not j.state.terminal]
        plan = await plan_fire(s, now, len(still))
        created = await self._create_occurrences(s, plan.run, now)
        attention = (
            min(plan.next_fire, now + QUEUE_RECHECK_MS) if plan.queued_at else plan.next_fire
        )
        updated = s.with_(
            next_fire=plan.next_fire,
            queued_at=plan.queued_at,
            active=tuple(j.job_id for j in still) + tuple(created),
            skipped=s.skipped + plan.skipped,
            last_skip_at=now if plan.skipped else s.last_skip_at,
            last_fire_at=now if created else s.last_fire_at,
        )
        entry = schedule_entry(s, attention, now)
        applied, _ = await self._store.update_schedule(updated, s.version, entry)
        if applied:
            await self._land([entry])
        if plan.skipped:
            log.info("schedule %s: skipped %d occurrence(s)", schedule_id, plan.skipped)
        return FireResult.HANDLED if applied else FireResult.CONFLICT

    async def _create_occurrences(self, s: Schedule, times: list[int], now: int) -> list[str]:
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
            return []
        results = await self._store.create_jobs(jobs)
        self._counted([r.job for r in results if r.created], now)
        # Made already (a fire cut off before it advanced the schedule): its entry may be
        # unread, so one is written again, due now, before the schedule moves on.
        landing = [e for (_, e), r in zip(jobs, results, strict=True) if r.created]
        await self._land(landing, again=repeats_due(results, now))
        return [r.job.job_id for r in results]


class ScheduleOps:
    """The schedule operations of the JobService."""

    def __init__(
        self, store: Store, clock: Clock, land: Callable[[Sequence[BucketEntry]], Awaitable[None]]
    ) -> None:
        self._store = store
        self._clock = clock
        self._land = land

    def build(self, s: Schedule) -> Schedule:
        """Check the spec and set the shard and the first fire time."""
        spec = spec_of(s)
        now = self._clock.now_ms()
        check_spread(s, spec, now)
        schedule_id = s.schedule_id
        return s.with_(
            shard=shard_of(schedule_id, self._store.num_shards),
            next_fire=next_fire(spec, now),
            created_at=now,
            version=0,
        )

    def _said(self, kind: ChangeKind, actor: str, reason: str, rolled_back_to: int = 0) -> Change:
        """The change a person asks for (checked before anything is written)."""
        now = self._clock.now_ms()
        return Change(
            kind=kind, actor=actor, at_ms=now, reason=reason, rolled_back_to=rolled_back_to
        )

    async def create(self, s: Schedule, *, actor: str = ANONYMOUS, reason: str = "") -> Schedule:
        """Revision 1 (or, on the id of a deleted schedule, the one after its last)."""
        said = self._said(ChangeKind.CREATE, actor, reason)
        s = self.build(s).with_(revision=1)
        entry = schedule_entry(s, s.next_fire, self._clock.now_ms())
        created, stored = await self._store.create_schedule(s, entry, said)
        if created:
            await self._land([entry])
        else:
            raise AlreadyExists(
                f"schedule {s.schedule_id!r} already exists; update it or pick another id"
            )
        return stored

    async def get(self, schedule_id: str) -> Schedule:
        s = await self._store.get_schedule(validate_schedule_id(schedule_id))
        if s is None:
            raise NotFound("schedule", schedule_id)
        return s

    async def list_schedules(self, limit: int, token: str) -> tuple[list[Schedule], str]:
        check_range("page_size", limit, 0, MAX_PAGE_SIZE)
        return await self._store.list_schedules(limit=limit or DEFAULT_PAGE_SIZE, page_token=token)

    async def _change(
        self,
        schedule_id: str,
        change: Callable[[Schedule], tuple[Schedule, int | None]],
        said: Change,
    ) -> Schedule:
        """Apply ``change`` to the stored schedule as the next revision, with ``said``."""
        for _ in range(20):
            current = await self.get(schedule_id)
            new, attention = change(current)
            new = new.with_(revision=current.revision + 1)
            entry = schedule_entry(new, attention, self._clock.now_ms()) if attention else None
            applied, stored = await self._store.update_schedule(new, current.version, entry, said)
            if applied and stored is not None:
                if entry is not None:
                    await self._land([entry])
                return stored
        raise FailedPrecondition(f"schedule {schedule_id!r} kept changing; try again")

    async def update(
        self,
        s: Schedule,
        *,
        actor: str = ANONYMOUS,
        reason: str = "",
        rolled_back_to: int = 0,
    ) -> Schedule:
        """Replace a schedule's spec, job template and policies; it keeps its place.

        Its place is its next fire time: every run before it has been handled. With the same
        spec (cron, time zone, DST policies) that time is kept, so a paused schedule's runs
        missed before the update are still handled by its misfire policy on resume, as if it
        had not been updated. With a new spec, the new spec takes over from that place: the
        next fire is its first time after the place or after now, whichever is earlier. For a
        running schedule that is the new spec from now on; for a paused one whose next run is
        past, the new spec's times since that run are the missed runs of resume (the old
        spec's are not run). The runs of the new spec between the pause and the old next run
        are not counted: the schedule does not record when it was paused.

        ``rolled_back_to``: the update is a rollback to that revision's definition."""
        spec = spec_of(s)  # validate before touching the stored row
        now = self._clock.now_ms()
        check_spread(s, spec, now)
        kind = ChangeKind.ROLLBACK if rolled_back_to else ChangeKind.UPDATE
        said = self._said(kind, actor, reason, rolled_back_to)

        def change(cur: Schedule) -> tuple[Schedule, int | None]:
            if spec == stored_spec(cur):  # None (a stored spec that no longer checks) differs
                nxt = cur.next_fire
            else:
                nxt = next_fire(spec, min(cur.next_fire - 1, now))
            new = s.with_(
                shard=cur.shard,
                created_at=cur.created_at,
                version=cur.version,
                next_fire=nxt,
                paused=cur.paused,
                active=cur.active,
                queued_at=cur.queued_at,
                skipped=cur.skipped,
                last_skip_at=cur.last_skip_at,
                last_fire_at=cur.last_fire_at,
            )
            return new, None if cur.paused else nxt

        return await self._change(s.schedule_id, change, said)

    async def pause(
        self, schedule_id: str, *, actor: str = ANONYMOUS, reason: str = ""
    ) -> Schedule:
        said = self._said(ChangeKind.PAUSE, actor, reason)
        return await self._change(schedule_id, lambda cur: (cur.with_(paused=True), None), said)

    async def resume(
        self, schedule_id: str, *, actor: str = ANONYMOUS, reason: str = ""
    ) -> Schedule:
        """Unpause; the schedule keeps its place, so runs missed while paused go through the
        misfire policy at once."""
        said = self._said(ChangeKind.RESUME, actor, reason)
        return await self._change(
            schedule_id, lambda cur: (cur.with_(paused=False), cur.next_fire), said
        )

    async def delete(
        self, schedule_id: str, *, actor: str = ANONYMOUS, reason: str = ""
    ) -> Schedule:
        """Delete; the revision it makes keeps the schedule as it was (returned)."""
        said = self._said(ChangeKind.DELETE, actor, reason)
        for _ in range(20):
            current = await self.get(schedule_id)
            gone = current.with_(revision=current.revision + 1)
            applied, _ = await self._store.delete_schedule(gone, current.version, said)
            if applied:
                return gone
        raise FailedPrecondition(f"schedule {schedule_id!r} kept changing; try again")

    async def history(self, schedule_id: str) -> list[ScheduleRevision]:
        """The kept revisions, newest first (also a deleted schedule's)."""
        found = await self._store.schedule_revisions(validate_schedule_id(schedule_id))
        if not found:
            await self.get(schedule_id)  # NotFound for an id that never had a schedule
        return found

    async def revision(self, schedule_id: str, revision: int) -> ScheduleRevision:
        found = await self.history(schedule_id)
        match = next((r for r in found if r.revision == revision), None)
        if match is None:
            kept = (found[-1].revision, found[0].revision) if found else None
            raise RevisionNotFound(schedule_id, revision, kept)
        return match

    async def rollback(
        self, schedule_id: str, revision: int, *, actor: str = ANONYMOUS, reason: str = ""
    ) -> Schedule:
        """A new revision whose definition (spec, zone, DST rules, template, policies) is
        revision ``revision``'s; the schedule stays paused or running as it is now, and keeps
        its place as an update does. A deleted schedule is not brought back (FAILED_PRECONDITION):
        create it again, and its revisions go on."""
        target = await self.revision(schedule_id, revision)
        if await self._store.get_schedule(schedule_id) is None:
            last = (await self.history(schedule_id))[0].revision
            raise FailedPrecondition(
                f"schedule {schedule_id!r} was deleted (revision {last}): a rollback changes a "
                "live schedule, so nothing was changed; create it again (`timeshard schedules "
                f"create ... --id {schedule_id}`), and its revisions go on from {last + 1}"
            )
        # (update takes the definition from it and the rest from the stored schedule)
        return await self.update(
            target.schedule, actor=actor, reason=reason, rolled_back_to=revision
        )

    @staticmethod
    def preview(
        spec: CronSpec, after_ms: int, count: int, *, schedule_id: str = "", spread_ms: int = 0
    ) -> list[PreviewTime]:
        """The next ``count`` fire times, and when each occurrence would run with a spread
        of ``spread_ms`` for the schedule ``schedule_id`` (its offset derives from the id)."""
        check_range("count", count, 1, MAX_PREVIEW_COUNT)
        if spread_ms and not schedule_id:
            raise InvalidArgument(
                "schedule_id", "a spread's offset derives from the schedule id: give the id"
            )
        if schedule_id:
            validate_schedule_id(schedule_id)
        probe = Schedule(
            schedule_id=schedule_id or "preview",
            shard=0,
            cron=spec.expression,
            timezone=spec.timezone,
            job_type="preview",
            spread_ms=spread_ms,
            next_fire=0,
            created_at=0,
        )
        if spread_ms:
            check_spread(probe, spec, after_ms)
        zone = spec.zone
        out = []
        for fire in preview(spec, after_ms, count):
            runs_at = fire.at_ms + probe.spread_offset
            local = local_time(zone, runs_at).isoformat(timespec="milliseconds")
            out.append(PreviewTime(fire=fire, runs_at=runs_at, runs_at_local=local))
        return out


def new_schedule_id() -> str:
    return uuid.uuid4().hex
