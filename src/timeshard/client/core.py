"""``Client`` (blocking) and ``AsyncClient`` (asyncio): the same methods.

Both return the frozen records of ``timeshard.client.records`` (``Job``, ``Schedule``,
``DeadLetter``, ``Attempt``, ``FireTime``), and raise the errors of ``timeshard.errors``
(``NotFound``, ``InvalidArgument``, ``AlreadyExists``, ``Unavailable``...) mapped from the
gRPC status by the one table there. How a call travels, and when it goes again, is
``timeshard.client.transport``.

Each method is written once in ``timeshard.client.calls``, as the request it sends and how it
reads the reply, or as a few such steps (``put_schedule``, ``schedule_many``); the two clients
only carry them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import grpc
from typing_extensions import Unpack

from timeshard.client.calls import Methods
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
    Explanation,
    FireTime,
    Job,
    Schedule,
    Scheduled,
    ScheduleRevision,
    TypeInfo,
    TypePolicy,
)
from timeshard.client.transport import (
    OVERLOAD_BUDGET_S,
    OVERLOAD_RETRIES,
    AsyncTransport,
    SyncTransport,
)
from timeshard.model import JobState
from timeshard.security.channel import TlsArg

__all__ = ["AsyncClient", "Client"]

log = logging.getLogger("timeshard.client")  # the package's logger, as before the split


class _Warnings:
    """The job types whose warning a client has logged (once each)."""

    def __init__(self) -> None:
        self._types: set[str] = set()

    def noted(self, done: list[Scheduled]) -> list[Scheduled]:
        """``done``, its warnings logged, once per job type for this client."""
        for d in done:
            if d.warnings and d.job.job_type not in self._types:
                self._types.add(d.job.job_type)
                for text in d.warnings:
                    log.warning("job type %r: %s", d.job.job_type, text)
        return done


class Client(SyncTransport):
    """The blocking client (a channel per node it dialled). ``address`` defaults to
    ``TIMESHARD_SERVER``, ``tls`` to ``TIMESHARD_TLS_DIR`` and ``token`` to
    ``TIMESHARD_TOKEN``, as the CLI reads them; ``tls=False`` and ``token=""`` turn them off.

    ``retries``: repeats of a call cut off by UNAVAILABLE (when safe). ``overload_retries`` and
    ``overload_budget_s``: the budget of one ``schedule``/``schedule_many`` call refused by an
    overloaded node, repeats and seconds of waiting (each wait the one the node names, 1 s if
    none, at most 30 s); past it, ``ResourceExhausted``."""

    def __init__(
        self,
        address: str | None = None,
        *,
        tls: TlsArg = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        channel: grpc.Channel | None = None,
        overload_retries: int = OVERLOAD_RETRIES,
        overload_budget_s: float = OVERLOAD_BUDGET_S,
    ) -> None:
        self._setup(
            address, tls, token, timeout_s, retries, channel, overload_retries, overload_budget_s
        )
        self._warnings = _Warnings()

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
        type, and in ``Scheduled.warnings``. A node too busy for a job due now refuses it; it is
        sent again after the wait the node names, within the client's overload budget."""
        job = NewJob(job_type=job_type, payload=payload, **options)
        return self._warnings.noted([self._run(Methods.schedule(job))])[0]

    def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        """Schedule many jobs, ``batch_size`` per call (each call is all or nothing); what each
        did, in order. ``on_batch(n)`` is called after each batch with the count so far. A
        batch an overloaded node refuses goes again as ``schedule`` does."""
        return self._warnings.noted(self._steps(Methods.schedule_many(jobs, batch_size, on_batch)))

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
        reason: str = "",
        **options: Any,
    ) -> Schedule:
        """Create a cron schedule whose runs are ``job_type`` jobs with ``payload``. Options
        are those of ``ScheduleSpec`` (misfire, overlap, max_concurrent, jitter, ...). An
        ``schedule_id`` already taken is ``AlreadyExists``; without one the server picks it.
        ``reason`` (as on every change) is kept with the revision the change makes."""
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return self._run(Methods.create_schedule(spec.message(), reason))

    def update_schedule(
        self,
        schedule_id: str,
        job_type: str,
        *,
        cron: str,
        tz: str = "UTC",
        payload: Any = None,
        reason: str = "",
        **options: Any,
    ) -> Schedule:
        """Replace a schedule's spec, job and policies; it keeps its place (and its pause)."""
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return self._run(Methods.update_schedule(spec.message(), reason))

    def put_schedule(self, spec: ScheduleSpec) -> tuple[Schedule, str]:
        """Create or update by id, so that the schedule is as declared ("created", "updated"
        or "unchanged"); see ``Worker.cron``."""
        return self._steps(Methods.put_schedule(spec))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return self._run(Methods.get_schedule(schedule_id))

    def explain(
        self,
        schedule_id: str = "",
        at: datetime | None = None,
        *,
        job_id: str = "",
        recent: int = 0,
        local: datetime | None = None,
    ) -> Explanation:
        """Why the occurrence of ``schedule_id`` at ``at`` (an aware datetime), or the job
        ``job_id``, ran or did not (``timeshard why``); or at ``local``, a naive local time
        in the schedule's zone (one a DST gap skipped or a fold repeated is answered with the
        rule applied); ``recent``: also the schedule's latest ledger entries. ``NotFound`` for
        an unknown schedule or job."""
        return self._run(Methods.explain(schedule_id, at, job_id, recent, local))

    def list_schedules(self, *, page_size: int = 100) -> Iterator[Schedule]:
        return self._pages(Methods.list_schedules(page_size))

    def pause_schedule(self, schedule_id: str, *, reason: str = "") -> Schedule:
        return self._run(Methods.schedule_id_call("PauseSchedule", schedule_id, reason))

    def resume_schedule(self, schedule_id: str, *, reason: str = "") -> Schedule:
        return self._run(Methods.schedule_id_call("ResumeSchedule", schedule_id, reason))

    def delete_schedule(self, schedule_id: str, *, reason: str = "") -> int:
        """Returns the revision the delete made (its history stays for the ledger retention,
        then it is purged)."""
        return self._run(Methods.delete_schedule(schedule_id, reason))

    def schedule_history(self, schedule_id: str) -> Iterator[ScheduleRevision]:
        """The schedule's kept revisions, newest first."""
        return self._pages(Methods.schedule_history(schedule_id, 100))

    def schedule_revision(self, schedule_id: str, revision: int) -> ScheduleRevision:
        return self._run(Methods.schedule_revision(schedule_id, revision))

    def rollback_schedule(self, schedule_id: str, revision: int, *, reason: str = "") -> Schedule:
        """Make a new revision with revision ``revision``'s definition; returns the schedule
        (``.revision`` is the new one)."""
        return self._run(Methods.rollback_schedule(schedule_id, revision, reason))

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
        ids = list(dict.fromkeys(job_ids))
        done = {job.job_id: job for job in self.as_finished(ids, timeout=timeout)}
        return {job_id: done[job_id] for job_id in ids}

    def as_finished(self, job_ids: Iterable[str], timeout: float | None = None) -> Iterator[Job]:
        """Each job as soon as it is finished, in the order they finish. The server streams
        them (``WaitJobs``): nothing is polled from here; a wait longer than the server's cap
        is made of several calls."""
        for msg in self._finished(job_ids, timeout):
            yield Job.from_pb(msg)


