"""``Client`` (blocking) and ``AsyncClient`` (asyncio): the same methods, over a channel.

Both return the frozen records of ``timeshard.client.records`` (``Job``, ``Schedule``,
``DeadLetter``, ``Attempt``, ``FireTime``), and raise the errors of ``timeshard.errors``
(``NotFound``, ``InvalidArgument``, ``AlreadyExists``, ``Unavailable``...) mapped from the
gRPC status by the one table there. A call that is safe to repeat is retried on UNAVAILABLE
with backoff. Given several node addresses (``"a:50051,b:50051"``, as the CLI takes them), a
client that cannot reach one moves on to the next, and stays there: a call that never left
(no connection) goes again at once to the next node, any other only if it is safe to repeat.

Each method is written once in ``timeshard.client.calls``, as the request it sends and how it
reads the reply, or as a few such steps (``put_schedule``, ``schedule_many``); the two clients
only carry them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Generic, Self, TypeVar

import grpc
from typing_extensions import Unpack

from timeshard.client.calls import Call, Methods, Steps
from timeshard.client.options import (
    Delay,
    JobFilters,
    JobOptionArgs,
    NewJob,
    Retry,
    ScheduleSpec,
    schedule_spec,
)
from timeshard.client.records import (
    DeadLetter,
    FireTime,
    Job,
    Schedule,
    Scheduled,
    TypeInfo,
    TypePolicy,
)
from timeshard.errors import InvalidArgument, TimeshardError, WaitTimeout
from timeshard.limits import MAX_BATCH, MAX_WAIT_S
from timeshard.model import JobState
from timeshard.security.channel import ClientSecurity, TlsArg, server_from_env
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, translate

__all__ = ["AsyncClient", "Client"]

R = TypeVar("R")
log = logging.getLogger("timeshard.client")  # the package's logger, as before the split


def _addresses(address: str | None) -> list[str]:
    """The nodes to dial: ``address``, else ``TIMESHARD_SERVER``; a comma-separated list (as
    the CLI takes) in the order given."""
    given = address if address is not None else server_from_env()
    found = [a.strip() for a in given.split(",") if a.strip()]
    if not found:
        raise InvalidArgument("address", "give a node address, e.g. 127.0.0.1:50051")
    return found


NEVER_SENT = "failed to connect to all addresses"
"""gRPC's words for a call that found no connection to make: it never reached a node."""


def _never_sent(exc: grpc.RpcError) -> bool:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else ""
    return code is grpc.StatusCode.UNAVAILABLE and NEVER_SENT in (details or "")


C = TypeVar("C")


class _Base(Generic[C]):
    _addresses: list[str]
    _at: int
    _channels: dict[str, C]
    _timeout: float
    _retries: int
    _warned: set[str]
    """The job types whose warning this client has logged (once each)."""

    @property
    def address(self) -> str:
        """The node this client sends to now."""
        return self._addresses[self._at]

    def _use(self, channel: Any) -> None:
        self._channel = channel
        self._jobs = pb_grpc.JobServiceStub(channel)
        self._admin = pb_grpc.AdminServiceStub(channel)

    def _open(self, address: str) -> C:
        raise NotImplementedError

    def _setup(
        self,
        address: str | None,
        tls: TlsArg,
        token: str | None,
        timeout_s: float,
        retries: int,
        channel: C | None,
    ) -> None:
        """Both clients' constructor: the addresses, security, and the first channel (the
        one given, or the first address's)."""
        self._addresses = _addresses(address) if channel is None else ["(given channel)"]
        self._at = 0
        self._security = ClientSecurity.resolve(tls, token)
        first = channel or self._open(self.address)
        self._channels = {self.address: first}
        self._use(first)
        self._timeout = timeout_s
        self._retries = retries
        self._warned = set()

    def _noted(self, done: list[Scheduled]) -> list[Scheduled]:
        """``done``, its warnings logged, once per job type for this client."""
        for d in done:
            if d.warnings and d.job.job_type not in self._warned:
                self._warned.add(d.job.job_type)
                for text in d.warnings:
                    log.warning("job type %r: %s", d.job.job_type, text)
        return done

    def _move_on(self) -> None:
        """To the next address (from the last back to the first), its channel opened once."""
        self._at = (self._at + 1) % len(self._addresses)
        address = self.address
        if address not in self._channels:
            self._channels[address] = self._open(address)
        self._use(self._channels[address])

    def _backoff(
        self, attempt: int, err: TimeshardError, call: Call[Any], exc: grpc.RpcError
    ) -> float | None:
        """Seconds to wait before repeating ``call`` after ``err``, or None: do not. On
        UNAVAILABLE with more than one address, the client moves to the next first; a call
        that never left goes there at once, once per other address."""
        if getattr(err, "code", None) is not grpc.StatusCode.UNAVAILABLE:
            return None
        others = len(self._addresses) - 1
        if others:
            self._move_on()
        never_sent = _never_sent(exc)
        if not (call.idempotent or never_sent) or attempt >= self._retries + others:
            return None
        if attempt < others:
            return 0.0
        return min(2.0, 0.1 * 2.0 ** (attempt - others))


