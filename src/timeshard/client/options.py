"""What the client's methods take, declared once: a job's options (``JobOptions``, and
``NewJob``, a job with its options), what a listing narrows by (``JobFilters``), a cron
schedule as declared (``ScheduleSpec``) and a job type's retry policy (``Retry``); each a
frozen value that writes itself into the request the server reads.

The seven options of a job are the fields of ``JobOptions``. ``Client.schedule``,
``AsyncClient.schedule``, ``ProtoClient.schedule`` and a task's ``schedule`` take them as
keyword arguments (typed by ``JobOptionArgs``, the same names) and make a ``NewJob`` of them;
``schedule_many`` takes ``NewJob``s. Their words are the SDK's; docs/architecture.md ("Words")
says which field of the wire each one sets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from timeshard.client.records import Schedule
from timeshard.clock import from_datetime
from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_ATTEMPTS, check_range
from timeshard.model import JobState, MisfirePolicy, OverlapPolicy
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, state_to_pb, ts

Delay = timedelta | float | int
"""A delay: a ``timedelta`` or seconds."""


def payload_bytes(payload: Any) -> bytes:
    """A payload as sent: bytes as they are, anything else as compact JSON (None: ``{}``)."""
    if isinstance(payload, bytes):
        return payload
    try:
        return json.dumps({} if payload is None else payload, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("payload", f"not JSON-serialisable: {exc}") from None


def seconds_of(delay: Delay, field: str) -> float:
    """A ``Delay`` in seconds; anything else is ``InvalidArgument`` naming ``field``."""
    if isinstance(delay, timedelta):
        return delay.total_seconds()
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise InvalidArgument(field, f"give a timedelta or seconds, not {type(delay).__name__}")
    return float(delay)


def ms_of(at: datetime, field: str) -> int:
    """An aware datetime in epoch milliseconds; a naive one is ``InvalidArgument``."""
    if not isinstance(at, datetime):
        raise InvalidArgument(field, f"give an aware datetime, not {type(at).__name__}")
    try:
        return from_datetime(at)
    except ValueError:
        raise InvalidArgument(
            field, "a naive datetime: give its time zone, e.g. datetime(..., tzinfo=UTC)"
        ) from None


def _exact(seconds: float, into: Any) -> None:
    """Write ``seconds`` into the Duration ``into`` to the nanosecond. A negative one is sent
    as it is: the server, the one place that decides, answers INVALID_ARGUMENT."""
    whole = int(seconds) if seconds >= 0 else -int(-seconds)
    into.seconds, into.nanos = whole, round((seconds - whole) * 1e9)


def set_when(
    req: pb.ScheduleJobRequest | pb.RescheduleJobRequest, delay: Delay | None, at: datetime | None
) -> None:
    """Set the request's ``delay`` or ``run_at`` (now when neither is given)."""
    if delay is not None and at is not None:
        raise InvalidArgument("at", "give a delay or an at time, not both")
    if at is not None:
        req.run_at.CopyFrom(ts(ms_of(at, "at")))
        return
    seconds = seconds_of(delay, "delay") if delay is not None else 0.0
    if seconds < 0:
        _exact(seconds, req.delay)
    else:
        req.delay.CopyFrom(dur(round(seconds * 1000)))


IF_EXISTS = {"check": pb.IF_EXISTS_CHECK, "return": pb.IF_EXISTS_RETURN}
"""``if_exists=``: what a request whose key already names a job gets (``JobOptions.if_exists``)."""


def if_exists_pb(value: str) -> pb.IfExists:
    if value not in IF_EXISTS:
        raise InvalidArgument("if_exists", f"give 'check' or 'return', not {value!r}")
    return IF_EXISTS[value]


