"""ScheduleJob and ScheduleJobs requests to the node's ``JobSpec``, and the warnings their
replies carry (``node.polled``: a type no worker has asked this node for lately)."""

from __future__ import annotations

from collections.abc import Iterable

from timeshard.errors import InvalidArgument
from timeshard.node import JobSpec
from timeshard.node.polled import PolledTypes
from timeshard.node.repeats import AskedTime, IfExists
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import deadline_of, run_at_of, ts_ms

_IF_EXISTS = {
    pb.IF_EXISTS_UNSPECIFIED: IfExists.CHECK,
    pb.IF_EXISTS_CHECK: IfExists.CHECK,
    pb.IF_EXISTS_RETURN: IfExists.RETURN,
}


def job_spec(request: pb.ScheduleJobRequest, now_ms: int) -> JobSpec:
    """What ``request`` asks for (its time checked here; the rest by the node)."""
    run_at = run_at_of(request, now_ms, required=True)
    return JobSpec(
        job_type=request.type,
        payload=request.payload,
        run_at=run_at,
        idempotency_key=request.idempotency_key,
        max_attempts=request.max_attempts,
        deadline=deadline_of(request, run_at),
        priority=request.priority,
        asked=asked_time(request),
        if_exists=if_exists_of(request),
    )


def asked_time(request: pb.ScheduleJobRequest) -> AskedTime:
    """How the request gave its time (``run_at_of`` has checked it): a delay, in whole
    milliseconds as ``run_at_of`` rounds it, or a time as given."""
    if request.WhichOneof("when") == "delay":
        return AskedTime(
            delay_ms=request.delay.seconds * 1000 + round(request.delay.nanos / 1_000_000)
        )
    return AskedTime(at_ms=ts_ms(request.run_at))


def if_exists_of(request: pb.ScheduleJobRequest) -> IfExists:
    found = _IF_EXISTS.get(request.if_exists)
    if found is None:
        raise InvalidArgument(
            "if_exists", f"unknown value {request.if_exists} (IF_EXISTS_CHECK or IF_EXISTS_RETURN)"
        )
    return found


def warnings_pb(polled: PolledTypes, types: Iterable[str]) -> list[pb.ScheduleWarning]:
    return [pb.ScheduleWarning(type=w.job_type, message=w.message) for w in polled.warnings(types)]
