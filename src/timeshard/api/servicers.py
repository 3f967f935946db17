"""gRPC servicers: validate, call the node, map our errors to status codes (one table, in
errors.py). A person gets a message to act on, never a stack trace.

Here: that mapping, which every servicer's methods are wrapped in (``rpc``, ``stream_rpc``), and
``JobService``. The others stand beside it: ``WorkerService`` in ``api.workers``,
``AdminService`` in ``api.admin``, ``PeerService`` in ``api.peers``."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from timeshard.api.explain import explain
from timeshard.api.queries import job_query_from_pb
from timeshard.api.replies import fit_page, fit_written
from timeshard.api.scheduling import job_spec, warnings_pb
from timeshard.cron import CronSpec
from timeshard.errors import (
    RETRY_AFTER_KEY,
    InvalidArgument,
    ResourceExhausted,
    TimeshardError,
    status_of,
)
from timeshard.limits import (
    MAX_BATCH,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_PAGE_TOKEN_BYTES,
    MAX_WAIT_S,
    REVISIONS_KEPT,
    check_bytes,
    check_count,
    check_range,
)
from timeshard.model import (
    ANONYMOUS,
    Job,
    Schedule,
    ScheduleRevision,
    validate_job_id,
    validate_job_type,
)
from timeshard.node import Node
from timeshard.node.scheduleops import new_schedule_id
from timeshard.security.auth import Authenticator, bearer_token
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import (
    dur_s,
    job_to_pb,
    revision_to_pb,
    run_at_of,
    schedule_from_pb,
    schedule_to_pb,
    ts,
    ts_ms,
)

log = logging.getLogger(__name__)
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Req, Ctx], Awaitable[Resp]]


def rpc(fn: Handler[Req, Resp]) -> Handler[Req, Resp]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            return await fn(self, request, context)
        except ResourceExhausted as exc:
            context.set_trailing_metadata(((RETRY_AFTER_KEY, str(exc.retry_after_ms)),))
            await context.abort(status_of(exc), exc.message)
        except TimeshardError as exc:
            await context.abort(status_of(exc), exc.message)
        except ValueError as exc:  # a value object refused its input
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("unreachable: context.abort raises")

    return wrapper


StreamHandler = Callable[[Any, Req, Ctx], AsyncIterator[Resp]]


def stream_rpc(fn: StreamHandler[Req, Resp]) -> StreamHandler[Req, Resp]:
    """``rpc`` for a method that streams its reply: an error ends the stream with its status
    (what was sent before stays sent)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except TimeshardError as exc:
            await context.abort(status_of(exc), exc.message)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    return wrapper


DEFAULT_REVISIONS_PAGE = 20