class JobOptionArgs(TypedDict, total=False):
    """``JobOptions`` as keyword arguments (the type of ``**options`` where a method takes
    them): the same names and types, no other (a test holds the two together)."""

    delay: Delay | None
    at: datetime | None
    key: str
    max_attempts: int
    deadline: datetime | None
    deadline_in: Delay | None
    priority: int
    if_exists: str


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOptions:
    """How one job is scheduled: due after ``delay`` (a timedelta or seconds; default now) or
    ``at`` (an aware datetime); ``key``, its idempotency key (a repeat returns the job the key
    names); ``max_attempts`` (0: the type's default); not started after ``deadline`` (an aware
    datetime) or ``deadline_in`` (after it is due), else it ends expired; ``priority`` 0-9,
    higher first within its type; ``if_exists``, what a ``key`` that already names a job gets
    (below). A negative delay or deadline_in is left for the server to refuse, as every range
    is: the client checks only what it must to build the request."""

    delay: Delay | None = None
    at: datetime | None = None
    key: str = ""
    max_attempts: int = 0
    deadline: datetime | None = None
    deadline_in: Delay | None = None
    priority: int = 0
    if_exists: str = "check"
    """With a ``key`` that already names a job: ``"check"`` gets that job if this asks for the
    same (type, payload, max_attempts, priority, time), else ``AlreadyExists``; ``"return"``
    gets it whatever this asks for."""

    def __post_init__(self) -> None:
        if self.delay is not None and self.at is not None:
            raise InvalidArgument("at", "give a delay or an at time, not both")
        if self.deadline is not None and self.deadline_in is not None:
            raise InvalidArgument("deadline", "give a deadline or a deadline_in, not both")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise InvalidArgument("priority", f"give an int 0-9, not {self.priority!r}")
        if_exists_pb(self.if_exists)
        for field, delay in (("delay", self.delay), ("deadline_in", self.deadline_in)):
            if delay is not None:
                seconds_of(delay, field)
        for field, at in (("at", self.at), ("deadline", self.deadline)):
            if at is not None:
                ms_of(at, field)

    def write(self, req: pb.ScheduleJobRequest) -> None:
        """Set these options on ``req``."""
        req.idempotency_key = self.key
        req.max_attempts = self.max_attempts
        req.priority = self.priority
        req.if_exists = if_exists_pb(self.if_exists)
        set_when(req, self.delay, self.at)
        if self.deadline is not None:
            req.deadline.CopyFrom(ts(ms_of(self.deadline, "deadline")))
        elif self.deadline_in is not None:
            _exact(seconds_of(self.deadline_in, "deadline_in"), req.deadline_in)


@dataclass(frozen=True, kw_only=True, slots=True)
class NewJob(JobOptions):
    """One job to schedule: its type, its payload (bytes as they are, anything else as JSON)
    and its options (``JobOptions``)."""

    job_type: str
    payload: Any = None

    def request(self) -> pb.ScheduleJobRequest:
        req = pb.ScheduleJobRequest(type=self.job_type, payload=payload_bytes(self.payload))
        self.write(req)
        return req


JOB_ORDERS = {"due": pb.JOB_ORDER_DUE, "created": pb.JOB_ORDER_CREATED, "id": pb.JOB_ORDER_ID}


@dataclass(frozen=True, kw_only=True, slots=True)
class JobFilters:
    """What ``list_jobs`` narrows by besides one state and the type (each given must match):
    ``states`` (any of them), due from ``due_from`` and before ``due_to`` (aware datetimes),
    exactly ``key`` or a key starting with ``key_prefix``, the runs of the cron schedule
    ``schedule_id``; listed by ``order``: "due" (run_at, the default), "created" or "id"."""

    states: Sequence[JobState | str] = ()
    due_from: datetime | None = None
    due_to: datetime | None = None
    key: str = ""
    key_prefix: str = ""
    schedule_id: str = ""
    order: str = "due"

    def apply(self, req: pb.ListJobsRequest) -> None:
        if self.order not in JOB_ORDERS:
            raise InvalidArgument("order", f"{self.order!r}: use one of {list(JOB_ORDERS)}")
        req.states.extend(state_pb(s) for s in self.states)
        if self.due_from is not None:
            req.run_at_from.CopyFrom(ts(ms_of(self.due_from, "due_from")))
        if self.due_to is not None:
            req.run_at_to.CopyFrom(ts(ms_of(self.due_to, "due_to")))
        req.idempotency_key = self.key
        req.idempotency_key_prefix = self.key_prefix
        req.schedule_id = self.schedule_id
        req.order = JOB_ORDERS[self.order]


