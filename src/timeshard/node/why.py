"""Why an occurrence ran or did not: the chain of decisions in words (``timeshard why``, the
``ExplainOccurrence`` call, the console's schedule page), from the occurrence ledger
(``timeshard.ledger``) and the occurrence's job.

The job's attempts and outcome are read from the job row here, at the time of asking, not
copied into the ledger (see ``timeshard.ledger``): a finished job is kept for the jobs'
retention, after which the answer says its outcome is no longer stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeshard.clock import Clock, format_rfc3339
from timeshard.cron import fire_times_between, newest_fire_times, next_fire_times
from timeshard.cron.zones import local_time
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
        what = f"one of {r.count} occurrences from {_when(r.nominal)} to {_when(r.end)}, all {what}"
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


class Explainer:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def occurrence(self, schedule_id: str, at: int) -> Explanation:
        """Why the occurrence of ``schedule_id`` at ``at`` (epoch ms) ran or did not;
        ``NotFound`` for an unknown schedule."""
        s, deleted = await self._schedule(schedule_id)
        spec = spec_of(s)
        found = await self._store.read_ledger(s.schedule_id, at_or_before=at, limit=1)
        row = found[0] if found and found[0].covers(at) else None
        is_fire = fire_times_between(spec, at - 1, at, 1) == [at]
        if row is not None and row.nominal != at and not is_fire:
            row = None  # inside a run of skipped ones, but not one of them
        local = local_time(spec.zone, at).isoformat(timespec="seconds")
        steps = [schedule_words(s), *([deleted] if deleted else [])]
        if row is None and not is_fire:
            near = (
                *newest_fire_times(spec, at - LOOK_BACK_MS, at, NEAREST),
                *next_fire_times(spec, at, NEAREST),
            )
            listed = ", ".join(_when(t) for t in near) or "none"
            steps.append(f"{_when(at)} ({local}) is no occurrence of it; nearest: {listed}")
            return Explanation(
                schedule_id=s.schedule_id,
                nominal=at,
                nominal_local=local,
                timezone=s.timezone,
                found=False,
                row=None,
                job=None,
                steps=tuple(steps),
                nearest=near,
            )
        steps.append(f"occurrence at {_when(at)} ({local} {s.timezone})")
        if (row is None or row.count > 1) and (dst := dst_note(spec, at)) is not None:
            steps.append(dst)
        job = None
        if row is None and deleted and at >= s.next_fire:
            steps.append("not decided: the schedule was deleted before it was due")
        elif row is None:
            steps.append(self._undecided(s, at))
        else:
            steps += row_words(row)
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
