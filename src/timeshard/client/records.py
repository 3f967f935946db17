"""What the Python client returns: jobs, their attempts, schedules, dead letters and preview
times as frozen dataclasses, with aware UTC ``datetime``s, ``timedelta``s and the model's enums
(``JobState``, ``MisfirePolicy``, ``OverlapPolicy``), read from the API's messages.

The node's own ``timeshard.model`` keeps times as epoch milliseconds (its hot path); these are
the same objects as a user of the SDK wants to read them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from timeshard.clock import to_datetime
from timeshard.errors import InvalidArgument
from timeshard.model import RESULT_JSON, JobState, MisfirePolicy, OverlapPolicy
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur_s, state_from_pb, ts_ms


def _time(msg: Any, field: str) -> datetime | None:
    """The message's Timestamp ``field`` as an aware UTC datetime, None when not set."""
    if not msg.HasField(field):
        return None
    stamp: Timestamp = getattr(msg, field)
    return to_datetime(ts_ms(stamp))


def _required_time(msg: Any, field: str) -> datetime:
    return _time(msg, field) or datetime.fromtimestamp(0, UTC)


def _delta(d: Duration) -> timedelta:
    return timedelta(seconds=dur_s(d))


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise InvalidArgument("payload", f"not JSON ({exc}); read raw_payload instead") from None