class JobService(pb_grpc.JobServiceServicer):
    def __init__(self, node: Node, auth: Authenticator | None = None) -> None:
        self.node = node
        self.auth = auth

    def _actor(self, context: Ctx) -> str:
        """Who makes a change to a schedule: the name of the caller's token (checked by the
        auth interceptor before the call got here), or "anonymous" on a node without tokens."""
        if self.auth is None:
            return ANONYMOUS
        token, _ = bearer_token(list(context.invocation_metadata() or ()))
        entry = self.auth.table.find(token) if token else None
        return entry.name if entry is not None else ANONYMOUS

    @rpc
    async def ScheduleJob(
        self, request: pb.ScheduleJobRequest, context: Ctx
    ) -> pb.ScheduleJobResponse:
        spec = job_spec(request, self.node.clock.now_ms())
        ((job, created),) = await self.node.jobs.schedule_many([spec])  # which checks every field
        warnings = warnings_pb(self.node.polled, [job.job_type])
        return pb.ScheduleJobResponse(job=job_to_pb(job), created=created, warnings=warnings)

    @rpc
    async def ScheduleJobs(
        self, request: pb.ScheduleJobsRequest, context: Ctx
    ) -> pb.ScheduleJobsResponse:
        check_count("jobs", len(request.jobs), MAX_BATCH)
        now = self.node.clock.now_ms()
        specs = []
        for i, r in enumerate(request.jobs):
            try:
                _check_key(r.idempotency_key)
                specs.append(job_spec(r, now))
            except InvalidArgument as exc:
                raise InvalidArgument(f"jobs[{i}].{exc.field}", exc.problem) from None
        results = await self.node.jobs.schedule_many(specs)
        jobs = fit_written([job_to_pb(j) for j, _ in results])
        return pb.ScheduleJobsResponse(
            results=[
                pb.ScheduleJobResponse(job=j, created=c)
                for j, (_, c) in zip(jobs, results, strict=True)
            ],
            warnings=warnings_pb(self.node.polled, (j.job_type for j, _ in results)),
        )

    @rpc
    async def GetJob(self, request: pb.GetJobRequest, context: Ctx) -> pb.Job:
        return job_to_pb(await self.node.jobs.get(request.job_id))

    @rpc
    async def ListJobs(self, request: pb.ListJobsRequest, context: Ctx) -> pb.ListJobsResponse:
        query = job_query_from_pb(request)
        token = _check_token(request.page_token)
        total = 0

        async def read(limit: int) -> tuple[list[Job], str]:
            nonlocal total
            page = await self.node.jobs.find_jobs(query, limit=limit, page_token=token)
            total = page.total or 0
            return page.jobs, page.next_token

        jobs, next_token = await fit_page(read, request.page_size, job_to_pb)
        return pb.ListJobsResponse(jobs=jobs, next_page_token=next_token, total=total)

    @rpc
    async def CancelJob(self, request: pb.CancelJobRequest, context: Ctx) -> pb.Job:
        remaining = context.time_remaining()  # (None: the caller set no deadline)
        wait_s = 30.0 if remaining is None else max(0.0, remaining - 0.5)
        return job_to_pb(await self.node.jobs.cancel(request.job_id, wait_s=wait_s))

    @rpc
    async def RescheduleJob(self, request: pb.RescheduleJobRequest, context: Ctx) -> pb.Job:
        run_at = run_at_of(request, self.node.clock.now_ms(), required=True)
        return job_to_pb(await self.node.jobs.reschedule(request.job_id, run_at))

    @rpc
    async def CreateSchedule(self, request: pb.CreateScheduleRequest, context: Ctx) -> pb.Schedule:
        sid = request.schedule.schedule_id or new_schedule_id()
        created = await self.node.schedules.create(
            schedule_from_pb(request.schedule, sid),
            actor=self._actor(context),
            reason=request.reason,
        )
        return schedule_to_pb(created)

    @rpc
    async def GetSchedule(self, request: pb.GetScheduleRequest, context: Ctx) -> pb.Schedule:
        return schedule_to_pb(await self.node.schedules.get(request.schedule_id))

    @rpc
    async def ListSchedules(
        self, request: pb.ListSchedulesRequest, context: Ctx
    ) -> pb.ListSchedulesResponse:
        token = _check_token(request.page_token)

        async def read(limit: int) -> tuple[list[Schedule], str]:
            return await self.node.schedules.list_schedules(limit, token)

        found, next_token = await fit_page(read, request.page_size, schedule_to_pb)
        return pb.ListSchedulesResponse(schedules=found, next_page_token=next_token)

    @rpc
    async def UpdateSchedule(self, request: pb.UpdateScheduleRequest, context: Ctx) -> pb.Schedule:
        sid = request.schedule.schedule_id
        if not sid:
            raise InvalidArgument("schedule_id", "name the schedule to update")
        await self.node.schedules.get(sid)
        updated = await self.node.schedules.update(
            schedule_from_pb(request.schedule, sid),
            actor=self._actor(context),
            reason=request.reason,
        )
        return schedule_to_pb(updated)

    @rpc
    async def PauseSchedule(self, request: pb.ScheduleIdRequest, context: Ctx) -> pb.Schedule:
        paused = await self.node.schedules.pause(
            request.schedule_id, actor=self._actor(context), reason=request.reason
        )
        return schedule_to_pb(paused)

    @rpc
    async def ResumeSchedule(self, request: pb.ScheduleIdRequest, context: Ctx) -> pb.Schedule:
        resumed = await self.node.schedules.resume(
            request.schedule_id, actor=self._actor(context), reason=request.reason
        )
        return schedule_to_pb(resumed)

    @rpc
    async def DeleteSchedule(
        self, request: pb.ScheduleIdRequest, context: Ctx
    ) -> pb.DeleteScheduleResponse:
        gone = await self.node.schedules.delete(
            request.schedule_id, actor=self._actor(context), reason=request.reason
        )
        return pb.DeleteScheduleResponse(revision=gone.revision)

    @rpc
    async def PreviewSchedule(self, request: pb.PreviewRequest, context: Ctx) -> pb.PreviewResponse:
        spec = CronSpec(
            expression=request.cron,
            timezone=request.timezone,
            dst_gap=request.dst_gap or None,  # type: ignore[arg-type]
            dst_fold=request.dst_fold or None,  # type: ignore[arg-type]
        )
        after = ts_ms(getattr(request, "from"))
        if request.spread.seconds < 0 or request.spread.nanos < 0:
            raise InvalidArgument("spread", "must not be negative")
        entries = self.node.schedules.preview(
            spec,
            after or self.node.clock.now_ms(),
            request.count or 10,
            schedule_id=request.schedule_id,
            spread_ms=round(dur_s(request.spread) * 1000),
        )
        return pb.PreviewResponse(
            times=[
                pb.FireTime(
                    utc=ts(e.fire.at_ms),
                    local=e.fire.local,
                    note=e.fire.note or "",
                    runs_at=ts(e.runs_at),
                    runs_at_local=e.runs_at_local,
                )
                for e in entries
            ]
        )

    @rpc
    async def ListDeadLetters(
        self, request: pb.ListDeadLettersRequest, context: Ctx
    ) -> pb.ListDeadLettersResponse:
        job_type = type_filter(request.type)
        since_ms = ts_ms(request.since) if request.HasField("since") else 0
        token = _check_token(request.page_token)

        async def read(limit: int) -> tuple[list[Job], str]:
            page = await self.node.dead_letters.page(
                job_type=job_type, since_ms=since_ms, limit=limit, page_token=token
            )
            return page.jobs, page.next_token

        jobs, next_token = await fit_page(read, request.page_size, job_to_pb)
        return pb.ListDeadLettersResponse(jobs=jobs, next_page_token=next_token)

    @rpc
    async def ReplayDeadLetters(
        self, request: pb.ReplayDeadLettersRequest, context: Ctx
    ) -> pb.ReplayDeadLettersResponse:
        job_ids, job_type = _dead_letter_selection(request)
        jobs = await self.node.dead_letters.replay(job_ids, job_type)
        return pb.ReplayDeadLettersResponse(jobs=fit_written([job_to_pb(j) for j in jobs]))

    @rpc
    async def PurgeDeadLetters(
        self, request: pb.ReplayDeadLettersRequest, context: Ctx
    ) -> pb.PurgeDeadLettersResponse:
        job_ids, job_type = _dead_letter_selection(request)
        jobs = await self.node.dead_letters.purge(job_ids, job_type)
        return pb.PurgeDeadLettersResponse(job_ids=[j.job_id for j in jobs])

    @rpc
    async def ListScheduleRevisions(
        self, request: pb.ListScheduleRevisionsRequest, context: Ctx
    ) -> pb.ListScheduleRevisionsResponse:
        below = _revision_token(request.page_token)
        check_range("page_size", request.page_size, 0, REVISIONS_KEPT)

        async def read(limit: int) -> tuple[list[ScheduleRevision], str]:
            # One more than the page, to know whether another follows; only these are read.
            found = await self.node.schedules.history(
                request.schedule_id, below=below, limit=limit + 1
            )
            page = found[:limit]
            return page, str(page[-1].revision) if len(found) > len(page) and page else ""

        revisions, token = await fit_page(
            read, request.page_size or DEFAULT_REVISIONS_PAGE, revision_to_pb
        )
        return pb.ListScheduleRevisionsResponse(revisions=revisions, next_page_token=token)

    @rpc
    async def GetScheduleRevision(
        self, request: pb.GetScheduleRevisionRequest, context: Ctx
    ) -> pb.ScheduleRevision:
        found = await self.node.schedules.revision(request.schedule_id, request.revision)
        return revision_to_pb(found)

    @rpc
    async def RollbackSchedule(
        self, request: pb.RollbackScheduleRequest, context: Ctx
    ) -> pb.Schedule:
        rolled = await self.node.schedules.rollback(
            request.schedule_id,
            request.revision,
            actor=self._actor(context),
            reason=request.reason,
        )
        return schedule_to_pb(rolled)

    @stream_rpc
    async def WaitJobs(
        self, request: pb.WaitJobsRequest, context: Ctx
    ) -> AsyncIterator[pb.WaitJobsResponse]:
        job_ids = wait_ids(request.job_ids)
        timeout_s: float = MAX_WAIT_S
        if request.HasField("timeout"):
            if request.timeout.seconds < 0 or request.timeout.nanos < 0:
                raise InvalidArgument("timeout", "must not be negative (0s: only what is done)")
            timeout_s = min(dur_s(request.timeout), MAX_WAIT_S)
        async for job in self.node.wait(job_ids, timeout_s):
            yield pb.WaitJobsResponse(job=job_to_pb(job))

    @rpc
    async def ExplainOccurrence(
        self, request: pb.ExplainOccurrenceRequest, context: Ctx
    ) -> pb.ExplainOccurrenceResponse:
        return await explain(self.node.explain, request)


