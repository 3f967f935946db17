"""Value objects. Each validates itself at construction: a Job that exists is a valid job."""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

from timeshard.errors import InvalidArgument
from timeshard.limits import (
    MAX_CATCHUP,
    MAX_CONCURRENT_RUNS,
    MAX_JOB_ID_CHARS,
    MAX_JOB_TYPE_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_PRIORITY,
    MAX_REASON_BYTES,
    MAX_RESULT_BYTES,
    MAX_SCHEDULE_ID_CHARS,
    MAX_SPREAD_MS,
    MAX_WORKER_ID_BYTES,
    MIN_MISFIRE_GRACE_MS,
    check_bytes,
    check_range,
    shown,
)

_TYPE_RE = re.compile(rf"^[A-Za-z0-9_.:\-/]{{1,{MAX_JOB_TYPE_CHARS}}}$")
_ID_RE = re.compile(rf"^[A-Za-z0-9_.:@\-]{{1,{MAX_JOB_ID_CHARS}}}$")


class JobState(enum.StrEnum):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    """Not started by its deadline, so never run (``last_error`` says why)."""

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset((JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED, JobState.EXPIRED))


_VALID_TYPES: set[str] = set()
"""Job types found valid: a node sees a few types over and over (every job is checked twice)."""
_VALID_TYPES_MAX = 4096


def validate_job_type(job_type: str) -> str:
    if job_type in _VALID_TYPES:
        return job_type
    if not job_type:
        raise InvalidArgument("type", "a job type is required (e.g. demo.echo)")
    if not _TYPE_RE.fullmatch(job_type):
        raise InvalidArgument(
            "type",
            f"{shown(job_type)} is not a job type: "
            f"use 1-{MAX_JOB_TYPE_CHARS} of A-Z a-z 0-9 _ . : - /",
        )
    if len(_VALID_TYPES) < _VALID_TYPES_MAX:
        _VALID_TYPES.add(job_type)
    return job_type


def validate_job_id(job_id: str) -> str:
    if not job_id or not _ID_RE.fullmatch(job_id):
        raise InvalidArgument(
            "job_id",
            f"{shown(job_id)} is not a job id: use 1-{MAX_JOB_ID_CHARS} of A-Z a-z 0-9 _ . : @ -",
        )
    return job_id


def validate_worker_id(worker_id: str) -> str:
    if not worker_id:
        raise InvalidArgument("worker_id", "a worker id is required")
    return check_bytes("worker_id", worker_id, MAX_WORKER_ID_BYTES)


def validate_payload(payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            "payload", f"{len(payload)} bytes is over the limit of {MAX_PAYLOAD_BYTES} bytes"
        )
    return payload


def parse_json_payload(text: str) -> bytes:
    """A payload given as JSON text, checked and stored as UTF-8 bytes."""
    try:
        json.loads(text)
    except ValueError as exc:
        raise InvalidArgument("payload", f"not valid JSON: {exc}") from exc
    return validate_payload(text.encode("utf-8"))


def validate_priority(priority: int) -> int:
    if not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument(
            "priority", f"must be 0-{MAX_PRIORITY} (higher goes first), got {priority}"
        )
    return priority


def validate_deadline(deadline: int, run_at: int) -> int:
    """A requested deadline (epoch ms, 0: none) no earlier than the job's ``run_at``: a job
    that may not start before it is due nor after its deadline could never run. (Checked
    where a client asks, not on every ``Job``: a retry may fall after the deadline, and the
    job then expires.)"""
    if deadline < 0:
        raise InvalidArgument("deadline", "must be after 1970-01-01")
    if deadline and deadline < run_at:
        raise InvalidArgument(
            "deadline",
            f"{deadline} is before the job's run_at {run_at}: it could never start; "
            "give a later deadline or an earlier run_at",
        )
    return deadline


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """One run of a job, kept in its history."""

    attempt: int
    worker: str
    started_at: int
    finished_at: int | None = None
    error: str = ""
    outcome: str = ""
    traceback: str = ""
    """A failed attempt's traceback as its worker sent it (bounded, the end kept)."""


RESULT_JSON = "json"
"""A result that is JSON text (UTF-8): what a handler returned, serialised."""
RESULT_BYTES = "bytes"
"""A result that is bytes as the handler returned them."""
RESULT_ENCODINGS = ("", RESULT_JSON, RESULT_BYTES)
"""How a job's ``result`` is to be read; "" when there is none."""


