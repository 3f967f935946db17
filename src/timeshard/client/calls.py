"""The client's methods, each written once: the request it sends and how its reply is read
(``Call``), or a few such steps (``Steps``: ``put_schedule``, ``schedule_many``); and what
they take (``NewJob``, ``ScheduleSpec``, ``Retry``). ``timeshard.client.core`` carries them over
a blocking or an asyncio channel."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from timeshard.client.records import (
    DeadLetter,
    FireTime,
    Job,
    Schedule,
    Scheduled,
    TypeInfo,
    TypePolicy,
)
from timeshard.clock import from_datetime
from timeshard.errors import AlreadyExists, InvalidArgument, NotFound
from timeshard.limits import MAX_ATTEMPTS, MAX_BATCH, check_range
from timeshard.model import JobState, MisfirePolicy, OverlapPolicy
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, state_to_pb, ts

R = TypeVar("R")
Delay = timedelta | float | int
"""A delay: a ``timedelta`` or seconds."""


def payload_bytes(payload: Any) -> bytes:
    """A payload as sent: bytes as they are, anything else as compact JSON."""
    if isinstance(payload, bytes):
        return payload
    try:
        return json.dumps({} if payload is None else payload, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("payload", f"not JSON-serialisable: {exc}") from None


def _seconds(delay: Delay, field: str) -> float:
    if isinstance(delay, timedelta):
        return delay.total_seconds()
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise InvalidArgument(field, f"give a timedelta or seconds, not {type(delay).__name__}")
    return float(delay)


def _ms(at: datetime, field: str) -> int:
    if not isinstance(at, datetime):
        raise InvalidArgument(field, f"give an aware datetime, not {type(at).__name__}")
    try:
        return from_datetime(at)
    except ValueError:
        raise InvalidArgument(
            field, "a naive datetime: give its time zone, e.g. datetime(..., tzinfo=UTC)"
        ) from None


def _when(
    req: pb.ScheduleJobRequest | pb.RescheduleJobRequest, delay: Delay | None, at: datetime | None
) -> None:
    """Set the request's ``delay`` or ``run_at``: now when neither is given. A negative delay
    is sent as it is: the server, the one place that decides, answers INVALID_ARGUMENT."""
    if delay is not None and at is not None:
        raise InvalidArgument("at", "give a delay or an at time, not both")
    if at is not None:
        req.run_at.CopyFrom(ts(_ms(at, "at")))
        return
    seconds = _seconds(delay, "delay") if delay is not None else 0.0
    if seconds < 0:
        whole = -int(-seconds)
        req.delay.seconds, req.delay.nanos = whole, round((seconds - whole) * 1e9)
    else:
        req.delay.CopyFrom(dur(round(seconds * 1000)))


def _deadline(
    req: pb.ScheduleJobRequest, deadline: datetime | None, deadline_in: Delay | None
) -> None:
    """Set the request's ``deadline`` (an aware datetime) or ``deadline_in`` (after the job's
    run_at); neither: none. A negative ``deadline_in`` is sent as it is (the server refuses)."""
    if deadline is not None and deadline_in is not None:
        raise InvalidArgument("deadline", "give a deadline or a deadline_in, not both")
    if deadline is not None:
        req.deadline.CopyFrom(ts(_ms(deadline, "deadline")))
    elif deadline_in is not None:
        seconds = _seconds(deadline_in, "deadline_in")
        whole = int(seconds) if seconds >= 0 else -int(-seconds)
        req.deadline_in.seconds, req.deadline_in.nanos = whole, round((seconds - whole) * 1e9)


IF_EXISTS = {"check": pb.IF_EXISTS_CHECK, "return": pb.IF_EXISTS_RETURN}
"""``if_exists=``: what a request whose key already names a job gets (``NewJob.if_exists``)."""


def if_exists_pb(value: str) -> pb.IfExists:
    if value not in IF_EXISTS:
        raise InvalidArgument("if_exists", f"give 'check' or 'return', not {value!r}")
    return IF_EXISTS[value]


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
        base = _seconds(self.backoff, "backoff")
        ceiling = _seconds(self.max_backoff, "max_backoff")
        if not 0 < base <= ceiling:
            raise InvalidArgument(
                "retry", f"need 0 < backoff <= max_backoff, got {base:g}s and {ceiling:g}s"
            )

    def message(self, job_type: str, concurrency: int) -> pb.TypePolicy:
        return pb.TypePolicy(
            type=job_type,
            max_attempts=self.max_attempts,
            retry_base=dur(round(_seconds(self.backoff, "backoff") * 1000)),
            retry_max=dur(round(_seconds(self.max_backoff, "max_backoff") * 1000)),
            concurrency=concurrency,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class NewJob:
    """One job for ``schedule_many``: due after ``delay`` (default now) or ``at``; not started
    after ``deadline`` (or ``deadline_in`` after it is due), else it ends expired;
    ``priority`` 0-9, higher first within its type."""

    job_type: str
    payload: Any = None
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

    def request(self) -> pb.ScheduleJobRequest:
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise InvalidArgument("priority", f"give an int 0-9, not {self.priority!r}")
        req = pb.ScheduleJobRequest(
            type=self.job_type,
            payload=payload_bytes(self.payload),
            idempotency_key=self.key,
            max_attempts=self.max_attempts,
            priority=self.priority,
            if_exists=if_exists_pb(self.if_exists),
        )
        _when(req, self.delay, self.at)
        _deadline(req, self.deadline, self.deadline_in)
        return req


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
            misfire_grace=dur(round(_seconds(self.misfire_grace, "misfire_grace") * 1000)),
            max_catchup=self.max_catchup,
            overlap=str(self.overlap),
            max_concurrent=self.max_concurrent,
            jitter=dur(round(_seconds(self.jitter, "jitter") * 1000)),
            dst_gap=self.dst_gap,
            dst_fold=self.dst_fold,
            max_attempts=self.max_attempts,
            spread=dur(round(_seconds(self.spread, "spread") * 1000)),
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
        req.states.extend(_state_pb(s) for s in self.states)
        if self.due_from is not None:
            req.run_at_from.CopyFrom(ts(_ms(self.due_from, "due_from")))
        if self.due_to is not None:
            req.run_at_to.CopyFrom(ts(_ms(self.due_to, "due_to")))
        req.idempotency_key = self.key
        req.idempotency_key_prefix = self.key_prefix
        req.schedule_id = self.schedule_id
        req.order = JOB_ORDERS[self.order]


def _state_pb(state: JobState | str | None) -> pb.JobState:
    try:
        return state_to_pb(JobState(state)) if state else pb.JOB_STATE_UNSPECIFIED
    except ValueError:
        raise InvalidArgument(
            "state", f"{state!r} is not a job state; use one of {[s.value for s in JobState]}"
        ) from None


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """One JobService call: the method, its request, whether a blind repeat is safe, and how
    the reply is read."""

    method: str
    request: Message
    read: Callable[[Any], R]
    idempotent: bool = True
    admin: bool = False
    """An AdminService call (else JobService)."""


Steps = Generator[Call[Any], Any, R]
"""A method of several calls: it yields each call and is sent its result (or thrown its
error), and returns the method's value."""