def wait_ids(given: Sequence[str]) -> list[str]:
    """The ids of a wait, each once, in the order given."""
    if not given:
        raise InvalidArgument("job_ids", "name at least one job to wait for")
    check_count("job_ids", len(given), MAX_BATCH)
    for n, job_id in enumerate(given):
        try:
            validate_job_id(job_id)
        except InvalidArgument as exc:
            raise InvalidArgument(f"job_ids[{n}]", exc.problem) from None
    return list(dict.fromkeys(given))


def _check_key(key: str) -> str:
    return check_bytes("idempotency_key", key, MAX_IDEMPOTENCY_KEY_BYTES)


def _revision_token(token: str) -> int | None:
    """The revision a page of revisions goes on below (None: from the newest)."""
    if not token:
        return None
    if not token.isdigit() or len(token) > 19:
        raise InvalidArgument(
            "page_token", f"{token[:40]!r} is not a token ListScheduleRevisions gave out"
        )
    return int(token)


def _check_token(token: str) -> str:
    return check_bytes("page_token", token, MAX_PAGE_TOKEN_BYTES)


def type_filter(job_type: str) -> str | None:
    return validate_job_type(job_type) if job_type else None


def _dead_letter_selection(request: pb.ReplayDeadLettersRequest) -> tuple[list[str], str | None]:
    check_count("job_ids", len(request.job_ids), MAX_BATCH)
    if request.job_ids and request.type:
        # Named jobs are taken whatever their type: a type beside them was silently ignored.
        raise InvalidArgument("type", "give job_ids or a type, not both")
    for n, job_id in enumerate(request.job_ids):
        try:
            validate_job_id(job_id)
        except InvalidArgument as exc:
            raise InvalidArgument(f"job_ids[{n}]", exc.problem) from None
    return list(request.job_ids), type_filter(request.type)
