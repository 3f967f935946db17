"""Why an occurrence ran or did not: the chain of decisions in words (``timeshard why``, the
``ExplainOccurrence`` call, the console's schedule page), from the occurrence ledger
(``timeshard.ledger``) and the occurrence's job.

The job's attempts and outcome are read from the job row here, at the time of asking, not
copied into the ledger (see ``timeshard.ledger``): a finished job is kept for the jobs'
retention, after which the answer says its outcome is no longer stored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from timeshard.clock import Clock, format_rfc3339
from timeshard.cron import CronSpec, fire_times_between, newest_fire_times, next_fire_times
from timeshard.cron.dstskips import (
    DstSkip,
    clock,
    skip_at,
    transition_of_wall,
    wall_matches,
    wall_words,
)
from timeshard.cron.zones import Transition, local_time, resolve
from timeshard.errors import InvalidArgument, NotFound
from timeshard.ledger import LedgerRow
from timeshard.model import ChangeKind, Job, JobState, Schedule, validate_schedule_id
from timeshard.node.decided import dst_note
from timeshard.node.schedules import spec_of
from timeshard.store.base import Store

NEAREST = 2
"""Fire times shown on each side of a time that is no occurrence."""
LOOK_BACK_MS = 400 * 86_400_000
"""How far back the occurrence before a time is looked for (a yearly schedule has one)."""
RECENT_LIMIT = 200
COVER_LOOK = 3
"""Rows read back for the one covering a time: a run of missed occurrences may start before
the DST skips decided with it (their rows sort between its start and the time asked)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    schedule_id: str
    nominal: int
    """The occurrence's nominal time (0: a job that is no schedule's occurrence)."""
    nominal_local: str
    timezone: str
    found: bool
    """Whether ``nominal`` is an occurrence of the schedule (or has a ledger row)."""
    row: LedgerRow | None
    job: Job | None
    steps: tuple[str, ...]
    nearest: tuple[int, ...] = ()
    """Occurrences before and after a time that is none."""


def occurrence_of(job_id: str) -> tuple[str, int] | None:
    """(schedule id, nominal time) of an occurrence job's id (``Schedule.occurrence_id``)."""
    schedule_id, at, ms = job_id.rpartition("@")
    if not at or not ms.isdigit():
        return None
    try:
        return validate_schedule_id(schedule_id), int(ms)
    except InvalidArgument:
        return None


def _when(ms: int) -> str:
    return format_rfc3339(ms)


def schedule_words(s: Schedule) -> str:
    spec = spec_of(s)
    return (
        f"schedule {s.schedule_id}: cron '{s.cron}' in {s.timezone} (dst_gap="
        f"{spec.gap_policy}, dst_fold={spec.fold_policy}), misfire={s.misfire.value} "
        f"(grace {s.misfire_grace_ms / 1000:g}s), overlap={s.overlap.value}; revision "
        f"{s.revision}{', paused' if s.paused else ''}"
    )


def row_words(r: LedgerRow) -> list[str]:
    """The decision of a ledger row in words, one line and its notes."""
    what = r.reason.words
    if r.count > 1:
        at = f"from {_when(r.nominal)} to {_when(r.end)}" if r.spans else f"at {_when(r.nominal)}"
        what = f"one of {r.count} occurrences {at}, all {what}"
    by = f"node {r.node or '?'}, shard epoch {r.epoch}, schedule revision {r.revision}"
    job = f": job {r.job_id}, runs at {_when(r.run_at)}" if r.job_id else ""
    return [f"decided at {_when(r.decided_at)} by {by}: {what}{job}", *r.notes]


def job_words(job: Job, finished_keep_s: int | None = None) -> list[str]:
    """A job's attempts and outcome."""
    out = [f"job {job.job_id}: {job.job_type}, due {_when(job.run_at)}, now {job.state.value}"]
    for a in job.history:
        end = f", ended {_when(a.finished_at)}" if a.finished_at else ""
        how = f": {a.outcome}" if a.outcome else ""
        err = f" ({a.error})" if a.error else ""
        started = _when(a.started_at)
        out.append(f"attempt {a.attempt} on {a.worker}, started {started}{end}{how}{err}")
    if job.state is JobState.EXPIRED:
        out.append(f"deadline passed: {job.last_error}")
    elif job.state is JobState.DEAD:
        out.append(f"dead after {job.attempt} attempt(s): {job.last_error}")
    elif job.state.terminal and job.finished_at:
        out.append(f"{job.state.value} at {_when(job.finished_at)}")
    return out


