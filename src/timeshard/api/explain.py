"""``JobService.ExplainOccurrence``: the request checked, the node's ``Explainer`` asked, its
answer as the reply (``timeshard why``)."""

from __future__ import annotations

from datetime import datetime

from timeshard.errors import InvalidArgument
from timeshard.ledger import LedgerRow
from timeshard.limits import MAX_RUN_AT_MS, check_chars, shown
from timeshard.model import validate_job_id
from timeshard.node.why import RECENT_LIMIT, Explainer, Explanation
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import job_to_pb, ts, ts_ms

MAX_LOCAL_TIME_CHARS = 64


def ledger_to_pb(r: LedgerRow) -> pb.LedgerEntry:
    msg = pb.LedgerEntry(
        schedule_id=r.schedule_id,
        nominal=ts(r.nominal),
        count=r.count,
        reason=r.reason.value,
        job_id=r.job_id,
        revision=r.revision,
        node=r.node,
        epoch=r.epoch,
        decided_at=ts(r.decided_at),
        notes=list(r.notes),
    )
    if r.last:
        msg.last.CopyFrom(ts(r.last))
    if r.run_at:
        msg.run_at.CopyFrom(ts(r.run_at))
    return msg


def explanation_to_pb(e: Explanation, recent: list[LedgerRow]) -> pb.ExplainOccurrenceResponse:
    msg = pb.ExplainOccurrenceResponse(
        schedule_id=e.schedule_id,
        nominal_local=e.nominal_local,
        timezone=e.timezone,
        found=e.found,
        steps=list(e.steps),
        nearest=[ts(t) for t in e.nearest],
        recent=[ledger_to_pb(r) for r in recent],
    )
    if e.nominal:
        msg.nominal.CopyFrom(ts(e.nominal))
    if e.row is not None:
        msg.entry.CopyFrom(ledger_to_pb(e.row))
    if e.job is not None:
        msg.job.CopyFrom(job_to_pb(e.job))
    return msg


def local_time_of(text: str) -> datetime:
    """``at_local`` as a naive wall-clock time, or ``InvalidArgument`` naming it."""
    check_chars("at_local", text, MAX_LOCAL_TIME_CHARS)
    try:
        wall = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            "at_local", f"{shown(text)} is not a local time such as 2027-03-28T02:30"
        ) from None
    if wall.tzinfo is not None:
        raise InvalidArgument(
            "at_local", f"{shown(text)} has an offset: give it as `at`, or leave the offset out"
        )
    if not 1971 <= wall.year <= 9998:  # (a day's offset either way stays in 1970-9999)
        raise InvalidArgument("at_local", f"{shown(text)} is not in the years 1971-9998")
    return wall


async def explain(
    explainer: Explainer, request: pb.ExplainOccurrenceRequest
) -> pb.ExplainOccurrenceResponse:
    if not 0 <= request.recent <= RECENT_LIMIT:
        raise InvalidArgument("recent", f"must be 0-{RECENT_LIMIT}, got {request.recent}")
    at = ts_ms(request.at) if request.HasField("at") else None
    if at is not None and not 0 <= at <= MAX_RUN_AT_MS:
        raise InvalidArgument("at", "must be between 1970 and 9999")
    if at is not None and request.at_local:
        raise InvalidArgument("at_local", "give `at` or `at_local`, not both")
    if request.job_id:
        if request.schedule_id or at is not None or request.at_local:
            raise InvalidArgument("job_id", "give a job id, or a schedule id and a time: not both")
        e = await explainer.job(validate_job_id(request.job_id))
    elif request.schedule_id:
        if request.at_local:
            e = await explainer.local(request.schedule_id, local_time_of(request.at_local))
        elif at is None:
            raise InvalidArgument("at", "give the time of the occurrence to explain")
        else:
            e = await explainer.occurrence(request.schedule_id, at)
    else:
        raise InvalidArgument("schedule_id", "give a job id, or a schedule id and a time")
    until = e.nominal if request.at_local else at  # (a job: None, up to now)
    recent = (
        await explainer.recent(e.schedule_id, request.recent, until)
        if request.recent and e.schedule_id
        else []
    )
    return explanation_to_pb(e, recent)
