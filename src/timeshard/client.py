"""The Python client: ``Client`` (blocking) and ``AsyncClient`` (asyncio), the same methods.

    from datetime import timedelta
    from timeshard.client import Client

    with Client() as c:     # TIMESHARD_SERVER, TIMESHARD_TLS_DIR, TIMESHARD_TOKEN, as the CLI
        done = c.schedule("email.send", {"to": "a@example.com"}, delay=timedelta(hours=1),
                          key="welcome-42")
        print(done.job.state, done.job.run_at)   # JobState.SCHEDULED, an aware UTC datetime

Both return the frozen records of ``timeshard.records`` (``Job``, ``Schedule``,
``DeadLetter``, ``Attempt``, ``FireTime``), and raise the errors of ``timeshard.errors``
(``NotFound``, ``InvalidArgument``, ``AlreadyExists``, ``Unavailable``...) mapped from the
gRPC status by the one table there. A call that is safe to repeat is retried on UNAVAILABLE
with backoff.

Each method is written once, as the request it sends and how it reads the reply (``_Call``),
or as a few such steps (``put_schedule``, ``schedule_many``); the two clients only carry them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, Self, TypeVar

import grpc
from google.protobuf.message import Message

from timeshard.clock import from_datetime
from timeshard.errors import AlreadyExists, InvalidArgument, NotFound, TimeshardError
from timeshard.limits import MAX_ATTEMPTS, MAX_BATCH, check_range
from timeshard.model import JobState, MisfirePolicy, OverlapPolicy
from timeshard.records import (
    Attempt,
    DeadLetter,
    FireTime,
    Job,
    Schedule,
    Scheduled,
    TypePolicy,
)
from timeshard.security.channel import ClientSecurity, TlsArg, server_from_env
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, state_to_pb, translate, ts

__all__ = [
    "AsyncClient",
    "Attempt",
    "Client",
    "DeadLetter",
    "FireTime",
    "Job",
    "JobState",
    "MisfirePolicy",
    "NewJob",
    "OverlapPolicy",
    "Retry",
    "Schedule",
    "ScheduleSpec",
    "Scheduled",
    "TypePolicy",
]

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
    """One job for ``schedule_many``: due after ``delay`` (default now) or ``at``."""

    job_type: str
    payload: Any = None
    delay: Delay | None = None
    at: datetime | None = None
    key: str = ""
    max_attempts: int = 0

    def request(self) -> pb.ScheduleJobRequest:
        req = pb.ScheduleJobRequest(
            type=self.job_type,
            payload=payload_bytes(self.payload),
            idempotency_key=self.key,
            max_attempts=self.max_attempts,
        )
        _when(req, self.delay, self.at)
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
    )


@dataclass(frozen=True, slots=True)
class _Call(Generic[R]):
    """One JobService call: the method, its request, whether a blind repeat is safe, and how
    the reply is read."""

    method: str
    request: Message
    read: Callable[[Any], R]
    idempotent: bool = True
    admin: bool = False
    """An AdminService call (else JobService)."""


_Steps = Generator[_Call[Any], Any, R]
"""A method of several calls: it yields each call and is sent its result (or thrown its
error), and returns the method's value."""


def _page_call(
    method: str, request: Any, read: Callable[[Any], Sequence[R]], token: str
) -> _Call[tuple[Sequence[R], str]]:
    request.page_token = token
    return _Call(method, request, lambda resp: (read(resp), resp.next_page_token))