def no_occurrence(s: Schedule, spec: CronSpec, at: int, asked: str) -> Explanation:
    """The answer for a time that is no occurrence of ``s``: said so, with the nearest ones
    (``asked``: the time in words, as asked)."""
    near = (
        *newest_fire_times(spec, at - LOOK_BACK_MS, at, NEAREST),
        *next_fire_times(spec, at, NEAREST),
    )
    listed = ", ".join(_when(t) for t in near) or "none"
    return Explanation(
        schedule_id=s.schedule_id,
        nominal=at,
        nominal_local=local_time(spec.zone, at).isoformat(timespec="seconds"),
        timezone=s.timezone,
        found=False,
        row=None,
        job=None,
        steps=(schedule_words(s), f"{asked} is no occurrence of it; nearest: {listed}"),
        nearest=near,
    )


def _with_deleted(e: Explanation, deleted: str) -> Explanation:
    """``e`` with the step saying its schedule was deleted, after the schedule's words."""
    if not deleted:
        return e
    return replace(e, steps=(e.steps[0], deleted, *e.steps[1:]))


class Explainer:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def _schedule(self, schedule_id: str) -> tuple[Schedule, str]:
        """The schedule, or a deleted one as it was when deleted, with a step saying so (its
        history is kept for the ledger retention, then purged); ``NotFound`` for neither."""
        sid = validate_schedule_id(schedule_id)
        s = await self._store.get_schedule(sid)
        if s is not None:
            return s, ""
        newest = await self._store.schedule_revisions(sid, limit=1)
        if not newest or newest[0].change.kind is not ChangeKind.DELETE:
            raise NotFound("schedule", schedule_id)
        gone = newest[0]
        return gone.schedule, (
            f"deleted at {_when(gone.change.at_ms)} by {gone.change.actor} (revision "
            f"{gone.revision}); as it was then"
        )

    async def occurrence(self, schedule_id: str, at: int) -> Explanation:
        """Why the occurrence of ``schedule_id`` at ``at`` (epoch ms) ran or did not;
        ``NotFound`` for an unknown schedule."""
        s, deleted = await self._schedule(schedule_id)
        return _with_deleted(await self._at(s, spec_of(s), at, bool(deleted)), deleted)

    async def local(self, schedule_id: str, wall: datetime) -> Explanation:
        """The same for a local time (naive, in the schedule's zone): one that a DST gap
        skipped or a fold repeated is said so, with the schedule's rule and what it made of
        it (``cron.dstskips``)."""
        s, deleted = await self._schedule(schedule_id)
        spec = spec_of(s)
        t = transition_of_wall(spec, wall)
        if t is None:
            e = await self._at(s, spec, resolve(spec.zone, wall).first_ms, bool(deleted))
        else:
            e = await self._dst_wall(s, spec, wall, t, bool(deleted))
        return _with_deleted(e, deleted)

    async def _dst_wall(
        self, s: Schedule, spec: CronSpec, wall: datetime, t: Transition, deleted: bool
    ) -> Explanation:
        """A local time in a gap or a fold: what the clocks did to it, the rule, and the
        chain of each instant the rule made of it (a fold: both of its instants)."""
        head = schedule_words(s)
        if not wall_matches(spec, wall):
            went = f"clocks went {clock(t.wall_from)} -> {clock(t.wall_to)}"
            asked = f"{wall.isoformat()} local (in a DST {'gap' if t.gap else 'fold'}: {went})"
            return no_occurrence(s, spec, resolve(spec.zone, wall).first_ms, asked)
        words = wall_words(spec, wall, t)
        if t.gap:
            at = t.at_ms - 1 if spec.gap_policy == "skip" else t.at_ms
            e = await self._at(s, spec, at, deleted)
            rest = [w for w in e.steps[1:] if w != words]
            return replace(e, nominal_local=wall.isoformat(), steps=(head, words, *rest))
        placed = resolve(spec.zone, wall)
        first = await self._at(s, spec, placed.first_ms, deleted)
        second = await self._at(s, spec, placed.second_ms, deleted)
        steps = [head, words]
        for which, e in (("first", first), ("second", second)):
            steps.append(f"the {which}, at {_when(e.nominal)} ({e.nominal_local}):")
            steps += e.steps[2:] if e.found else ["no run"]
        return replace(first, found=True, steps=tuple(steps))

    async def _at(self, s: Schedule, spec: CronSpec, at: int, deleted: bool) -> Explanation:
        found = await self._store.read_ledger(s.schedule_id, at_or_before=at, limit=COVER_LOOK)
        row = next((r for r in found if r.covers(at)), None)
        is_fire = fire_times_between(spec, at - 1, at, 1) == [at]
        skip = None if is_fire else skip_at(spec, at)
        if row is not None and row.nominal != at and not is_fire and skip is None:
            row = None  # inside a run of skipped ones, but not one of them
        if row is not None and skip is not None and row.nominal != skip.key_ms:
            row = None  # a run of missed ones around a DST skip: not its decision
        local = local_time(spec.zone, at).isoformat(timespec="seconds")
        steps = [schedule_words(s)]
        if row is None and not is_fire and skip is None:
            return no_occurrence(s, spec, at, f"{_when(at)} ({local})")
        steps.append(f"occurrence at {_when(at)} ({local} {s.timezone})")
        if skip is not None:
            steps[-1] = skip.words()
        elif (row is None or row.count > 1) and (dst := dst_note(spec, at)) is not None:
            steps.append(dst)
        job = None
        if row is None and deleted and at >= s.next_fire:
            steps.append("not decided: the schedule was deleted before it was due")
        elif row is None:
            steps.append(self._skip_undecided(s, spec, skip) if skip else self._undecided(s, at))
        else:
            steps += [w for w in row_words(row) if w not in steps]  # (a skip's words once)
            if row.job_id and row.count == 1:
                job = await self._store.get_job(row.job_id)
                steps += job_words(job) if job else [self._gone(row.job_id)]
        return Explanation(
            schedule_id=s.schedule_id,
            nominal=at,
            nominal_local=local,
            timezone=s.timezone,
            found=True,
            row=row,
            job=job,
            steps=tuple(steps),
        )

    def _skip_undecided(self, s: Schedule, spec: CronSpec, skip: DstSkip) -> str:
        """A DST skip with no ledger row: it is recorded with the first run after it."""
        after = next_fire_times(spec, skip.key_ms, 1)
        if not after or after[0] >= s.next_fire:
            then = f" ({_when(after[0])})" if after else ""
            return f"not in the ledger yet: recorded with the schedule's first run after it{then}"
        return self._undecided(s, skip.key_ms)

    def _undecided(self, s: Schedule, at: int) -> str:
        now = self._clock.now_ms()
        if at < s.created_at:
            return f"before the schedule was created ({_when(s.created_at)}): never due"
        if at >= s.next_fire:
            if s.paused:
                return "not decided yet: the schedule is paused; resume decides it"
            return f"not due yet (next fire {_when(s.next_fire)})"
        keep_s = getattr(getattr(self._store, "retention", None), "ledger_s", 0)
        if keep_s and at < now - keep_s * 1000:
            return f"no ledger row: older than the ledger's retention ({keep_s // 86400} days)"
        return "no ledger row: decided before this node kept the ledger, or still being written"

    def _gone(self, job_id: str) -> str:
        if self._store.expired(job_id):
            return f"job {job_id} expired from the store (its retention ended): outcome gone"
        return f"job {job_id} is not stored (its retention ended, or it was purged)"

    async def job(self, job_id: str) -> Explanation:
        """Why the job ran as it did: for a schedule's occurrence, the occurrence's chain."""
        occurrence = occurrence_of(job_id)
        if occurrence is not None:
            try:
                return await self.occurrence(*occurrence)
            except NotFound:
                pass  # the schedule is gone: the job alone
        job = await self._store.get_job(job_id)
        if job is None:
            raise NotFound("job", job_id)
        steps = [f"job {job_id} was created at {_when(job.created_at)} by a client call"]
        if occurrence is not None:
            steps = [f"job {job_id} is an occurrence of schedule {occurrence[0]}, now deleted"]
        return Explanation(
            schedule_id=occurrence[0] if occurrence else "",
            nominal=occurrence[1] if occurrence else 0,
            nominal_local="",
            timezone="",
            found=occurrence is not None,
            row=None,
            job=job,
            steps=(*steps, *job_words(job)),
        )

    async def recent(
        self, schedule_id: str, limit: int, at_or_before: int | None = None
    ) -> list[LedgerRow]:
        """The schedule's latest ledger rows (at or before ``at_or_before``, default now),
        newest first."""
        if not 1 <= limit <= RECENT_LIMIT:
            raise InvalidArgument("limit", f"must be 1-{RECENT_LIMIT}, got {limit}")
        until = self._clock.now_ms() if at_or_before is None else at_or_before
        return await self._store.read_ledger(schedule_id, at_or_before=until, limit=limit)
