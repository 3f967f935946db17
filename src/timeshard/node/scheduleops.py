"""The schedule operations of the JobService: a person's changes to a schedule (create,
update, pause, resume, delete, rollback), its revisions, and previews of its fire times.

Each change is one conditional write of the schedule row (on its version) with the revision it
makes; the fire path is ``node.schedules``.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from timeshard.clock import Clock
from timeshard.cron import CronSpec, PreviewEntry, next_fire, next_fire_times, preview
from timeshard.cron.zones import local_time
from timeshard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RevisionNotFound,
)
from timeshard.limits import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    MAX_PREVIEW_COUNT,
    REVISIONS_KEPT,
    check_range,
)
from timeshard.model import (
    ANONYMOUS,
    BucketEntry,
    Change,
    ChangeKind,
    Schedule,
    ScheduleRevision,
    validate_schedule_id,
)
from timeshard.node.schedules import purge_time, spec_of, stored_spec
from timeshard.sharding import shard_of
from timeshard.store.base import Store, schedule_entry

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


@dataclass(frozen=True, kw_only=True, slots=True)
class PreviewTime:
    """A previewed fire time and, with a spread, when its occurrence runs."""

    fire: PreviewEntry
    runs_at: int
    runs_at_local: str


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
        """Apply ``change`` to the stored schedule as the next revision, with ``said``.

        A change that changes nothing (a client's retry of an update, pause, resume or
        rollback that took effect) writes nothing and makes no revision: the schedule is
        returned as it is, its revision the current one."""
        for _ in range(20):
            current = await self.get(schedule_id)
            new, attention = change(current)
            if new.with_(revision=current.revision) == current:
                return current
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
        """Delete; the revision it makes keeps the schedule as it was (returned). Its history
        stays for the ledger retention (so `history` and `why` still answer), then it is
        purged: the entry written here (before the row, as every entry) comes due then, and
        ``ScheduleFirer`` purges it (``Store.purge_schedule``)."""
        said = self._said(ChangeKind.DELETE, actor, reason)
        for _ in range(20):
            current = await self.get(schedule_id)
            gone = current.with_(revision=current.revision + 1)
            purge = schedule_entry(gone, purge_time(self._store, said.at_ms), said.at_ms)
            await self._store.add_entries([purge])
            applied, _ = await self._store.delete_schedule(gone, current.version, said)
            if applied:
                await self._land([purge])
                return gone
        raise FailedPrecondition(f"schedule {schedule_id!r} kept changing; try again")

    async def history(
        self, schedule_id: str, *, below: int | None = None, limit: int = REVISIONS_KEPT
    ) -> list[ScheduleRevision]:
        """The kept revisions below ``below`` (None: from the newest), newest first, at most
        ``limit``; also a deleted schedule's. Reads only those (``schedule_revisions``)."""
        sid = validate_schedule_id(schedule_id)
        found = await self._store.schedule_revisions(sid, below=below, limit=limit)
        if not found and (below is None or not await self._store.schedule_revisions(sid, limit=1)):
            await self.get(sid)  # NotFound for an id that never had a schedule
        return found

    async def revision(self, schedule_id: str, revision: int) -> ScheduleRevision:
        found = await self._store.schedule_revision(validate_schedule_id(schedule_id), revision)
        if found is None:
            newest = await self.history(schedule_id, limit=1)
            # (the kept ones have no gaps: the newest REVISIONS_KEPT)
            top = newest[0].revision if newest else 0
            kept = (max(1, top - REVISIONS_KEPT + 1), top) if newest else None
            raise RevisionNotFound(schedule_id, revision, kept)
        return found

    async def rollback(
        self, schedule_id: str, revision: int, *, actor: str = ANONYMOUS, reason: str = ""
    ) -> Schedule:
        """A new revision whose definition (spec, zone, DST rules, template, policies) is
        revision ``revision``'s; the schedule stays paused or running as it is now, and keeps
        its place as an update does. A deleted schedule is not brought back (FAILED_PRECONDITION):
        create it again, and its revisions go on."""
        target = await self.revision(schedule_id, revision)
        if await self._store.get_schedule(schedule_id) is None:
            last = (await self.history(schedule_id, limit=1))[0].revision
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