def _schedule_spec(
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


class _Methods:
    """The requests of every method, shared by both clients."""

    @staticmethod
    def schedule(
        job_type: str,
        payload: Any,
        delay: Delay | None,
        at: datetime | None,
        key: str,
        max_attempts: int,
    ) -> _Call[Scheduled]:
        job = NewJob(
            job_type=job_type,
            payload=payload,
            delay=delay,
            at=at,
            key=key,
            max_attempts=max_attempts,
        )
        # Without a key a blind retry could create a second job; with one it is safe.
        return _Call("ScheduleJob", job.request(), Scheduled.from_pb, idempotent=bool(key))

    @staticmethod
    def schedule_many(
        jobs: Iterable[NewJob], batch_size: int, on_batch: Callable[[int], None] | None
    ) -> _Steps[list[Scheduled]]:
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
                done += yield _Call(
                    "ScheduleJobs",
                    req,
                    lambda resp: [Scheduled.from_pb(r) for r in resp.results],
                    idempotent=keyed,
                )
                batch = []
                if on_batch is not None:
                    on_batch(len(done))
        return done

    @staticmethod
    def get(job_id: str) -> _Call[Job]:
        return _Call("GetJob", pb.GetJobRequest(job_id=job_id), Job.from_pb)

    @staticmethod
    def list_jobs(
        state: JobState | str | None, job_type: str, page_size: int
    ) -> Callable[[str], _Call[tuple[Sequence[Job], str]]]:
        try:
            wanted = state_to_pb(JobState(state)) if state else pb.JOB_STATE_UNSPECIFIED
        except ValueError:
            raise InvalidArgument(
                "state", f"{state!r} is not a job state; use one of {[s.value for s in JobState]}"
            ) from None

        def page(token: str) -> _Call[tuple[Sequence[Job], str]]:
            req = pb.ListJobsRequest(state=wanted, type=job_type, page_size=page_size)
            return _page_call("ListJobs", req, lambda r: [Job.from_pb(j) for j in r.jobs], token)

        return page

    @staticmethod
    def cancel(job_id: str) -> _Call[Job]:
        return _Call("CancelJob", pb.CancelJobRequest(job_id=job_id), Job.from_pb)

    @staticmethod
    def reschedule(job_id: str, delay: Delay | None, at: datetime | None) -> _Call[Job]:
        req = pb.RescheduleJobRequest(job_id=job_id)
        _when(req, delay, at)
        return _Call("RescheduleJob", req, Job.from_pb)

    @staticmethod
    def create_schedule(spec: ScheduleSpec) -> _Call[Schedule]:
        req = pb.CreateScheduleRequest(schedule=spec.message())
        # A repeat of a create that named its id answers ALREADY_EXISTS, never a second one.
        return _Call("CreateSchedule", req, Schedule.from_pb, idempotent=bool(spec.schedule_id))

    @staticmethod
    def update_schedule(spec: ScheduleSpec) -> _Call[Schedule]:
        if not spec.schedule_id:
            raise InvalidArgument("schedule_id", "name the schedule to update")
        req = pb.UpdateScheduleRequest(schedule=spec.message())
        return _Call("UpdateSchedule", req, Schedule.from_pb)

    @staticmethod
    def put_schedule(spec: ScheduleSpec) -> _Steps[tuple[Schedule, str]]:
        """Create the schedule, or update it if it says something else; nothing if it is as
        declared. Returns it and what was done: "created", "updated" or "unchanged". Several
        callers at once end with the one declaration stored (each create or update is
        conditional on the server); a schedule of that id for another job type is a clash."""
        if not spec.schedule_id:
            raise InvalidArgument("schedule_id", "a declared schedule needs an id")
        for _ in range(5):
            try:
                current: Schedule = yield _Methods.get_schedule(spec.schedule_id)
            except NotFound:
                try:
                    return (yield _Methods.create_schedule(spec)), "created"
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
                return (yield _Methods.update_schedule(spec)), "updated"
            except NotFound:
                continue  # deleted meanwhile: create it again
        raise AlreadyExists(f"schedule {spec.schedule_id!r} kept changing; try again")

    @staticmethod
    def get_schedule(schedule_id: str) -> _Call[Schedule]:
        req = pb.GetScheduleRequest(schedule_id=schedule_id)
        return _Call("GetSchedule", req, Schedule.from_pb)

    @staticmethod
    def list_schedules(page_size: int) -> Callable[[str], _Call[tuple[Sequence[Schedule], str]]]:
        def page(token: str) -> _Call[tuple[Sequence[Schedule], str]]:
            req = pb.ListSchedulesRequest(page_size=page_size)
            read = lambda r: [Schedule.from_pb(s) for s in r.schedules]  # noqa: E731
            return _page_call("ListSchedules", req, read, token)

        return page

    @staticmethod
    def schedule_id_call(method: str, schedule_id: str) -> _Call[Schedule]:
        return _Call(method, pb.ScheduleIdRequest(schedule_id=schedule_id), Schedule.from_pb)

    @staticmethod
    def delete_schedule(schedule_id: str) -> _Call[None]:
        req = pb.ScheduleIdRequest(schedule_id=schedule_id)
        return _Call("DeleteSchedule", req, lambda _: None)

    @staticmethod
    def preview(
        cron: str, tz: str, start: datetime | None, count: int, dst_gap: str, dst_fold: str
    ) -> _Call[list[FireTime]]:
        req = pb.PreviewRequest(
            cron=cron, timezone=tz, count=count, dst_gap=dst_gap, dst_fold=dst_fold
        )
        if start is not None:
            getattr(req, "from").CopyFrom(ts(_ms(start, "start")))
        return _Call("PreviewSchedule", req, lambda r: [FireTime.from_pb(t) for t in r.times])

    @staticmethod
    def dead_letters(
        job_type: str, since: datetime | None, page_size: int
    ) -> Callable[[str], _Call[tuple[Sequence[DeadLetter], str]]]:
        since_ms = _ms(since, "since") if since is not None else 0

        def page(token: str) -> _Call[tuple[Sequence[DeadLetter], str]]:
            req = pb.ListDeadLettersRequest(type=job_type, page_size=page_size)
            if since_ms:
                req.since.CopyFrom(ts(since_ms))
            read = lambda r: [DeadLetter.from_pb(j) for j in r.jobs]  # noqa: E731
            return _page_call("ListDeadLetters", req, read, token)

        return page

    @staticmethod
    def replay(job_ids: Sequence[str], job_type: str) -> _Call[list[Job]]:
        req = pb.ReplayDeadLettersRequest(job_ids=list(job_ids), type=job_type)
        return _Call("ReplayDeadLetters", req, lambda r: [Job.from_pb(j) for j in r.jobs])

    @staticmethod
    def set_type_policies(
        policies: Sequence[tuple[str, Retry | None, int]],
    ) -> _Call[list[TypePolicy]]:
        req = pb.SetTypePoliciesRequest(
            policies=[
                retry.message(t, concurrency)
                if retry is not None
                else pb.TypePolicy(type=t, concurrency=concurrency)
                for t, retry, concurrency in policies
            ]
        )
        read = lambda r: [TypePolicy.from_pb(p) for p in r.policies]  # noqa: E731
        return _Call("SetTypePolicies", req, read, admin=True)

    @staticmethod
    def purge(job_ids: Sequence[str], job_type: str) -> _Call[list[str]]:
        req = pb.ReplayDeadLettersRequest(job_ids=list(job_ids), type=job_type)
        return _Call("PurgeDeadLetters", req, lambda r: list(r.job_ids))


def _first_address(address: str | None) -> str:
    """The node to dial: ``address``, else ``TIMESHARD_SERVER``; of a comma-separated list
    (as the CLI takes), the first."""
    given = address if address is not None else server_from_env()
    first = next((a.strip() for a in given.split(",") if a.strip()), "")
    if not first:
        raise InvalidArgument("address", "give a node address, e.g. 127.0.0.1:50051")
    return first


class _Base:
    address: str
    _timeout: float
    _retries: int

    def _backoff(self, attempt: int, err: TimeshardError, call: _Call[Any]) -> float | None:
        """Seconds to wait before repeating ``call`` after ``err``, or None: do not."""
        retry = call.idempotent and getattr(err, "code", None) is grpc.StatusCode.UNAVAILABLE
        if not retry or attempt >= self._retries:
            return None
        return min(2.0, 0.1 * 2.0**attempt)


class Client(_Base):
    """The blocking client (one channel). ``address`` defaults to ``TIMESHARD_SERVER``, ``tls``
    to ``TIMESHARD_TLS_DIR`` and ``token`` to ``TIMESHARD_TOKEN``, as the CLI reads them;
    ``tls=False`` and ``token=""`` turn them off."""

    def __init__(
        self,
        address: str | None = None,
        *,
        tls: TlsArg = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.address = _first_address(address)
        security = ClientSecurity.resolve(tls, token)
        self._channel = channel or security.sync_channel(self.address)
        self._jobs = pb_grpc.JobServiceStub(self._channel)
        self._admin = pb_grpc.AdminServiceStub(self._channel)
        self._timeout = timeout_s
        self._retries = retries

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _run(self, call: _Call[R]) -> R:
        fn = getattr(self._admin if call.admin else self._jobs, call.method)
        attempt = 0
        while True:
            try:
                return call.read(fn(call.request, timeout=self._timeout))
            except grpc.RpcError as exc:
                err = translate(exc)
                wait = self._backoff(attempt, err, call)
                if wait is None:
                    raise err from None
            time.sleep(wait)
            attempt += 1

    def _steps(self, steps: _Steps[R]) -> R:
        try:
            call = next(steps)
            while True:
                try:
                    result = self._run(call)
                except TimeshardError as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(result)
        except StopIteration as done:
            value: R = done.value
            return value

    def _pages(self, page: Callable[[str], _Call[tuple[Sequence[R], str]]]) -> Iterator[R]:
        token = ""
        while True:
            items, token = self._run(page(token))
            yield from items
            if not token:
                return

    # -- jobs -----------------------------------------------------------------------------

    def schedule(
        self,
        job_type: str,
        payload: Any = None,
        *,
        delay: Delay | None = None,
        at: datetime | None = None,
        key: str = "",
        max_attempts: int = 0,
    ) -> Scheduled:
        """Schedule one job, due after ``delay`` (a timedelta or seconds; default now) or
        ``at`` (an aware datetime). ``key``: an idempotency key; a repeat returns the job the
        key names, ``created=False``, in whatever state it is. ``max_attempts``: 0 is the
        type's default."""
        return self._run(_Methods.schedule(job_type, payload, delay, at, key, max_attempts))

    def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        """Schedule many jobs, ``batch_size`` per call (each call is all or nothing); what each
        did, in order. ``on_batch(n)`` is called after each batch with the count so far."""
        return self._steps(_Methods.schedule_many(jobs, batch_size, on_batch))

    def get(self, job_id: str) -> Job:
        return self._run(_Methods.get(job_id))

    def list_jobs(
        self, *, state: JobState | str | None = None, job_type: str = "", page_size: int = 100
    ) -> Iterator[Job]:
        return self._pages(_Methods.list_jobs(state, job_type, page_size))

    def cancel(self, job_id: str) -> Job:
        return self._run(_Methods.cancel(job_id))

    def reschedule(
        self, job_id: str, *, delay: Delay | None = None, at: datetime | None = None
    ) -> Job:
        return self._run(_Methods.reschedule(job_id, delay, at))

    # -- schedules ------------------------------------------------------------------------

    def create_schedule(
        self,
        job_type: str,
        *,
        cron: str,
        tz: str = "UTC",
        schedule_id: str = "",
        payload: Any = None,
        **options: Any,
    ) -> Schedule:
        """Create a cron schedule whose runs are ``job_type`` jobs with ``payload``. Options
        are those of ``ScheduleSpec`` (misfire, overlap, max_concurrent, jitter, ...). An
        ``schedule_id`` already taken is ``AlreadyExists``; without one the server picks it."""
        spec = _schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return self._run(_Methods.create_schedule(spec))

    def update_schedule(
        self,
        schedule_id: str,
        job_type: str,
        *,
        cron: str,
        tz: str = "UTC",
        payload: Any = None,
        **options: Any,
    ) -> Schedule:
        """Replace a schedule's spec, job and policies; it keeps its place (and its pause)."""
        spec = _schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return self._run(_Methods.update_schedule(spec))

    def put_schedule(self, spec: ScheduleSpec) -> tuple[Schedule, str]:
        """Create or update by id, so that the schedule is as declared ("created", "updated"
        or "unchanged"); see ``Worker.cron``."""
        return self._steps(_Methods.put_schedule(spec))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return self._run(_Methods.get_schedule(schedule_id))

    def list_schedules(self, *, page_size: int = 100) -> Iterator[Schedule]:
        return self._pages(_Methods.list_schedules(page_size))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return self._run(_Methods.schedule_id_call("PauseSchedule", schedule_id))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        return self._run(_Methods.schedule_id_call("ResumeSchedule", schedule_id))

    def delete_schedule(self, schedule_id: str) -> None:
        self._run(_Methods.delete_schedule(schedule_id))

    def preview(
        self,
        cron: str,
        tz: str = "UTC",
        *,
        start: datetime | None = None,
        count: int = 10,
        dst_gap: str = "",
        dst_fold: str = "",
    ) -> list[FireTime]:
        """The next ``count`` fire times after ``start`` (default: the server's now)."""
        return self._run(_Methods.preview(cron, tz, start, count, dst_gap, dst_fold))

    # -- dead letters ---------------------------------------------------------------------

    def dead_letters(
        self, *, job_type: str = "", since: datetime | None = None, page_size: int = 100
    ) -> Iterator[DeadLetter]:
        return self._pages(_Methods.dead_letters(job_type, since, page_size))

    def replay(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[Job]:
        """Schedule dead jobs again with fresh attempts: the ones named, or (up to 1,000 per
        call) the dead jobs of ``job_type``."""
        return self._run(_Methods.replay(job_ids, job_type))

    def purge(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[str]:
        return self._run(_Methods.purge(job_ids, job_type))

    # -- per-type policies ----------------------------------------------------------------

    def set_type_policy(
        self, job_type: str, *, retry: Retry | None = None, concurrency: int = 0
    ) -> TypePolicy:
        """Set ``job_type``'s retry policy and cluster-wide concurrency limit (0: none) on
        every node (stored; other nodes apply it within seconds). Worker or admin role."""
        (done,) = self._run(_Methods.set_type_policies([(job_type, retry, concurrency)]))
        return done


class AsyncClient(_Base):
    """The asyncio client: ``Client``'s methods, each ``async`` (the listings are async
    iterators). Use it as ``async with AsyncClient() as c:``."""

    def __init__(
        self,
        address: str | None = None,
        *,
        tls: TlsArg = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self.address = _first_address(address)
        security = ClientSecurity.resolve(tls, token)
        self._channel = channel or security.aio_channel(self.address)
        self._jobs = pb_grpc.JobServiceStub(self._channel)
        self._admin = pb_grpc.AdminServiceStub(self._channel)
        self._timeout = timeout_s
        self._retries = retries

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def _run(self, call: _Call[R]) -> R:
        fn = getattr(self._admin if call.admin else self._jobs, call.method)
        attempt = 0
        while True:
            try:
                return call.read(await fn(call.request, timeout=self._timeout))
            except grpc.RpcError as exc:
                err = translate(exc)
                wait = self._backoff(attempt, err, call)
                if wait is None:
                    raise err from None
            await asyncio.sleep(wait)
            attempt += 1

    async def _steps(self, steps: _Steps[R]) -> R:
        try:
            call = next(steps)
            while True:
                try:
                    result = await self._run(call)
                except TimeshardError as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(result)
        except StopIteration as done:
            value: R = done.value
            return value

    async def _pages(
        self, page: Callable[[str], _Call[tuple[Sequence[R], str]]]
    ) -> AsyncIterator[R]:
        token = ""
        while True:
            items, token = await self._run(page(token))
            for item in items:
                yield item
            if not token:
                return

    # -- jobs -----------------------------------------------------------------------------

    async def schedule(
        self,
        job_type: str,
        payload: Any = None,
        *,
        delay: Delay | None = None,
        at: datetime | None = None,
        key: str = "",
        max_attempts: int = 0,
    ) -> Scheduled:
        """See ``Client.schedule``."""
        return await self._run(_Methods.schedule(job_type, payload, delay, at, key, max_attempts))

    async def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        return await self._steps(_Methods.schedule_many(jobs, batch_size, on_batch))

    async def get(self, job_id: str) -> Job:
        return await self._run(_Methods.get(job_id))

    def list_jobs(
        self, *, state: JobState | str | None = None, job_type: str = "", page_size: int = 100
    ) -> AsyncIterator[Job]:
        return self._pages(_Methods.list_jobs(state, job_type, page_size))

    async def cancel(self, job_id: str) -> Job:
        return await self._run(_Methods.cancel(job_id))

    async def reschedule(
        self, job_id: str, *, delay: Delay | None = None, at: datetime | None = None
    ) -> Job:
        return await self._run(_Methods.reschedule(job_id, delay, at))

    # -- schedules ------------------------------------------------------------------------

    async def create_schedule(
        self,
        job_type: str,
        *,
        cron: str,
        tz: str = "UTC",
        schedule_id: str = "",
        payload: Any = None,
        **options: Any,
    ) -> Schedule:
        spec = _schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return await self._run(_Methods.create_schedule(spec))

    async def update_schedule(
        self,
        schedule_id: str,
        job_type: str,
        *,
        cron: str,
        tz: str = "UTC",
        payload: Any = None,
        **options: Any,
    ) -> Schedule:
        spec = _schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return await self._run(_Methods.update_schedule(spec))

    async def put_schedule(self, spec: ScheduleSpec) -> tuple[Schedule, str]:
        return await self._steps(_Methods.put_schedule(spec))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(_Methods.get_schedule(schedule_id))

    def list_schedules(self, *, page_size: int = 100) -> AsyncIterator[Schedule]:
        return self._pages(_Methods.list_schedules(page_size))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(_Methods.schedule_id_call("PauseSchedule", schedule_id))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(_Methods.schedule_id_call("ResumeSchedule", schedule_id))

    async def delete_schedule(self, schedule_id: str) -> None:
        await self._run(_Methods.delete_schedule(schedule_id))

    async def preview(
        self,
        cron: str,
        tz: str = "UTC",
        *,
        start: datetime | None = None,
        count: int = 10,
        dst_gap: str = "",
        dst_fold: str = "",
    ) -> list[FireTime]:
        return await self._run(_Methods.preview(cron, tz, start, count, dst_gap, dst_fold))

    # -- dead letters ---------------------------------------------------------------------

    def dead_letters(
        self, *, job_type: str = "", since: datetime | None = None, page_size: int = 100
    ) -> AsyncIterator[DeadLetter]:
        return self._pages(_Methods.dead_letters(job_type, since, page_size))

    async def replay(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[Job]:
        return await self._run(_Methods.replay(job_ids, job_type))

    async def purge(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[str]:
        return await self._run(_Methods.purge(job_ids, job_type))

    # -- per-type policies ----------------------------------------------------------------

    async def set_type_policy(
        self, job_type: str, *, retry: Retry | None = None, concurrency: int = 0
    ) -> TypePolicy:
        (done,) = await self._run(_Methods.set_type_policies([(job_type, retry, concurrency)]))
        return done

    async def set_type_policies(
        self, policies: Sequence[tuple[str, Retry | None, int]]
    ) -> list[TypePolicy]:
        """Several at once: (job type, retry, cluster-wide concurrency) each."""
        return await self._run(_Methods.set_type_policies(policies))
