"""What every worker stream of a node shares (``timeshard.api.work``): the heartbeats and
results of each stream's requests, applied together with those of every other stream arriving
meanwhile (``batching.GroupCommit``), and each request's answer, a result per item. The
conversion of one result's outcome to its wire answer (``finish_result``) serves the unary
``Finish`` too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from timeshard.batching import GroupCommit
from timeshard.errors import TimeshardError, status_of
from timeshard.model import Job
from timeshard.node import Beat, FinishItem, Node
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, state_to_pb, ts

GROUP_REQUESTS = 256
"""Requests (each up to ``MAX_BATCH`` heartbeats and results) applied in one group."""

FinishItems = Callable[[Sequence[pb.FinishItem], str], list[FinishItem | TimeshardError]]
"""The API's conversion of wire results (shared with ``Finish``), the field prefix for errors."""


@dataclass(slots=True)
class StreamRequest:
    """The heartbeats and results of one request of a stream, and where its answer goes."""

    answer: Callable[[pb.WorkResponse], None]
    seq: int
    heartbeats: list[Beat | TimeshardError]
    results: list[FinishItem | TimeshardError]
    asked: Sequence[pb.FinishItem] = field(default_factory=list)


class WorkHub:
    """What every stream of one node shares: the group commit of heartbeats and results."""

    def __init__(self, node: Node, finish_items: FinishItems) -> None:
        self.node = node
        self.finish_items = finish_items
        self._groups: GroupCommit[int, StreamRequest] = GroupCommit(
            self._apply, max_items=GROUP_REQUESTS, fail=_fail_group, name="work"
        )
        messages = node.metrics.worker_stream_messages
        self.read, self.written = messages.labels("in"), messages.labels("out")

    def submit(self, group: StreamRequest) -> None:
        self._groups.submit(0, group)

    async def _apply(self, key: int, groups: list[StreamRequest]) -> None:
        beats = [h for g in groups for h in g.heartbeats if not isinstance(h, TimeshardError)]
        items = [i for g in groups for i in g.results if not isinstance(i, TimeshardError)]
        beat_out, finish_out = await asyncio.gather(
            self.node.attempts.heartbeats(beats) if beats else _nothing(),
            self.node.attempts.finish(items, beside_beats=bool(beats)) if items else _nothing(),
        )
        beats_done, finish_done = iter(beat_out), iter(finish_out)
        for g in groups:
            hb = [_beat_result(h, beats_done) for h in g.heartbeats]
            res = [
                finish_result(i, a, finish_done) for i, a in zip(g.results, g.asked, strict=True)
            ]
            g.answer(pb.WorkResponse(seq=g.seq, heartbeats=hb, results=res))

    async def close(self) -> None:
        await self._groups.close()


async def _nothing() -> list[Any]:
    return []


def _fail_group(group: StreamRequest, exc: BaseException) -> None:
    """A group that could not be applied (the store failed under it): each item is answered
    UNAVAILABLE, to be sent again (a result may have applied: its retry is refused as stale)."""
    if isinstance(exc, asyncio.CancelledError):
        return
    why = exc.message if isinstance(exc, TimeshardError) else "the node could not apply it"
    code = grpc.StatusCode.UNAVAILABLE.value[0]
    group.answer(
        pb.WorkResponse(
            seq=group.seq,
            heartbeats=[
                pb.HeartbeatResult(job_id=_job_of(h), code=code, message=why)
                for h in group.heartbeats
            ],
            results=[pb.FinishResult(job_id=a.job_id, code=code, message=why) for a in group.asked],
        )
    )


def _job_of(beat: Beat | TimeshardError) -> str:
    return "" if isinstance(beat, TimeshardError) else beat.job_id


def _beat_result(asked: Beat | TimeshardError, done: Any) -> pb.HeartbeatResult:
    out = asked if isinstance(asked, TimeshardError) else next(done)
    if isinstance(out, TimeshardError):
        return pb.HeartbeatResult(
            job_id=_job_of(asked), code=status_of(out).value[0], message=out.message
        )
    job, lease = out
    return pb.HeartbeatResult(
        job_id=job.job_id,
        lease=pb.HeartbeatResponse(lease_until=ts(job.lease_until), lease=dur(lease)),
    )


def finish_result(
    item: FinishItem | TimeshardError, asked: pb.FinishItem, done: Any
) -> pb.FinishResult:
    """The answer to result ``asked``: its refusal, or the next of ``done`` (the node's answers
    to the items it took, in order). A completion whose result could not be stored was recorded
    as a permanent failure: INVALID_ARGUMENT, with the job's state."""
    out: Job | TimeshardError = item if isinstance(item, TimeshardError) else next(done)
    if isinstance(out, TimeshardError):
        code = status_of(out).value[0]
        return pb.FinishResult(job_id=asked.job_id, code=code, message=out.message)
    if isinstance(item, FinishItem) and item.refused:  # its result could not be stored
        return pb.FinishResult(
            job_id=asked.job_id,
            code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
            message=f"{item.refused}; the attempt was recorded as failed (the job is "
            f"{out.state.value})",
            state=state_to_pb(out.state),
        )
    return pb.FinishResult(job_id=asked.job_id, state=state_to_pb(out.state))