def page_call(
    method: str, request: Any, read: Callable[[Any], Sequence[R]], token: str
) -> Call[tuple[Sequence[R], str]]:
    request.page_token = token
    return Call(method, request, lambda resp: (read(resp), resp.next_page_token))


def schedule_spec(
    job_type: str, cron: str, tz: str, schedule_id: str, payload: Any, options: dict[str, Any]
) -> ScheduleSpec:
    try:
        return ScheduleSpec(
            job_type=job_type,
            cron=cron,
            tz=tz,
            schedule_id=schedule_id,
            payload=payload,
            **options,
        )
    except TypeError as exc:  # an option that does not exist
        raise InvalidArgument("schedule", str(exc)) from None


class Methods:
    """The requests of every method, shared by both clients."""

    @staticmethod
    def schedule(
        job_type: str,
        payload: Any,
        delay: Delay | None,
        at: datetime | None,
        key: str,
        max_attempts: int,
        deadline: datetime | None = None,
        deadline_in: Delay | None = None,
        priority: int = 0,
        if_exists: str = "check",
    ) -> Call[Scheduled]:
        job = NewJob(
            job_type=job_type,
            payload=payload,
            delay=delay,
            at=at,
            key=key,
            max_attempts=max_attempts,
            deadline=deadline,
            deadline_in=deadline_in,
            priority=priority,
            if_exists=if_exists,
        )
        # Without a key a blind retry could create a second job; with one it is safe.
        return Call("ScheduleJob", job.request(), Scheduled.from_pb, idempotent=bool(key))

    @staticmethod
    def schedule_many(
        jobs: Iterable[NewJob], batch_size: int, on_batch: Callable[[int], None] | None
    ) -> Steps[list[Scheduled]]:
        if not 1 <= batch_size <= MAX_BATCH:
            raise InvalidArgument("batch_size", f"must be 1-{MAX_BATCH}, got {batch_size}")
        done: list[Scheduled] = []
        batch: list[NewJob] = []
        for job in [*jobs, None]:
            if job is not None:
                batch.append(job)
            if batch and (job is None or len(batch) == batch_size):
                req = pb.ScheduleJobsRequest(jobs=[j.request() for j in batch])
                keyed = all(j.key for j in batch)  # a blind retry is safe only then
                done += yield Call(
                    "ScheduleJobs",
                    req,
                    lambda resp: [Scheduled.from_pb(r, resp.warnings) for r in resp.results],
                    idempotent=keyed,
                )
                batch = []
                if on_batch is not None:
                    on_batch(len(done))
        return done

    @staticmethod
    def get(job_id: str) -> Call[Job]:
        return Call("GetJob", pb.GetJobRequest(job_id=job_id), Job.from_pb)

    @staticmethod
    def list_jobs(
        state: JobState | str | None,
        job_type: str,
        page_size: int,
        filters: JobFilters = JobFilters(),
    ) -> Callable[[str], Call[tuple[Sequence[Job], str]]]:
        wanted = _state_pb(state)
        filters.apply(pb.ListJobsRequest())  # checked before the first call

        def page(token: str) -> Call[tuple[Sequence[Job], str]]:
            req = pb.ListJobsRequest(state=wanted, type=job_type, page_size=page_size)
            filters.apply(req)
            return page_call("ListJobs", req, lambda r: [Job.from_pb(j) for j in r.jobs], token)

        return page

    @staticmethod
    def cancel(job_id: str) -> Call[Job]:
        return Call("CancelJob", pb.CancelJobRequest(job_id=job_id), Job.from_pb)

    @staticmethod
    def reschedule(job_id: str, delay: Delay | None, at: datetime | None) -> Call[Job]:
        req = pb.RescheduleJobRequest(job_id=job_id)
        _when(req, delay, at)
        return Call("RescheduleJob", req, Job.from_pb)

    @staticmethod
    def create_schedule(spec: ScheduleSpec) -> Call[Schedule]:
        req = pb.CreateScheduleRequest(schedule=spec.message())
        # A repeat of a create that named its id answers ALREADY_EXISTS, never a second one.
        return Call("CreateSchedule", req, Schedule.from_pb, idempotent=bool(spec.schedule_id))

    @staticmethod
    def update_schedule(spec: ScheduleSpec) -> Call[Schedule]:
        if not spec.schedule_id:
            raise InvalidArgument("schedule_id", "name the schedule to update")
        req = pb.UpdateScheduleRequest(schedule=spec.message())
        return Call("UpdateSchedule", req, Schedule.from_pb)

    @staticmethod
    def put_schedule(spec: ScheduleSpec) -> Steps[tuple[Schedule, str]]:
        """Create the schedule, or update it if it says something else; nothing if it is as
        declared. Returns it and what was done: "created", "updated" or "unchanged". Several
        callers at once end with the one declaration stored (each create or update is
        conditional on the server); a schedule of that id for another job type is a clash."""
        if not spec.schedule_id:
            raise InvalidArgument("schedule_id", "a declared schedule needs an id")
        for _ in range(5):
            try:
                current: Schedule = yield Methods.get_schedule(spec.schedule_id)
            except NotFound:
                try:
                    return (yield Methods.create_schedule(spec)), "created"
                except AlreadyExists:
                    continue  # another caller created it meanwhile: compare with theirs
            if current.job_type != spec.job_type:
                raise AlreadyExists(
                    f"schedule {spec.schedule_id!r} exists for job type {current.job_type!r}, "
                    f"not {spec.job_type!r}: give this one another id, or delete that one "
                    f"(timeshard schedules delete {spec.schedule_id})"
                )
            if not spec.differs_from(current):
                return current, "unchanged"
            try:
                return (yield Methods.update_schedule(spec)), "updated"
            except NotFound:
                continue  # deleted meanwhile: create it again
        raise AlreadyExists(f"schedule {spec.schedule_id!r} kept changing; try again")

    @staticmethod
    def get_schedule(schedule_id: str) -> Call[Schedule]:
        req = pb.GetScheduleRequest(schedule_id=schedule_id)
        return Call("GetSchedule", req, Schedule.from_pb)

    @staticmethod
    def list_schedules(page_size: int) -> Callable[[str], Call[tuple[Sequence[Schedule], str]]]:
        def page(token: str) -> Call[tuple[Sequence[Schedule], str]]:
            req = pb.ListSchedulesRequest(page_size=page_size)
            read = lambda r: [Schedule.from_pb(s) for s in r.schedules]  # noqa: E731
            return page_call("ListSchedules", req, read, token)

        return page

    @staticmethod
    def schedule_id_call(method: str, schedule_id: str) -> Call[Schedule]:
        return Call(method, pb.ScheduleIdRequest(schedule_id=schedule_id), Schedule.from_pb)

    @staticmethod
    def delete_schedule(schedule_id: str) -> Call[None]:
        req = pb.ScheduleIdRequest(schedule_id=schedule_id)
        return Call("DeleteSchedule", req, lambda _: None)

    @staticmethod
    def preview(
        cron: str,
        tz: str,
        start: datetime | None,
        count: int,
        dst_gap: str,
        dst_fold: str,
        spread: Delay = 0,
        schedule_id: str = "",
    ) -> Call[list[FireTime]]:
        req = pb.PreviewRequest(
            cron=cron,
            timezone=tz,
            count=count,
            dst_gap=dst_gap,
            dst_fold=dst_fold,
            spread=dur(round(_seconds(spread, "spread") * 1000)),
            schedule_id=schedule_id,
        )
        if start is not None:
            getattr(req, "from").CopyFrom(ts(_ms(start, "start")))
        return Call("PreviewSchedule", req, lambda r: [FireTime.from_pb(t) for t in r.times])

    @staticmethod
    def dead_letters(
        job_type: str, since: datetime | None, page_size: int
    ) -> Callable[[str], Call[tuple[Sequence[DeadLetter], str]]]:
        since_ms = _ms(since, "since") if since is not None else 0

        def page(token: str) -> Call[tuple[Sequence[DeadLetter], str]]:
            req = pb.ListDeadLettersRequest(type=job_type, page_size=page_size)
            if since_ms:
                req.since.CopyFrom(ts(since_ms))
            read = lambda r: [DeadLetter.from_pb(j) for j in r.jobs]  # noqa: E731
            return page_call("ListDeadLetters", req, read, token)

        return page

    @staticmethod
    def replay(job_ids: Sequence[str], job_type: str) -> Call[list[Job]]:
        req = pb.ReplayDeadLettersRequest(job_ids=list(job_ids), type=job_type)
        return Call("ReplayDeadLetters", req, lambda r: [Job.from_pb(j) for j in r.jobs])

    @staticmethod
    def set_type_policies(
        policies: Sequence[tuple[str, Retry | None, int]],
    ) -> Call[list[TypePolicy]]:
        req = pb.SetTypePoliciesRequest(
            policies=[
                retry.message(t, concurrency)
                if retry is not None
                else pb.TypePolicy(type=t, concurrency=concurrency)
                for t, retry, concurrency in policies
            ]
        )
        read = lambda r: [TypePolicy.from_pb(p) for p in r.policies]  # noqa: E731
        return Call("SetTypePolicies", req, read, admin=True)

    @staticmethod
    def set_type_flow(
        job_type: str, *, rate: float | None = None, burst: int = 0, paused: bool | None = None
    ) -> Call[TypeInfo]:
        """One type's flow: ``rate`` (None: unchanged, 0: no limit) with ``burst`` (0: the
        default), ``paused`` (None: unchanged)."""
        flow = pb.TypeFlow(type=job_type, burst=burst)
        if rate is not None:
            flow.rate = rate
        if paused is not None:
            flow.paused = paused
        read = lambda r: TypeInfo.from_pb(r.types[0])  # noqa: E731
        return Call("SetTypeFlows", pb.SetTypeFlowsRequest(flows=[flow]), read, admin=True)

    @staticmethod
    def list_types(job_type: str = "") -> Call[list[TypeInfo]]:
        read = lambda r: [TypeInfo.from_pb(t) for t in r.types]  # noqa: E731
        return Call("ListTypes", pb.ListTypesRequest(type=job_type), read, admin=True)

    @staticmethod
    def purge(job_ids: Sequence[str], job_type: str) -> Call[list[str]]:
        req = pb.ReplayDeadLettersRequest(job_ids=list(job_ids), type=job_type)
        return Call("PurgeDeadLetters", req, lambda r: list(r.job_ids))
