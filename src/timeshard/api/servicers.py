"""gRPC servicers: validate, call the node, map our errors to status codes (one table, in
errors.py). A person gets a message to act on, never a stack trace."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from timeshard.api.queries import job_query_from_pb
from timeshard.api.replies import claim_cap, fit_page, fit_written
from timeshard.api.scheduling import job_spec, warnings_pb
from timeshard.api.status import node_status_to_pb
from timeshard.api.work import WorkStream
from timeshard.api.workhub import WorkHub, finish_result
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
    MAX_CLAIM_JOBS,
    MAX_CLAIM_TYPES,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_NODE_ID_BYTES,
    MAX_PAGE_TOKEN_BYTES,
    MAX_WAIT_S,
    check_bytes,
    check_count,
    truncate_error,
)
from timeshard.model import (
    Job,
    Schedule,
    validate_job_id,
    validate_job_type,
    validate_result,
    validate_worker_id,
)
from timeshard.node import FinishItem, Node, TypePolicy
from timeshard.node.flow import FlowChange
from timeshard.node.policies import checked_policy
from timeshard.node.retry import RetryPolicy
from timeshard.node.schedules import new_schedule_id
from timeshard.observe.window import DEFAULT_WINDOW_S
from timeshard.sharding import minute_start
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.status import TypeRow, node_status, shard_rows, type_rows
from timeshard.wire import (
    claimed_to_pb,
    dur,
    dur_s,
    job_to_pb,
    run_at_of,
    schedule_from_pb,
    schedule_to_pb,
    started_at_of,
    ts,
    ts_ms,
    type_policy_to_pb,
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


class JobService(pb_grpc.JobServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

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
        created = await self.node.schedules.create(schedule_from_pb(request.schedule, sid))
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
        updated = await self.node.schedules.update(schedule_from_pb(request.schedule, sid))
        return schedule_to_pb(updated)

    @rpc
    async def PauseSchedule(self, request: pb.ScheduleIdRequest, context: Ctx) -> pb.Schedule:
        return schedule_to_pb(await self.node.schedules.pause(request.schedule_id))

    @rpc
    async def ResumeSchedule(self, request: pb.ScheduleIdRequest, context: Ctx) -> pb.Schedule:
        return schedule_to_pb(await self.node.schedules.resume(request.schedule_id))

    @rpc
    async def DeleteSchedule(
        self, request: pb.ScheduleIdRequest, context: Ctx
    ) -> pb.DeleteScheduleResponse:
        await self.node.schedules.delete(request.schedule_id)
        return pb.DeleteScheduleResponse()

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
        job_type = _type_filter(request.type)
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


class WorkerService(pb_grpc.WorkerServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node
        self._hub = WorkHub(node, finish_items)

    @rpc
    async def Claim(self, request: pb.ClaimRequest, context: Ctx) -> pb.ClaimResponse:
        self.node.metrics.claim_message()
        validate_worker_id(request.worker_id)
        check_count("types", len(request.types), MAX_CLAIM_TYPES)
        if not 0 <= request.max_jobs <= MAX_CLAIM_JOBS:
            raise InvalidArgument(
                "max_jobs", f"must be 1-{MAX_CLAIM_JOBS} (0: one), got {request.max_jobs}"
            )
        if request.wait.seconds < 0 or request.wait.nanos < 0:
            raise InvalidArgument("wait", "must not be negative (0s answers at once)")
        self.node.polled.asked(request.types)
        claimed = await self.node.claims.claim(
            worker=request.worker_id,
            types=list(request.types),
            # Granted in part beyond what fits in the reply: its claims are written first.
            limit=min(request.max_jobs or 1, claim_cap(request.max_reply_bytes)),
            wait_s=dur_s(request.wait),
            lease_s=dur_s(request.lease),
        )
        return pb.ClaimResponse(jobs=[claimed_to_pb(c.job, c.lease_ms) for c in claimed])

    @rpc
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Ctx) -> pb.HeartbeatResponse:
        validate_job_id(request.job_id)
        job, lease = await self.node.attempts.heartbeat(
            request.job_id,
            request.fence,
            dur_s(request.lease),
            started_at=started_at_of(request, self.node.clock.now_ms()),
        )
        return pb.HeartbeatResponse(lease_until=ts(job.lease_until), lease=dur(lease))

    @rpc
    async def Complete(self, request: pb.CompleteRequest, context: Ctx) -> pb.CompleteResponse:
        self.node.metrics.result_message(1)
        await self.node.attempts.complete(validate_job_id(request.job_id), request.fence)
        return pb.CompleteResponse()

    @rpc
    async def Finish(self, request: pb.FinishRequest, context: Ctx) -> pb.FinishResponse:
        self.node.metrics.result_message(len(request.items))
        check_count("items", len(request.items), MAX_BATCH)
        for n, i in enumerate(request.items):  # a malformed id fails the call (the stream:
            try:  # only its item)
                validate_job_id(i.job_id)
            except InvalidArgument as exc:
                raise InvalidArgument(f"items[{n}].{exc.field}", exc.problem) from None
        items = finish_items(request.items, "items")
        done = iter(
            await self.node.attempts.finish([i for i in items if isinstance(i, FinishItem)])
        )
        results = [finish_result(i, a, done) for i, a in zip(items, request.items, strict=True)]
        return pb.FinishResponse(results=results)

    @rpc
    async def Fail(self, request: pb.FailRequest, context: Ctx) -> pb.FailResponse:
        self.node.metrics.result_message(1)
        job = await self.node.attempts.fail(
            validate_job_id(request.job_id),
            request.fence,
            truncate_error(request.error),
            request.permanent,
        )
        resp = pb.FailResponse(state=pb.JOB_STATE_DEAD)
        if job.next_attention() is not None:
            resp = pb.FailResponse(state=pb.JOB_STATE_SCHEDULED, retry_at=ts(job.run_at))
        return resp

    async def Work(self, request_iterator: Any, context: Ctx) -> None:  # type: ignore[override]
        """The worker stream (``timeshard.api.work``; docs/architecture.md). It reads and
        writes through ``context`` rather than returning an iterator."""
        await WorkStream(self._hub, context).run()


def finish_items(asked: Sequence[pb.FinishItem], where: str) -> list[FinishItem | TimeshardError]:
    """Results as the node takes them, or the error of each one refused on its own (a malformed
    job id, a second result for one job) named ``where[n]``."""
    items: list[FinishItem | TimeshardError] = []
    first: dict[str, int] = {}
    for n, i in enumerate(asked):
        try:
            validate_job_id(i.job_id)
        except InvalidArgument as exc:
            items.append(InvalidArgument(f"{where}[{n}].{exc.field}", exc.problem))
            continue
        if first.setdefault(i.job_id, n) != n:
            # A second result for one job would race the first in one group commit, the
            # outcome left to their order: it is refused on its own, the first one stands.
            items.append(
                InvalidArgument(
                    f"{where}[{n}].job_id",
                    f"job {i.job_id!r} is also {where}[{first[i.job_id]}]: one result per job",
                )
            )
            continue
        items.append(_finish_item(f"{where}[{n}]", i))
    return items


class AdminService(pb_grpc.AdminServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    @rpc
    async def ClusterInfo(
        self, request: pb.ClusterInfoRequest, context: Ctx
    ) -> pb.ClusterInfoResponse:
        members = await self.node.coordinator.members()
        return pb.ClusterInfoResponse(
            nodes=[pb.Node(node_id=m.node_id, address=m.address) for m in members],
            num_shards=self.node.num_shards,
        )

    @rpc
    async def ShardOwners(
        self, request: pb.ShardOwnersRequest, context: Ctx
    ) -> pb.ShardOwnersResponse:
        """Every shard: its owner by the coordinator, its epoch and cursor by the store, and
        this node's own view of the shards it owns (``views.status.shard_rows``)."""
        owners = await self.node.coordinator.owners()
        now = self.node.clock.now_ms()
        out = []
        for row in shard_rows(self.node, owners):
            state = await self.node.store.get_shard(row.shard)
            cursor_ms = minute_start(state.cursor)
            out.append(
                pb.ShardInfo(
                    shard=row.shard,
                    owner=owners.get(row.shard, ""),
                    epoch=state.epoch,
                    cursor=ts(cursor_ms),
                    cursor_lag_ms=max(0, now - cursor_ms) if state.epoch else 0,
                    ready=row.ready,
                    in_memory=row.in_memory,
                    due=row.due,
                    dispatch_lag_ms=row.lag_ms,
                )
            )
        return pb.ShardOwnersResponse(shards=out)

    @rpc
    async def NodeStatus(
        self, request: pb.NodeStatusRequest, context: Ctx
    ) -> pb.NodeStatusResponse:
        window_s = dur_s(request.window) if request.HasField("window") else DEFAULT_WINDOW_S
        if not 10 <= window_s <= 900:
            raise InvalidArgument("window", f"must be 10 s to 15 min, got {window_s:g} s")
        return node_status_to_pb(await node_status(self.node, window_s))

    @rpc
    async def MoveShard(self, request: pb.MoveShardRequest, context: Ctx) -> pb.MoveShardResponse:
        check_bytes("to_node", request.to_node, MAX_NODE_ID_BYTES)
        await self.node.coordinator.move_shard(request.shard, request.to_node)
        return pb.MoveShardResponse()

    @rpc
    async def DrainNode(self, request: pb.DrainNodeRequest, context: Ctx) -> pb.DrainNodeResponse:
        check_bytes("node_id", request.node_id, MAX_NODE_ID_BYTES)
        moved = await self.node.coordinator.drain_node(request.node_id)
        return pb.DrainNodeResponse(moved=moved)

    @rpc
    async def SetTypePolicies(
        self, request: pb.SetTypePoliciesRequest, context: Ctx
    ) -> pb.SetTypePoliciesResponse:
        policies = [
            (p.type, _type_policy(n, p, self.node.config.retry))
            for n, p in enumerate(request.policies)
        ]
        now = await self.node.type_policies.set(policies)
        return pb.SetTypePoliciesResponse(
            policies=[type_policy_to_pb(t, now[t]) for t, _ in policies]
        )

    @rpc
    async def SetTypeFlows(
        self, request: pb.SetTypeFlowsRequest, context: Ctx
    ) -> pb.SetTypeFlowsResponse:
        changes = [_flow_change(n, f) for n, f in enumerate(request.flows)]
        await self.node.type_policies.set_flows(changes)
        rows = {r.job_type: r for r in type_rows(self.node)}
        return pb.SetTypeFlowsResponse(
            types=[_type_row_to_pb(rows[c.job_type]) for c in changes if c.job_type in rows]
        )

    @rpc
    async def ListTypes(self, request: pb.ListTypesRequest, context: Ctx) -> pb.ListTypesResponse:
        job_type = _type_filter(request.type) or ""
        await self.node.type_policies.load()  # what another node was told just now
        return pb.ListTypesResponse(
            types=[_type_row_to_pb(r) for r in type_rows(self.node, job_type)]
        )