def result_value(raw: bytes, encoding: str) -> Any:
    """A job's result as its handler returned it: the value of a JSON result, the bytes of a
    bytes result, None when there is none."""
    if encoding == RESULT_JSON:
        return json.loads(raw)
    return raw if encoding else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """One run of a job: who ran it, when, and how it ended (``outcome`` empty while running)."""

    attempt: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str
    error: str
    traceback: str = ""
    """A failed attempt's traceback as its worker sent it (the end of it, at most 8000 bytes)."""

    @classmethod
    def from_pb(cls, msg: pb.Attempt) -> Attempt:
        return cls(
            attempt=msg.attempt,
            worker=msg.worker,
            started_at=_required_time(msg, "started_at"),
            finished_at=_time(msg, "finished_at"),
            outcome=msg.outcome,
            error=msg.error,
            traceback=msg.traceback,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """A job as the server holds it. ``payload`` is the decoded JSON; ``raw_payload`` the bytes
    as stored."""

    job_id: str
    job_type: str
    raw_payload: bytes
    state: JobState
    run_at: datetime
    created_at: datetime
    attempt: int
    max_attempts: int
    fence: int
    lease_owner: str
    lease_until: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    idempotency_key: str
    last_error: str
    history: tuple[Attempt, ...]
    shard: int
    raw_result: bytes = b""
    result_encoding: str = ""
    """How ``raw_result`` reads: ``"json"``, ``"bytes"``, or ``""`` (no result)."""
    deadline: datetime | None = None
    """No attempt starts after it; a job still waiting then ends ``expired``."""
    priority: int = 0
    unstarted: int = 0
    """Deliveries that ended without a handler start: never attempts (invariant 9)."""

    @property
    def payload(self) -> Any:
        return _json(self.raw_payload)

    @property
    def result(self) -> Any:
        """What the handler returned, for a succeeded job: the value of a JSON result, the
        bytes of a bytes result, None when it returned nothing (or the job did not succeed)."""
        return result_value(self.raw_result, self.result_encoding)

    @property
    def will_run(self) -> bool:
        """Still to run (scheduled, or running now)."""
        return not self.state.terminal

    @classmethod
    def from_pb(cls, msg: pb.Job) -> Job:
        state = state_from_pb(msg.state)
        if state is None:
            raise InvalidArgument("state", f"job {msg.job_id!r} came back without a state")
        return cls(
            job_id=msg.job_id,
            job_type=msg.type,
            raw_payload=msg.payload,
            state=state,
            run_at=_required_time(msg, "run_at"),
            created_at=_required_time(msg, "created_at"),
            attempt=msg.attempt,
            max_attempts=msg.max_attempts,
            fence=msg.fence,
            lease_owner=msg.lease_owner,
            lease_until=_time(msg, "lease_until"),
            started_at=_time(msg, "started_at"),
            finished_at=_time(msg, "finished_at"),
            idempotency_key=msg.idempotency_key,
            last_error=msg.last_error,
            history=tuple(Attempt.from_pb(a) for a in msg.history),
            shard=msg.shard,
            raw_result=msg.result,
            result_encoding=msg.result_encoding,
            unstarted=msg.unstarted,
            deadline=_time(msg, "deadline"),
            priority=msg.priority,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Scheduled:
    """What scheduling one job did: ``job`` as stored, and whether this call ``created`` it.

    ``created`` is False when the idempotency key names a job made earlier; that job is
    returned as it stands, whatever its state (a cancelled or dead job stays so: a new job
    needs a new key)."""

    job: Job
    created: bool
    warnings: tuple[str, ...] = ()
    """What the server noticed about the job's type, for a person (it is scheduled all the
    same): e.g. that no worker has asked the node for jobs of that type lately. The client
    logs each type's once (``logging.warning``)."""

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def will_run(self) -> bool:
        return self.job.will_run

    @classmethod
    def from_pb(
        cls, msg: pb.ScheduleJobResponse, warnings: Sequence[pb.ScheduleWarning] = ()
    ) -> Scheduled:
        """``warnings``: a batch's (``ScheduleJobsResponse.warnings``), of which those of this
        job's type are kept; a single reply's own otherwise."""
        job = Job.from_pb(msg.job)
        said = [w.message for w in (*msg.warnings, *warnings) if w.type == job.job_type]
        return cls(job=job, created=msg.created, warnings=tuple(said))


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetter:
    """A job that failed for good (a permanent error, or out of attempts): its last error, its
    attempts and its payload, ready to inspect and replay."""

    job: Job

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def job_type(self) -> str:
        return self.job.job_type

    @property
    def error(self) -> str:
        return self.job.last_error

    @property
    def history(self) -> tuple[Attempt, ...]:
        return self.job.history

    @property
    def payload(self) -> Any:
        return self.job.payload

    @property
    def died_at(self) -> datetime | None:
        return self.job.finished_at

    @classmethod
    def from_pb(cls, msg: pb.Job) -> DeadLetter:
        return cls(job=Job.from_pb(msg))


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A cron schedule: its spec, the job each occurrence becomes, its policies and where it
    stands (``next_fire``, the skips, the occurrences that may still run)."""

    schedule_id: str
    cron: str
    timezone: str
    job_type: str
    raw_payload: bytes
    misfire: MisfirePolicy
    misfire_grace: timedelta
    max_catchup: int
    overlap: OverlapPolicy
    max_concurrent: int
    jitter: timedelta
    dst_gap: str
    dst_fold: str
    paused: bool
    next_fire: datetime | None
    max_attempts: int
    skipped: int
    last_skip_at: datetime | None
    last_fire_at: datetime | None
    active_jobs: tuple[str, ...]
    queued_at: datetime | None
    spread: timedelta = timedelta(0)
    """Each occurrence runs a stable offset in ``[0, spread)`` after its nominal time."""
    revision: int = 0
    """1 at create, one more with each update, pause, resume, delete and rollback."""

    @property
    def payload(self) -> Any:
        return _json(self.raw_payload)

    @classmethod
    def from_pb(cls, msg: pb.Schedule) -> Schedule:
        return cls(
            schedule_id=msg.schedule_id,
            cron=msg.cron,
            timezone=msg.timezone,
            job_type=msg.type,
            raw_payload=msg.payload,
            misfire=MisfirePolicy(msg.misfire or MisfirePolicy.ONCE),
            misfire_grace=_delta(msg.misfire_grace),
            max_catchup=msg.max_catchup,
            overlap=OverlapPolicy(msg.overlap or OverlapPolicy.SKIP),
            max_concurrent=msg.max_concurrent,
            jitter=_delta(msg.jitter),
            dst_gap=msg.dst_gap,
            dst_fold=msg.dst_fold,
            paused=msg.paused,
            next_fire=_time(msg, "next_fire"),
            max_attempts=msg.max_attempts,
            skipped=msg.skipped,
            last_skip_at=_time(msg, "last_skip_at"),
            last_fire_at=_time(msg, "last_fire_at"),
            active_jobs=tuple(msg.active_jobs),
            queued_at=_time(msg, "queued_at"),
            spread=_delta(msg.spread),
            revision=msg.revision,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleRevision:
    """One revision of a schedule: who changed it (``actor``, a token's name or "anonymous"),
    when, how (``change``: create, update, pause, resume, delete, rollback) and why, and the
    schedule as it was right after."""

    schedule_id: str
    revision: int
    change: str
    actor: str
    at: datetime | None
    reason: str
    rolled_back_to: int
    schedule: Schedule

    @classmethod
    def from_pb(cls, msg: pb.ScheduleRevision) -> ScheduleRevision:
        return cls(
            schedule_id=msg.schedule_id,
            revision=msg.revision,
            change=msg.change,
            actor=msg.actor,
            at=_time(msg, "at"),
            reason=msg.reason,
            rolled_back_to=msg.rolled_back_to,
            schedule=Schedule.from_pb(msg.schedule),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class FireTime:
    """One time a cron expression fires: in UTC, in the schedule's zone (an aware datetime with
    that zone's offset then), and what daylight saving did to it, if anything."""

    utc: datetime
    local: datetime
    note: str
    runs_at: datetime | None = None
    """When the occurrence of this time runs, with a spread (never before ``utc``)."""
    runs_at_local: datetime | None = None

    @classmethod
    def from_pb(cls, msg: pb.FireTime) -> FireTime:
        return cls(
            utc=_required_time(msg, "utc"),
            local=datetime.fromisoformat(msg.local),
            note=msg.note,
            runs_at=_time(msg, "runs_at"),
            runs_at_local=datetime.fromisoformat(msg.runs_at_local) if msg.runs_at_local else None,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class TypePolicy:
    """A job type's policy as the cluster applies it: attempts (0: the server's default), the
    backoff after the first failure and its cap (None: the server's), and how many may run at
    once across the cluster (0: no limit)."""

    job_type: str
    max_attempts: int
    backoff: timedelta | None
    max_backoff: timedelta | None
    concurrency: int

    @classmethod
    def from_pb(cls, msg: pb.TypePolicy) -> TypePolicy:
        has_retry = msg.HasField("retry_base")
        return cls(
            job_type=msg.type,
            max_attempts=msg.max_attempts,
            backoff=_delta(msg.retry_base) if has_retry else None,
            max_backoff=_delta(msg.retry_max) if has_retry else None,
            concurrency=msg.concurrency,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeInfo:
    """A job type as the node asked applies it: its policy (None: the server's defaults), its
    cluster-wide ``rate`` in jobs started per second (0: no limit) with its ``burst``, whether
    it is ``paused``; and on that node, how many due jobs wait for a claim (``ready``), why
    they are held (``"paused"``, ``"rate"`` or "") and how long the oldest has been due."""

    job_type: str
    policy: TypePolicy | None
    rate: float
    burst: int
    paused: bool
    ready: int
    held: str
    oldest_due_for: timedelta

    @classmethod
    def from_pb(cls, msg: pb.TypeInfo) -> TypeInfo:
        return cls(
            job_type=msg.type,
            policy=TypePolicy.from_pb(msg.policy) if msg.HasField("policy") else None,
            rate=msg.rate,
            burst=msg.burst,
            paused=msg.paused,
            ready=msg.ready,
            held=msg.held,
            oldest_due_for=timedelta(milliseconds=msg.oldest_age_ms),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerEntry:
    """One decision of the occurrence ledger: for the occurrence at ``nominal`` (or, with
    ``count`` > 1, every occurrence from ``nominal`` to ``last``), what was decided
    (``reason``: created, caught_up, queued, skipped_overlap, missed_skipped, paused,
    skipped_dst_gap, skipped_dst_fold), its job
    if one was made, who decided it and why in words (``notes``)."""

    schedule_id: str
    nominal: datetime
    last: datetime | None
    count: int
    reason: str
    job_id: str
    run_at: datetime | None
    revision: int
    node: str
    epoch: int
    decided_at: datetime
    notes: tuple[str, ...]

    @classmethod
    def from_pb(cls, msg: pb.LedgerEntry) -> LedgerEntry:
        return cls(
            schedule_id=msg.schedule_id,
            nominal=_required_time(msg, "nominal"),
            last=_time(msg, "last"),
            count=msg.count,
            reason=msg.reason,
            job_id=msg.job_id,
            run_at=_time(msg, "run_at"),
            revision=msg.revision,
            node=msg.node,
            epoch=msg.epoch,
            decided_at=_required_time(msg, "decided_at"),
            notes=tuple(msg.notes),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    """Why an occurrence ran or did not (``Client.explain``): ``steps`` says it in words;
    ``entry`` is the ledger's decision (None if none is recorded), ``job`` the occurrence's job
    as stored now; for a time that is no occurrence (``found`` False), ``nearest`` ones."""

    schedule_id: str
    nominal: datetime | None
    nominal_local: str
    timezone: str
    found: bool
    entry: LedgerEntry | None
    job: Job | None
    steps: tuple[str, ...]
    nearest: tuple[datetime, ...]
    recent: tuple[LedgerEntry, ...]

    @classmethod
    def from_pb(cls, msg: pb.ExplainOccurrenceResponse) -> Explanation:
        return cls(
            schedule_id=msg.schedule_id,
            nominal=_time(msg, "nominal"),
            nominal_local=msg.nominal_local,
            timezone=msg.timezone,
            found=msg.found,
            entry=LedgerEntry.from_pb(msg.entry) if msg.HasField("entry") else None,
            job=Job.from_pb(msg.job) if msg.HasField("job") else None,
            steps=tuple(msg.steps),
            nearest=tuple(to_datetime(ts_ms(t)) for t in msg.nearest),
            recent=tuple(LedgerEntry.from_pb(e) for e in msg.recent),
        )