class Client(_Base[grpc.Channel]):
    """The blocking client (a channel per node it dialled). ``address`` defaults to
    ``TIMESHARD_SERVER``, ``tls`` to ``TIMESHARD_TLS_DIR`` and ``token`` to
    ``TIMESHARD_TOKEN``, as the CLI reads them; ``tls=False`` and ``token=""`` turn them off."""

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
        self._setup(address, tls, token, timeout_s, retries, channel)

    def _open(self, address: str) -> grpc.Channel:
        return self._security.sync_channel(address)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def _run(self, call: Call[R]) -> R:
        fn = getattr(self._admin if call.admin else self._jobs, call.method)
        attempt = 0
        while True:
            try:
                return call.read(fn(call.request, timeout=self._timeout))
            except grpc.RpcError as exc:
                err = translate(exc)
                wait = self._backoff(attempt, err, call, exc)
                if wait is None:
                    raise err from None
            time.sleep(wait)
            attempt += 1
            fn = getattr(self._admin if call.admin else self._jobs, call.method)

    def _steps(self, steps: Steps[R]) -> R:
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

    def _pages(self, page: Callable[[str], Call[tuple[Sequence[R], str]]]) -> Iterator[R]:
        token = ""
        while True:
            items, token = self._run(page(token))
            yield from items
            if not token:
                return

    # -- jobs -----------------------------------------------------------------------------

    def schedule(
        self, job_type: str, payload: Any = None, **options: Unpack[JobOptionArgs]
    ) -> Scheduled:
        """Schedule one job with its options (``JobOptions``): due after ``delay`` (a
        timedelta or seconds; default now) or ``at`` (an aware datetime). ``key``: an
        idempotency key; a repeat returns the job the key names, ``created=False``, in
        whatever state it is. ``max_attempts``: 0 is the type's default. ``deadline`` (an aware
        datetime) or ``deadline_in`` (after the job is due): no attempt starts later; a job not
        started by then ends ``expired``. ``priority``: 0 (default, lowest) to 9, higher first
        within the type, with aging. ``if_exists``: with a ``key`` that already names a job,
        ``"check"`` (the default) gets it if this call asks for the same type, payload,
        max_attempts, priority and time (``delay`` counting from the key's first call), else
        raises ``AlreadyExists``; ``"return"`` gets it whatever this call asks for. A warning
        from the server (e.g. no worker has asked for the type lately) is logged once per
        type, and in ``Scheduled.warnings``."""
        job = NewJob(job_type=job_type, payload=payload, **options)
        return self._noted([self._run(Methods.schedule(job))])[0]

    def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        """Schedule many jobs, ``batch_size`` per call (each call is all or nothing); what each
        did, in order. ``on_batch(n)`` is called after each batch with the count so far."""
        return self._noted(self._steps(Methods.schedule_many(jobs, batch_size, on_batch)))

    def get(self, job_id: str) -> Job:
        return self._run(Methods.get(job_id))

    def list_jobs(
        self,
        *,
        state: JobState | str | None = None,
        job_type: str = "",
        page_size: int = 100,
        states: Sequence[JobState | str] = (),
        due_from: datetime | None = None,
        due_to: datetime | None = None,
        key: str = "",
        key_prefix: str = "",
        schedule_id: str = "",
        order: str = "due",
    ) -> Iterator[Job]:
        """The jobs that match every filter given, by ``order`` (see ``JobFilters``)."""
        filters = JobFilters(
            states=states,
            due_from=due_from,
            due_to=due_to,
            key=key,
            key_prefix=key_prefix,
            schedule_id=schedule_id,
            order=order,
        )
        return self._pages(Methods.list_jobs(state, job_type, page_size, filters))

    def cancel(self, job_id: str) -> Job:
        return self._run(Methods.cancel(job_id))

    def reschedule(
        self, job_id: str, *, delay: Delay | None = None, at: datetime | None = None
    ) -> Job:
        return self._run(Methods.reschedule(job_id, delay, at))

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
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return self._run(Methods.create_schedule(spec))

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
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return self._run(Methods.update_schedule(spec))

    def put_schedule(self, spec: ScheduleSpec) -> tuple[Schedule, str]:
        """Create or update by id, so that the schedule is as declared ("created", "updated"
        or "unchanged"); see ``Worker.cron``."""
        return self._steps(Methods.put_schedule(spec))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return self._run(Methods.get_schedule(schedule_id))

    def list_schedules(self, *, page_size: int = 100) -> Iterator[Schedule]:
        return self._pages(Methods.list_schedules(page_size))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return self._run(Methods.schedule_id_call("PauseSchedule", schedule_id))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        return self._run(Methods.schedule_id_call("ResumeSchedule", schedule_id))

    def delete_schedule(self, schedule_id: str) -> None:
        self._run(Methods.delete_schedule(schedule_id))

    def preview(
        self,
        cron: str,
        tz: str = "UTC",
        *,
        start: datetime | None = None,
        count: int = 10,
        dst_gap: str = "",
        dst_fold: str = "",
        spread: Delay = 0,
        schedule_id: str = "",
    ) -> list[FireTime]:
        """The next ``count`` fire times after ``start`` (default: the server's now); with a
        ``spread`` and the ``schedule_id`` it derives from, when each occurrence runs
        (``FireTime.runs_at``)."""
        return self._run(
            Methods.preview(cron, tz, start, count, dst_gap, dst_fold, spread, schedule_id)
        )

    # -- dead letters ---------------------------------------------------------------------

    def dead_letters(
        self, *, job_type: str = "", since: datetime | None = None, page_size: int = 100
    ) -> Iterator[DeadLetter]:
        return self._pages(Methods.dead_letters(job_type, since, page_size))

    def replay(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[Job]:
        """Schedule dead jobs again with fresh attempts: the ones named, or (up to 1,000 per
        call) the dead jobs of ``job_type``."""
        return self._run(Methods.replay(job_ids, job_type))

    def purge(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[str]:
        return self._run(Methods.purge(job_ids, job_type))

    # -- per-type policies ----------------------------------------------------------------

    def set_type_policy(
        self, job_type: str, *, retry: Retry | None = None, concurrency: int = 0
    ) -> TypePolicy:
        """Set ``job_type``'s retry policy and cluster-wide concurrency limit (0: none) on
        every node (stored; other nodes apply it within seconds). Worker or admin role."""
        (done,) = self._run(Methods.set_type_policies([(job_type, retry, concurrency)]))
        return done

    # -- flow control of a type (admin role) ------------------------------------------------

    def set_type_rate(self, job_type: str, rate: float, *, burst: int = 0) -> TypeInfo:
        """At most ``rate`` jobs of ``job_type`` start per second across the cluster (0: no
        limit), ``burst`` at once (0: half a second's worth, at least 1). The node called
        applies it at once, the others within 5 s."""
        return self._run(Methods.set_type_flow(job_type, rate=rate, burst=burst))

    def pause_type(self, job_type: str) -> TypeInfo:
        """Hand out no job of ``job_type``: its due jobs stay ready, in order, and new ones are
        still accepted and stored (the other nodes follow within 5 s)."""
        return self._run(Methods.set_type_flow(job_type, paused=True))

    def resume_type(self, job_type: str) -> TypeInfo:
        """Hand out ``job_type``'s jobs again, oldest first, at its rate if it has one."""
        return self._run(Methods.set_type_flow(job_type, paused=False))

    def list_types(self, job_type: str = "") -> list[TypeInfo]:
        """Every type with a policy or a flow (or only ``job_type``), as the node called
        applies it, with its jobs held there."""
        return self._run(Methods.list_types(job_type))

    # -- waiting for jobs -----------------------------------------------------------------

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """The job once it is finished (succeeded, dead, cancelled or expired; ``Job.result`` holds
        what its handler returned). Raises ``WaitTimeout`` after ``timeout`` seconds (None:
        as long as it takes), ``NotFound`` for an unknown id."""
        return self.wait_many([job_id], timeout=timeout)[job_id]

    def wait_many(self, job_ids: Iterable[str], timeout: float | None = None) -> dict[str, Job]:
        """Every job once it is finished, by id in the order given (see ``as_finished``)."""
        done = {job.job_id: job for job in self.as_finished(job_ids, timeout=timeout)}
        return {job_id: done[job_id] for job_id in dict.fromkeys(job_ids)}

    def as_finished(self, job_ids: Iterable[str], timeout: float | None = None) -> Iterator[Job]:
        """Each job as soon as it is finished, in the order they finish. The server streams
        them (``WaitJobs``): nothing is polled from here; a wait longer than the server's cap
        is made of several calls."""
        waiting = _Waiting(job_ids, timeout)
        while waiting.pending:
            req = waiting.request()
            try:
                for resp in self._jobs.WaitJobs(req, timeout=waiting.wait_s + self._timeout):
                    yield waiting.got(resp.job)
            except grpc.RpcError as exc:
                delay = waiting.failed(translate(exc), self._retries)
                if delay:
                    time.sleep(delay)
            waiting.check_deadline()


class AsyncClient(_Base[grpc.aio.Channel]):
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
        self._setup(address, tls, token, timeout_s, retries, channel)

    def _open(self, address: str) -> grpc.aio.Channel:
        return self._security.aio_channel(address)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)

    async def _run(self, call: Call[R]) -> R:
        fn = getattr(self._admin if call.admin else self._jobs, call.method)
        attempt = 0
        while True:
            try:
                return call.read(await fn(call.request, timeout=self._timeout))
            except grpc.RpcError as exc:
                err = translate(exc)
                wait = self._backoff(attempt, err, call, exc)
                if wait is None:
                    raise err from None
            await asyncio.sleep(wait)
            attempt += 1
            fn = getattr(self._admin if call.admin else self._jobs, call.method)

    async def _steps(self, steps: Steps[R]) -> R:
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
        self, page: Callable[[str], Call[tuple[Sequence[R], str]]]
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
        self, job_type: str, payload: Any = None, **options: Unpack[JobOptionArgs]
    ) -> Scheduled:
        """See ``Client.schedule``."""
        job = NewJob(job_type=job_type, payload=payload, **options)
        return self._noted([await self._run(Methods.schedule(job))])[0]

    async def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        return self._noted(await self._steps(Methods.schedule_many(jobs, batch_size, on_batch)))

    async def get(self, job_id: str) -> Job:
        return await self._run(Methods.get(job_id))

    def list_jobs(
        self,
        *,
        state: JobState | str | None = None,
        job_type: str = "",
        page_size: int = 100,
        states: Sequence[JobState | str] = (),
        due_from: datetime | None = None,
        due_to: datetime | None = None,
        key: str = "",
        key_prefix: str = "",
        schedule_id: str = "",
        order: str = "due",
    ) -> AsyncIterator[Job]:
        """The jobs that match every filter given, by ``order`` (see ``JobFilters``)."""
        filters = JobFilters(
            states=states,
            due_from=due_from,
            due_to=due_to,
            key=key,
            key_prefix=key_prefix,
            schedule_id=schedule_id,
            order=order,
        )
        return self._pages(Methods.list_jobs(state, job_type, page_size, filters))

    async def cancel(self, job_id: str) -> Job:
        return await self._run(Methods.cancel(job_id))

    async def reschedule(
        self, job_id: str, *, delay: Delay | None = None, at: datetime | None = None
    ) -> Job:
        return await self._run(Methods.reschedule(job_id, delay, at))

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
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return await self._run(Methods.create_schedule(spec))

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
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return await self._run(Methods.update_schedule(spec))

    async def put_schedule(self, spec: ScheduleSpec) -> tuple[Schedule, str]:
        return await self._steps(Methods.put_schedule(spec))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(Methods.get_schedule(schedule_id))

    def list_schedules(self, *, page_size: int = 100) -> AsyncIterator[Schedule]:
        return self._pages(Methods.list_schedules(page_size))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(Methods.schedule_id_call("PauseSchedule", schedule_id))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(Methods.schedule_id_call("ResumeSchedule", schedule_id))

    async def delete_schedule(self, schedule_id: str) -> None:
        await self._run(Methods.delete_schedule(schedule_id))

    async def preview(
        self,
        cron: str,
        tz: str = "UTC",
        *,
        start: datetime | None = None,
        count: int = 10,
        dst_gap: str = "",
        dst_fold: str = "",
        spread: Delay = 0,
        schedule_id: str = "",
    ) -> list[FireTime]:
        return await self._run(
            Methods.preview(cron, tz, start, count, dst_gap, dst_fold, spread, schedule_id)
        )

    # -- dead letters ---------------------------------------------------------------------

    def dead_letters(
        self, *, job_type: str = "", since: datetime | None = None, page_size: int = 100
    ) -> AsyncIterator[DeadLetter]:
        return self._pages(Methods.dead_letters(job_type, since, page_size))

    async def replay(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[Job]:
        return await self._run(Methods.replay(job_ids, job_type))

    async def purge(self, job_ids: Sequence[str] = (), *, job_type: str = "") -> list[str]:
        return await self._run(Methods.purge(job_ids, job_type))

    # -- per-type policies ----------------------------------------------------------------

    async def set_type_policy(
        self, job_type: str, *, retry: Retry | None = None, concurrency: int = 0
    ) -> TypePolicy:
        (done,) = await self._run(Methods.set_type_policies([(job_type, retry, concurrency)]))
        return done

    async def set_type_policies(
        self, policies: Sequence[tuple[str, Retry | None, int]]
    ) -> list[TypePolicy]:
        """Several at once: (job type, retry, cluster-wide concurrency) each."""
        return await self._run(Methods.set_type_policies(policies))

    # -- flow control of a type (admin role) ------------------------------------------------

    async def set_type_rate(self, job_type: str, rate: float, *, burst: int = 0) -> TypeInfo:
        """``Client.set_type_rate``."""
        return await self._run(Methods.set_type_flow(job_type, rate=rate, burst=burst))

    async def pause_type(self, job_type: str) -> TypeInfo:
        """``Client.pause_type``."""
        return await self._run(Methods.set_type_flow(job_type, paused=True))

    async def resume_type(self, job_type: str) -> TypeInfo:
        """``Client.resume_type``."""
        return await self._run(Methods.set_type_flow(job_type, paused=False))

    async def list_types(self, job_type: str = "") -> list[TypeInfo]:
        """``Client.list_types``."""
        return await self._run(Methods.list_types(job_type))

    # -- waiting for jobs -----------------------------------------------------------------

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """``Client.wait``."""
        return (await self.wait_many([job_id], timeout=timeout))[job_id]

    async def wait_many(
        self, job_ids: Iterable[str], timeout: float | None = None
    ) -> dict[str, Job]:
        """``Client.wait_many``."""
        ids = list(dict.fromkeys(job_ids))
        done = {job.job_id: job async for job in self.as_finished(ids, timeout=timeout)}
        return {job_id: done[job_id] for job_id in ids}

    async def as_finished(
        self, job_ids: Iterable[str], timeout: float | None = None
    ) -> AsyncIterator[Job]:
        """``Client.as_finished``: each job as soon as it is finished."""
        waiting = _Waiting(job_ids, timeout)
        while waiting.pending:
            req = waiting.request()
            try:
                call = self._jobs.WaitJobs(req, timeout=waiting.wait_s + self._timeout)
                async for resp in call:
                    yield waiting.got(resp.job)
            except grpc.RpcError as exc:
                delay = waiting.failed(translate(exc), self._retries)
                if delay:
                    await asyncio.sleep(delay)
            waiting.check_deadline()


class _Waiting:
    """What a wait for jobs has still to hear of, for both clients."""

    def __init__(self, job_ids: Iterable[str], timeout: float | None) -> None:
        self.pending = list(dict.fromkeys(job_ids))
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        self.unavailable = 0
        self.wait_s = 0.0

    def request(self) -> pb.WaitJobsRequest:
        left = MAX_WAIT_S if self.deadline is None else self.deadline - time.monotonic()
        self.wait_s = max(0.0, min(left, MAX_WAIT_S))
        return pb.WaitJobsRequest(
            job_ids=self.pending[:MAX_BATCH], timeout=dur(round(self.wait_s * 1000))
        )

    def got(self, msg: pb.Job) -> Job:
        self.pending.remove(msg.job_id)
        self.unavailable = 0
        return Job.from_pb(msg)

    def failed(self, err: TimeshardError, retries: int) -> float:
        """Seconds to wait before asking again, or raise ``err``."""
        if err.code is grpc.StatusCode.UNAVAILABLE and self.unavailable < retries:
            self.unavailable += 1
            return min(2.0, 0.1 * 2.0**self.unavailable)
        if err.code is not grpc.StatusCode.DEADLINE_EXCEEDED:
            raise err from None
        return 0.0  # the server's cap: ask again

    def check_deadline(self) -> None:
        if self.pending and self.deadline is not None and time.monotonic() >= self.deadline:
            raise WaitTimeout(self.pending, self.timeout or 0.0)