def state_pb(state: JobState | str | None) -> pb.JobState:
    """A job state (an enum or its value; None: any) as the wire says it."""
    try:
        return state_to_pb(JobState(state)) if state else pb.JOB_STATE_UNSPECIFIED
    except ValueError:
        raise InvalidArgument(
            "state", f"{state!r} is not a job state; use one of {[s.value for s in JobState]}"
        ) from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    """A job type's retry policy: at most ``max_attempts`` attempts (0: the server's default),
    a failed one retried after exponential backoff with full jitter, ``backoff *
    2^(attempt-1)`` capped at ``max_backoff``."""

    max_attempts: int = 0
    backoff: Delay = timedelta(seconds=1)
    max_backoff: Delay = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if self.max_attempts:
            check_range("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS)
        base = seconds_of(self.backoff, "backoff")
        ceiling = seconds_of(self.max_backoff, "max_backoff")
        if not 0 < base <= ceiling:
            raise InvalidArgument(
                "retry", f"need 0 < backoff <= max_backoff, got {base:g}s and {ceiling:g}s"
            )

    def message(self, job_type: str, concurrency: int) -> pb.TypePolicy:
        return pb.TypePolicy(
            type=job_type,
            max_attempts=self.max_attempts,
            retry_base=dur(round(seconds_of(self.backoff, "backoff") * 1000)),
            retry_max=dur(round(seconds_of(self.max_backoff, "max_backoff") * 1000)),
            concurrency=concurrency,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleSpec:
    """A cron schedule as declared: what ``create_schedule``, ``update_schedule`` and
    ``put_schedule`` send. ``misfire``: skip | once | all; ``overlap``: skip | queue | allow."""

    job_type: str
    cron: str
    tz: str = "UTC"
    schedule_id: str = ""
    payload: Any = None
    misfire: MisfirePolicy | str = MisfirePolicy.ONCE
    misfire_grace: Delay = timedelta(minutes=1)
    max_catchup: int = 10
    overlap: OverlapPolicy | str = OverlapPolicy.SKIP
    max_concurrent: int = 1
    jitter: Delay = 0
    dst_gap: str = ""
    dst_fold: str = ""
    max_attempts: int = 0
    spread: Delay = 0
    """Each occurrence runs a stable offset in ``[0, spread)`` after its nominal time."""

    def message(self) -> pb.Schedule:
        return pb.Schedule(
            schedule_id=self.schedule_id,
            cron=self.cron,
            timezone=self.tz,
            type=self.job_type,
            payload=payload_bytes(self.payload),
            misfire=str(self.misfire),
            misfire_grace=dur(round(seconds_of(self.misfire_grace, "misfire_grace") * 1000)),
            max_catchup=self.max_catchup,
            overlap=str(self.overlap),
            max_concurrent=self.max_concurrent,
            jitter=dur(round(seconds_of(self.jitter, "jitter") * 1000)),
            dst_gap=self.dst_gap,
            dst_fold=self.dst_fold,
            max_attempts=self.max_attempts,
            spread=dur(round(seconds_of(self.spread, "spread") * 1000)),
        )

    def differs_from(self, s: Schedule) -> bool:
        """Whether the stored schedule ``s`` says something else than this declaration (its
        bookkeeping, and whether it is paused, are not part of a declaration)."""
        return _declared(Schedule.from_pb(self.message())) != _declared(s)


def _declared(s: Schedule) -> tuple[Any, ...]:
    return (
        s.cron,
        s.timezone,
        s.job_type,
        s.raw_payload,
        s.misfire,
        s.misfire_grace,
        s.max_catchup,
        s.overlap,
        s.max_concurrent,
        s.jitter,
        s.dst_gap,
        s.dst_fold,
        s.max_attempts,
        s.spread,
    )


def schedule_spec(
    job_type: str, cron: str, tz: str, schedule_id: str, payload: Any, options: dict[str, Any]
) -> ScheduleSpec:
    """A ``ScheduleSpec`` of a method's arguments; an option that does not exist is
    ``InvalidArgument``."""
    try:
        return ScheduleSpec(
            job_type=job_type,
            cron=cron,
            tz=tz,
            schedule_id=schedule_id,
            payload=payload,
            **options,
        )
    except TypeError as exc:
        raise InvalidArgument("schedule", str(exc)) from None