def validate_result(result: bytes, encoding: str) -> None:
    if len(result) > MAX_RESULT_BYTES:
        raise InvalidArgument(
            "result", f"{len(result)} bytes is over the limit of {MAX_RESULT_BYTES} bytes"
        )
    if encoding not in RESULT_ENCODINGS:
        raise InvalidArgument(
            "result_encoding", f"{shown(encoding)}: use one of {list(RESULT_ENCODINGS[1:])}"
        )
    if result and not encoding:
        raise InvalidArgument("result_encoding", "a result needs its encoding (json or bytes)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    job_id: str
    shard: int
    job_type: str
    payload: bytes = b""
    state: JobState = JobState.SCHEDULED
    run_at: int
    created_at: int
    attempt: int = 0
    max_attempts: int = 3
    fence: int = 0
    lease_owner: str = ""
    lease_until: int = 0
    started_at: int = 0
    finished_at: int = 0
    idempotency_key: str = ""
    last_error: str = ""
    history: tuple[Attempt, ...] = field(default=())
    result: bytes = b""
    """What the handler returned, once the job succeeded (see ``result_encoding``)."""
    result_encoding: str = ""
    """``json``, ``bytes``, or "" (no result)."""
    deadline: int = 0
    """No attempt starts after this time (epoch ms; 0: no deadline). A job still waiting at
    its deadline ends ``expired`` instead."""
    priority: int = 0
    """0 (the default, lowest) to ``MAX_PRIORITY``: higher goes first within its type, with
    aging (``limits.DEFAULT_PRIORITY_AGING_MS``)."""
    unstarted: int = 0
    """Deliveries that ended without a handler start (given back unstarted, or a lease over
    with no start notice): never attempts; at the type's ``max_unstarted`` the job is dead."""
    start_noticed: bool = False
    """The running attempt's handler started, as its worker's start notice said: an expired
    lease then counts as a failed attempt (invariant 9)."""

    def __post_init__(self) -> None:
        validate_job_id(self.job_id)
        validate_job_type(self.job_type)
        validate_payload(self.payload)
        validate_result(self.result, self.result_encoding)
        if self.shard < 0:
            raise InvalidArgument("shard", f"{self.shard} is negative")
        if self.max_attempts < 1:
            raise InvalidArgument("max_attempts", f"must be at least 1, got {self.max_attempts}")
        if self.run_at < 0:
            raise InvalidArgument("run_at", "must be after 1970-01-01")
        if self.deadline < 0:
            raise InvalidArgument("deadline", "must be after 1970-01-01")
        validate_priority(self.priority)

    def past_deadline(self, now: int) -> bool:
        """Whether an attempt starting at ``now`` would start after the job's deadline."""
        return 0 < self.deadline < now

    def next_attention(self) -> int | None:
        """When the dispatcher must next look at this job (invariant 2), or None if terminal."""
        if self.state is JobState.SCHEDULED:
            return self.run_at
        if self.state is JobState.RUNNING:
            return self.lease_until
        return None

    def with_(self, **changes: object) -> Job:
        keys = changes.keys()
        if keys <= _UNCHECKED_JOB_FIELDS:
            return _copy_job(self, changes)  # nothing __post_init__ checks changes
        if keys <= _RESULT_CHANGE_FIELDS:  # a result stored: __post_init__'s one check of it
            result = changes.get("result", self.result)
            encoding = changes.get("result_encoding", self.result_encoding)
            validate_result(result, encoding)  # type: ignore[arg-type]
            return _copy_job(self, changes)
        return replace(self, **changes)  # type: ignore[arg-type]

    def body_digest(self) -> str:
        """What a client idempotency key is checked against: the same key with another body
        is a conflict."""
        h = hashlib.sha256()
        h.update(self.job_type.encode())
        h.update(b"\0")
        h.update(self.payload)
        h.update(b"\0")
        h.update(str(self.max_attempts).encode())
        if self.priority:  # (the digests of jobs without one are unchanged)
            h.update(f"\0priority={self.priority}".encode())
        return h.hexdigest()


_JOB_FIELDS = tuple(f.name for f in fields(Job))
_JOB_GET = tuple(getattr(Job, name).__get__ for name in _JOB_FIELDS)
_JOB_SET = tuple(getattr(Job, name).__set__ for name in _JOB_FIELDS)
_UNCHECKED_JOB_FIELDS = frozenset(_JOB_FIELDS) - {
    "job_id",
    "job_type",
    "payload",
    "shard",
    "max_attempts",
    "run_at",
    "result",
    "result_encoding",
    "deadline",
    "priority",
}


_RESULT_CHANGE_FIELDS = _UNCHECKED_JOB_FIELDS | {"result", "result_encoding"}
"""Changes that ``__post_init__`` checks with ``validate_result`` alone (a job's result)."""


def _copy_job(job: Job, changes: dict[str, object]) -> Job:
    new = object.__new__(Job)
    for name, get, put in zip(_JOB_FIELDS, _JOB_GET, _JOB_SET, strict=True):
        put(new, changes[name] if name in changes else get(job))
    return new


def restore_job(values: Sequence[object]) -> Job:
    """A Job from its field values in declaration order, as a store wrote them. Not checked
    again: a store writes only Jobs, each checked when it was made, so checking every row it
    reads back would only cost time (each fired job is read a few times)."""
    if len(values) != len(_JOB_SET):
        raise ValueError(f"a Job has {len(_JOB_SET)} fields, got {len(values)} values")
    job = object.__new__(Job)
    for put, value in zip(_JOB_SET, values, strict=False):  # the length is checked above
        put(job, value)
    return job


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class BucketEntry:
    """ "Look at job ``job_id`` at ``due_at``": one row of bucket partition (shard, minute)."""

    shard: int
    minute: int
    due_at: int
    job_id: str
    home: int | None = field(default=None, compare=False)
    """Where the job's row lives, when the store keeps rows in minute partitions (Cassandra):
    lets the dispatcher read the row without looking the job up. Not part of the identity."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardState:
    shard: int
    epoch: int = 0
    owner: str = ""
    cursor: int = 0  # the oldest minute bucket not yet fully handled


@dataclass(frozen=True, kw_only=True, slots=True)
class WriteResult:
    """What a conditional write did: ``applied`` and the job row as it now stands (after the
    write if applied, as found if not; None if the job does not exist)."""

    applied: bool
    job: Job | None


LEASE_EXPIRED = "lease expired"
"""The error and the outcome of an attempt whose lease ran out without a result: a failed
attempt like any retryable failure (retried after the backoff, dead at ``max_attempts``)."""

GIVEN_BACK = "given back"
"""The outcome of an attempt its worker gave back unfinished (it was shutting down): not a
failure, so it does not count against ``max_attempts``."""

NOT_STARTED = "not started"
"""The outcome of a delivery whose handler never started (invariant 9): given back unstarted by
its worker, or a lease that ran out with no start notice. Not an attempt; counted in
``Job.unstarted`` against the type's ``max_unstarted``."""

RESCHEDULED = "rescheduled"
"""The outcome of a lease claimed ahead whose job was rescheduled before it was due
(``Jobs.reschedule``): not an attempt unless its handler had started, and not a delivery
``max_unstarted`` counts either (the move was the client's, not the worker's)."""

NEVER_STARTED = "never started"
"""How the last error of a job dead after ``max_unstarted`` deliveries without a start begins."""

SCHEDULE_ENTRY_PREFIX = "schedule:"
"""Bucket entries whose id starts with this look at a schedule, not a job."""
_SCHEDULE_ID_RE = re.compile(rf"^[A-Za-z0-9_.\-]{{1,{MAX_SCHEDULE_ID_CHARS}}}$")


def spread_offset_of(schedule_id: str, spread_ms: int) -> int:
    """A stable offset in ``[0, spread_ms)`` from the schedule id: uniform over the window
    for many schedules, the same every time for one. (Not CRC-32, which places the schedule
    on its shard: schedules of one shard would then share offsets.)"""
    if spread_ms <= 0:
        return 0
    digest = hashlib.blake2b(schedule_id.encode(), digest_size=8, person=b"ts-spread").digest()
    return int.from_bytes(digest, "big") % spread_ms


class MisfirePolicy(enum.StrEnum):
    SKIP = "skip"  # drop missed runs, go on from the next future time
    ONCE = "once"  # one catch-up now, for the latest missed time
    ALL = "all"  # every missed run, up to max_catchup (the most recent ones)


class OverlapPolicy(enum.StrEnum):
    SKIP = "skip"  # the previous run is still going: skip this one (recorded)
    QUEUE = "queue"  # at most one waits for the previous to finish
    ALLOW = "allow"  # up to max_concurrent at once


def validate_schedule_id(schedule_id: str) -> str:
    if not _SCHEDULE_ID_RE.fullmatch(schedule_id):
        raise InvalidArgument(
            "schedule_id",
            f"{shown(schedule_id)}: use 1-{MAX_SCHEDULE_ID_CHARS} of A-Z a-z 0-9 _ . -",
        )
    return schedule_id


def _policy(kind: type[enum.StrEnum], field_name: str, value: str) -> None:
    allowed = [p.value for p in kind]
    if value not in allowed:
        raise InvalidArgument(field_name, f"unknown policy {shown(value)}; use one of {allowed}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A cron schedule: its spec, the job template of each occurrence, its policies, and where
    it stands (``next_fire``; ``version`` moves with every conditional update)."""

    schedule_id: str
    shard: int
    cron: str
    timezone: str
    dst_gap: str = ""
    dst_fold: str = ""
    job_type: str
    payload: bytes = b""
    max_attempts: int = 0
    misfire: MisfirePolicy = MisfirePolicy.ONCE
    misfire_grace_ms: int = 60_000
    max_catchup: int = 10
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    max_concurrent: int = 1
    jitter_ms: int = 0
    paused: bool = False
    next_fire: int
    created_at: int
    version: int = 0
    revision: int = 0
    """The user's revision of the schedule: 1 at create, one more with each update, pause,
    resume and delete (``version`` also moves with every fire); 0 before revisions were kept."""
    active: tuple[str, ...] = ()
    """Occurrence jobs created and maybe not finished (checked at each fire)."""
    queued_at: int = 0
    """Scheduled time of the occurrence waiting for the previous one (overlap=queue), or 0."""
    skipped: int = 0
    last_skip_at: int = 0
    last_fire_at: int = 0
    spread_ms: int = 0
    """Each occurrence runs ``spread_offset`` after its nominal time: a stable offset in
    ``[0, spread_ms)`` derived from the schedule id (0: none)."""

    def __post_init__(self) -> None:
        validate_schedule_id(self.schedule_id)
        validate_job_type(self.job_type)
        validate_payload(self.payload)
        _policy(MisfirePolicy, "misfire", self.misfire)
        _policy(OverlapPolicy, "overlap", self.overlap)
        if self.misfire_grace_ms < MIN_MISFIRE_GRACE_MS:
            raise InvalidArgument(
                "misfire_grace",
                f"must be at least {MIN_MISFIRE_GRACE_MS / 1000:g}s, got "
                f"{self.misfire_grace_ms / 1000:g}s: a run that starts within the grace of its "
                "time is on time, and starting one always takes a moment, so a smaller grace "
                "would count every run as missed",
            )
        check_range("max_catchup", self.max_catchup, 1, MAX_CATCHUP)
        check_range("max_concurrent", self.max_concurrent, 1, MAX_CONCURRENT_RUNS)
        if self.jitter_ms < 0:
            raise InvalidArgument("jitter", "must not be negative")
        if not 0 <= self.spread_ms <= MAX_SPREAD_MS:
            raise InvalidArgument(
                "spread", f"must be 0-{MAX_SPREAD_MS // 3_600_000}h, got {self.spread_ms} ms"
            )
        if self.max_attempts < 0:
            raise InvalidArgument("max_attempts", "must not be negative")

    @property
    def entry_id(self) -> str:
        return SCHEDULE_ENTRY_PREFIX + self.schedule_id

    @property
    def spread_offset(self) -> int:
        """How far after its nominal time each occurrence runs: the same for every
        occurrence of this schedule, on every node, never negative (``spread_offset_of``)."""
        return spread_offset_of(self.schedule_id, self.spread_ms)

    def occurrence_id(self, scheduled_ms: int) -> str:
        """The job id of the run at ``scheduled_ms``: unique across the cluster (invariant 8)."""
        return f"{self.schedule_id}@{scheduled_ms}"

    def with_(self, **changes: object) -> Schedule:
        return replace(self, **changes)  # type: ignore[arg-type]


class ChangeKind(enum.StrEnum):
    """What a person did to a schedule: each makes a revision."""

    CREATE = "create"
    UPDATE = "update"
    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"
    ROLLBACK = "rollback"


ANONYMOUS = "anonymous"
"""The actor of a change made without a token (a node without an auth file)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """Who changed a schedule, when, how and why: written with the change, as one revision."""

    kind: ChangeKind
    actor: str = ANONYMOUS
    at_ms: int
    reason: str = ""
    rolled_back_to: int = 0
    """For a rollback: the revision whose definition it restored."""

    def __post_init__(self) -> None:
        check_bytes("reason", self.reason, MAX_REASON_BYTES)
        if not self.actor:
            raise InvalidArgument("actor", "a change needs its actor (anonymous without a token)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleRevision:
    """Revision ``revision`` of a schedule: the change that made it, and the schedule as it was
    right after (for a delete: as it was when deleted)."""

    revision: int
    change: Change
    schedule: Schedule


DEFINITION_FIELDS = (
    "cron",
    "timezone",
    "dst_gap",
    "dst_fold",
    "job_type",
    "payload",
    "max_attempts",
    "misfire",
    "misfire_grace_ms",
    "max_catchup",
    "overlap",
    "max_concurrent",
    "jitter_ms",
    "spread_ms",
)
"""What a person defines about a schedule (an update sets them, a rollback restores them): the
spec, zone, DST rules, job template and policies. Not ``paused`` (pause and resume set it) nor
the bookkeeping of its runs."""