def _finish_item(name: str, i: pb.FinishItem) -> FinishItem:
    """Result ``name`` for the node; a completion whose result can not be stored becomes a
    permanent failure saying why (``FinishItem.refused``)."""
    item = FinishItem(
        job_id=i.job_id,
        fence=i.fence,
        failed=i.failed,
        error=truncate_error(i.error),
        permanent=i.permanent,
        give_back=i.give_back,
        not_started=i.give_back and i.not_started,
        result=i.result,
        result_encoding=i.result_encoding,
        traceback=i.traceback,
    )
    if i.failed or i.give_back:
        return item
    try:
        validate_result(i.result, i.result_encoding)
    except InvalidArgument as exc:
        return _result_refused(item, InvalidArgument(f"{name}.{exc.field}", exc.problem))
    return item


def _result_refused(item: FinishItem, error: InvalidArgument) -> FinishItem:
    """A completion whose result can not be stored: a permanent failure that says why. The
    handler ran and would return the same again, so a retry would only repeat its effects."""
    return FinishItem(
        job_id=item.job_id,
        fence=item.fence,
        failed=True,
        permanent=True,
        error=truncate_error(f"ResultError: the result was not stored: {error.problem}"),
        refused=error.message,
    )


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


def _check_token(token: str) -> str:
    return check_bytes("page_token", token, MAX_PAGE_TOKEN_BYTES)


