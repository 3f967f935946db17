"""A ``ListJobsRequest`` read as the store's ``JobQuery``: its filters checked, each error
naming the request's field."""

from __future__ import annotations

from timeshard.errors import InvalidArgument
from timeshard.model import JobState
from timeshard.store.listing import JobOrder, JobQuery
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import state_from_pb, ts_ms

_ORDERS = {
    pb.JOB_ORDER_UNSPECIFIED: JobOrder.DUE,
    pb.JOB_ORDER_DUE: JobOrder.DUE,
    pb.JOB_ORDER_CREATED: JobOrder.CREATED,
    pb.JOB_ORDER_ID: JobOrder.ID,
}


def job_query_from_pb(request: pb.ListJobsRequest) -> JobQuery:
    if request.order not in _ORDERS:
        raise InvalidArgument("order", f"unknown order {request.order}; use due, created or id")
    states: set[JobState] = set()
    for field, values in (("state", [request.state]), ("states", list(request.states))):
        for n, value in enumerate(values):
            try:
                state = state_from_pb(value)
            except InvalidArgument as exc:
                name = field if field == "state" else f"states[{n}]"
                raise InvalidArgument(name, exc.problem) from None
            if state is not None:
                states.add(state)
    return JobQuery(
        states=frozenset(states),
        job_type=request.type,
        due_from=ts_ms(request.run_at_from) if request.HasField("run_at_from") else None,
        due_to=ts_ms(request.run_at_to) if request.HasField("run_at_to") else None,
        key=request.idempotency_key,
        key_prefix=request.idempotency_key_prefix,
        schedule_id=request.schedule_id,
        order=_ORDERS[request.order],
    )
