"""``WorkerService``: the unary calls of a worker (claim, heartbeat, complete, finish, fail)
and the worker stream it opens (``Work``: ``api.work``), each validated and handed to the node's
claims and attempts; and the wire results read as the node's ``FinishItem``s, shared by
``Finish`` and the stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from timeshard.api.replies import claim_cap
from timeshard.api.servicers import Ctx, rpc
from timeshard.api.work import WorkStream
from timeshard.api.workhub import WorkHub, finish_result
from timeshard.errors import InvalidArgument, TimeshardError
from timeshard.limits import MAX_BATCH, MAX_CLAIM_JOBS, MAX_CLAIM_TYPES, check_count, truncate_error
from timeshard.model import validate_job_id, validate_result, validate_worker_id
from timeshard.node import FinishItem, Node
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import claimed_to_pb, dur, dur_s, started_at_of, ts


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
        self.node.workers.claimed(request.worker_id, list(request.types), request.max_jobs or 1)
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