def _type_filter(job_type: str) -> str | None:
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
    return list(request.job_ids), _type_filter(request.type)


def _type_policy(n: int, p: pb.TypePolicy, default_retry: RetryPolicy) -> TypePolicy:
    try:
        for name in ("retry_base", "retry_max"):
            d = getattr(p, name)
            if d.seconds < 0 or d.nanos < 0:
                raise InvalidArgument(name, "must not be negative")
        return checked_policy(
            p.type,
            max_attempts=p.max_attempts,
            retry_base_s=dur_s(p.retry_base),
            retry_max_s=dur_s(p.retry_max),
            concurrency=p.concurrency,
            default_retry=default_retry,
            max_unstarted=p.max_unstarted,
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"policies[{n}].{exc.field}", exc.problem) from None


def _flow_change(n: int, f: pb.TypeFlow) -> FlowChange:
    try:
        return FlowChange(
            job_type=validate_job_type(f.type),
            rate=f.rate if f.HasField("rate") else None,
            burst=f.burst,
            paused=f.paused if f.HasField("paused") else None,
        )
    except InvalidArgument as exc:
        field = f"flows[{n}]" if exc.field == "flow" else f"flows[{n}].{exc.field}"
        raise InvalidArgument(field, exc.problem) from None


def _type_row_to_pb(row: TypeRow) -> pb.TypeInfo:
    flow, waiting = row.flow, row.waiting
    return pb.TypeInfo(
        type=row.job_type,
        policy=type_policy_to_pb(row.job_type, row.policy) if row.policy else None,
        rate=flow.rate or 0.0,
        burst=flow.size or 0,
        paused=flow.paused,
        ready=waiting.jobs,
        held=waiting.held,
        oldest_age_ms=waiting.oldest_age_ms,
    )