class AsyncClient(AsyncTransport):
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
        overload_retries: int = OVERLOAD_RETRIES,
        overload_budget_s: float = OVERLOAD_BUDGET_S,
    ) -> None:
        self._setup(
            address, tls, token, timeout_s, retries, channel, overload_retries, overload_budget_s
        )
        self._warnings = _Warnings()

    # -- jobs -----------------------------------------------------------------------------

    async def schedule(
        self, job_type: str, payload: Any = None, **options: Unpack[JobOptionArgs]
    ) -> Scheduled:
        """See ``Client.schedule``."""
        job = NewJob(job_type=job_type, payload=payload, **options)
        return self._warnings.noted([await self._run(Methods.schedule(job))])[0]

    async def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        return self._warnings.noted(
            await self._steps(Methods.schedule_many(jobs, batch_size, on_batch))
        )

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
        reason: str = "",
        **options: Any,
    ) -> Schedule:
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return await self._run(Methods.create_schedule(spec.message(), reason))

    async def update_schedule(
        self,
        schedule_id: str,
        job_type: str,
        *,
        cron: str,
        tz: str = "UTC",
        payload: Any = None,
        reason: str = "",
        **options: Any,
    ) -> Schedule:
        spec = schedule_spec(job_type, cron, tz, schedule_id, payload, options)
        return await self._run(Methods.update_schedule(spec.message(), reason))

    async def put_schedule(self, spec: ScheduleSpec) -> tuple[Schedule, str]:
        return await self._steps(Methods.put_schedule(spec))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(Methods.get_schedule(schedule_id))

    async def explain(
        self,
        schedule_id: str = "",
        at: datetime | None = None,
        *,
        job_id: str = "",
        recent: int = 0,
        local: datetime | None = None,
    ) -> Explanation:
        """``Client.explain``."""
        return await self._run(Methods.explain(schedule_id, at, job_id, recent, local))

    def list_schedules(self, *, page_size: int = 100) -> AsyncIterator[Schedule]:
        return self._pages(Methods.list_schedules(page_size))

    async def pause_schedule(self, schedule_id: str, *, reason: str = "") -> Schedule:
        return await self._run(Methods.schedule_id_call("PauseSchedule", schedule_id, reason))

    async def resume_schedule(self, schedule_id: str, *, reason: str = "") -> Schedule:
        return await self._run(Methods.schedule_id_call("ResumeSchedule", schedule_id, reason))

    async def delete_schedule(self, schedule_id: str, *, reason: str = "") -> int:
        return await self._run(Methods.delete_schedule(schedule_id, reason))

    def schedule_history(self, schedule_id: str) -> AsyncIterator[ScheduleRevision]:
        return self._pages(Methods.schedule_history(schedule_id, 100))

    async def schedule_revision(self, schedule_id: str, revision: int) -> ScheduleRevision:
        return await self._run(Methods.schedule_revision(schedule_id, revision))

    async def rollback_schedule(
        self, schedule_id: str, revision: int, *, reason: str = ""
    ) -> Schedule:
        return await self._run(Methods.rollback_schedule(schedule_id, revision, reason))

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
        async for msg in self._finished(job_ids, timeout):
            yield Job.from_pb(msg)
