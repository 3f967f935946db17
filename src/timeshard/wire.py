"""The wire: between model objects and protobuf messages, input checks that belong to the wire
format, and gRPC statuses read back into the errors of ``timeshard.errors`` (the inverse of its
``GRPC_STATUS`` table). Shared by the client, the worker SDK and the servicers."""

from __future__ import annotations

import math
from typing import TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from timeshard.clock import format_rfc3339
from timeshard.errors import (
    GRPC_STATUS,
    RETRY_AFTER_KEY,
    InvalidArgument,
    ResourceExhausted,
    TimeshardError,
)
from timeshard.limits import MAX_RUN_AT_MS, PAST_RUN_AT_GRACE_MS, check_attempts, shown
from timeshard.model import (
    Job,
    JobState,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleRevision,
)
from timeshard.policy import TypePolicy
from timeshard.v1 import timeshard_pb2 as pb

_FROM_STATUS = {code: cls for cls, code in GRPC_STATUS.items()}


class RemoteError(TimeshardError):
    """An error the server reported; ``code`` is its gRPC status. It is also an instance of
    the matching error class (``except NotFound`` catches a remote NOT_FOUND)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        TimeshardError.__init__(self, message)
        self.code = code


_REMOTE: dict[grpc.StatusCode, type[RemoteError]] = {
    code: type(f"Remote{cls.__name__}", (RemoteError, cls), {})
    for code, cls in _FROM_STATUS.items()
}


def retry_after_ms_of(exc: grpc.RpcError) -> int:
    """The wait in milliseconds a refusal names in its ``retry-after-ms`` trailing metadata,
    rounded up (0: it names none, or nothing readable)."""
    trailing = getattr(exc, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == RETRY_AFTER_KEY:
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
            try:
                ms = float(text.strip())
            except ValueError:
                return 0
            return math.ceil(ms) if 0 <= ms < 2**31 else 0
    return 0


def translate(exc: grpc.RpcError) -> RemoteError:
    code_fn = getattr(exc, "code", None)
    code: grpc.StatusCode = code_fn() if code_fn else grpc.StatusCode.UNKNOWN
    details_fn = getattr(exc, "details", None)
    detail: str = (details_fn() if details_fn else None) or str(exc)
    if code is grpc.StatusCode.UNAVAILABLE and "connect" in detail.lower():
        detail = f"can not reach the timeshard server: {detail}"
    err = _REMOTE.get(code, RemoteError)(code, detail)
    if isinstance(err, InvalidArgument):  # "field: problem", as InvalidArgument words it
        field, sep, problem = detail.partition(": ")
        err.field, err.problem = (field, problem) if sep else ("", detail)
    elif isinstance(err, ResourceExhausted):
        err.retry_after_ms = retry_after_ms_of(exc)
    return err


_STATE_TO_PB = {
    JobState.SCHEDULED: pb.JOB_STATE_SCHEDULED,
    JobState.RUNNING: pb.JOB_STATE_RUNNING,
    JobState.SUCCEEDED: pb.JOB_STATE_SUCCEEDED,
    JobState.DEAD: pb.JOB_STATE_DEAD,
    JobState.CANCELLED: pb.JOB_STATE_CANCELLED,
    JobState.EXPIRED: pb.JOB_STATE_EXPIRED,
}
_STATE_FROM_PB: dict[int, JobState] = {int(v): k for k, v in _STATE_TO_PB.items()}


def state_to_pb(state: JobState) -> pb.JobState:
    return _STATE_TO_PB[state]


def state_from_pb(value: int) -> JobState | None:
    """None for JOB_STATE_UNSPECIFIED (no filter)."""
    if value == pb.JOB_STATE_UNSPECIFIED:
        return None
    if value not in _STATE_FROM_PB:
        raise InvalidArgument("state", f"unknown job state {value}")
    return _STATE_FROM_PB[value]


def ts(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def ts_ms(t: Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


def claimed_to_pb(job: Job, lease_ms: int) -> pb.ClaimedJob:
    """A job handed to a worker (a ``Claim`` answer, a stream's push), without its history."""
    return pb.ClaimedJob(
        job=job_to_pb(job, history=False),
        fence=job.fence,
        lease_until=ts(job.lease_until),
        idempotency_key=job.idempotency_key or job.job_id,
        lease=dur(lease_ms),
    )


def type_policy_to_pb(job_type: str, p: TypePolicy) -> pb.TypePolicy:
    """A job type's policy as ``SetTypePolicies`` takes it and ``ListTypes`` shows it (0: the
    default; no backoff fields: the server's)."""
    msg = pb.TypePolicy(
        type=job_type,
        max_attempts=p.max_attempts or 0,
        concurrency=p.concurrency or 0,
        max_unstarted=p.max_unstarted or 0,
    )
    if p.retry is not None:
        msg.retry_base.CopyFrom(dur(round(p.retry.base_s * 1000)))
        msg.retry_max.CopyFrom(dur(round(p.retry.max_backoff_s * 1000)))
    return msg


def started_at_of(h: pb.HeartbeatRequest, now_ms: int) -> int:
    """A heartbeat's start notice: when its handler started (epoch ms; the node's ``now_ms``
    if the worker did not say), or 0 when it carries none."""
    if not h.started:
        return 0
    return ts_ms(h.started_at) if h.HasField("started_at") else now_ms


def dur(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def dur_us(us: int) -> Duration:
    return Duration(seconds=us // 1_000_000, nanos=(us % 1_000_000) * 1000)


def dur_s(d: Duration) -> float:
    return d.seconds + d.nanos / 1e9


def job_to_pb(job: Job, *, history: bool = True) -> pb.Job:
    """The job as the API shows it (``history=False``: without its attempts, as a claim hands it
    out). Times are set field by field: on the hot paths (every scheduled and every claimed job)
    that is twice as fast as building a Timestamp per field."""
    msg = pb.Job(
        job_id=job.job_id,
        type=job.job_type,
        payload=job.payload,
        state=_STATE_TO_PB[job.state],
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        fence=job.fence,
        lease_owner=job.lease_owner,
        idempotency_key=job.idempotency_key,
        last_error=job.last_error,
        shard=job.shard,
    )
    if job.priority:
        msg.priority = job.priority
    if job.unstarted:
        msg.unstarted = job.unstarted
    if job.start_noticed:
        msg.start_noticed = True
    if job.deadline:
        _set_ts(msg.deadline, job.deadline)
    if job.result_encoding:  # (most jobs have none: not passed, as an empty field costs time)
        msg.result = job.result
        msg.result_encoding = job.result_encoding
    _set_ts(msg.run_at, job.run_at)
    _set_ts(msg.created_at, job.created_at)
    if job.lease_until:
        _set_ts(msg.lease_until, job.lease_until)
    if job.started_at:
        _set_ts(msg.started_at, job.started_at)
    if job.finished_at:
        _set_ts(msg.finished_at, job.finished_at)
    if history and job.history:
        msg.history.extend(
            pb.Attempt(
                attempt=a.attempt,
                worker=a.worker,
                started_at=ts(a.started_at),
                finished_at=ts(a.finished_at) if a.finished_at else None,
                outcome=a.outcome,
                error=a.error,
                traceback=a.traceback,
            )
            for a in job.history
        )
    return msg


def _set_ts(field: Timestamp, ms: int) -> None:
    field.seconds = ms // 1000
    field.nanos = (ms % 1000) * 1_000_000


def run_at_of(
    msg: pb.ScheduleJobRequest | pb.RescheduleJobRequest,
    now_ms: int,
    *,
    required: bool,
    whose_now: str = "the server's time",
) -> int:
    """The absolute time a request asks for: ``delay`` from now or ``run_at``, never before
    ``now_ms`` (a negative delay, or a run_at more than ``PAST_RUN_AT_GRACE_MS`` ago, is
    INVALID_ARGUMENT; a run_at less than that ago is now). ``whose_now`` names ``now_ms`` in
    the message: a client checking a request before it sends it uses its own clock."""
    which = msg.WhichOneof("when")
    if which == "delay":
        if msg.delay.seconds < 0 or msg.delay.nanos < 0:
            raise InvalidArgument("delay", "must not be negative (use 0s to run now)")
        delay_ms = msg.delay.seconds * 1000 + round(msg.delay.nanos / 1_000_000)
        return _not_after_9999("delay", now_ms + delay_ms)
    if which == "run_at":
        ms = ts_ms(msg.run_at)
        if ms <= 0:
            raise InvalidArgument("run_at", "must be after 1970-01-01T00:00:00Z")
        return _not_in_the_past(ms, now_ms, whose_now)
    if required:
        raise InvalidArgument("when", "give a delay or a run_at time")
    return now_ms


def deadline_of(msg: pb.ScheduleJobRequest, run_at: int) -> int:
    """The deadline a request asks for (0: none): ``deadline``, or ``deadline_in`` after
    ``run_at``; never before ``run_at`` (``Node`` refuses that)."""
    which = msg.WhichOneof("deadline_of")
    if which == "deadline_in":
        if msg.deadline_in.seconds < 0 or msg.deadline_in.nanos < 0:
            raise InvalidArgument("deadline_in", "must not be negative")
        return _not_after_9999("deadline_in", run_at + round(dur_s(msg.deadline_in) * 1000))
    if which == "deadline":
        ms = ts_ms(msg.deadline)
        if ms <= 0:
            raise InvalidArgument("deadline", "must be after 1970-01-01T00:00:00Z")
        return _not_after_9999("deadline", ms)
    return 0


def _not_in_the_past(ms: int, now_ms: int, whose_now: str) -> int:
    """A run_at up to ``PAST_RUN_AT_GRACE_MS`` ago is now: stored as now, so the job's lateness
    counts from when it was scheduled, not from a time before it existed. Further back is
    refused, as a negative delay is."""
    if ms >= now_ms:
        return _not_after_9999("run_at", ms)
    if now_ms - ms > PAST_RUN_AT_GRACE_MS:
        raise InvalidArgument(
            "run_at",
            f"{format_rfc3339(ms)} is {_age(now_ms - ms)} in the past ({whose_now} is "
            f"{format_rfc3339(now_ms)}); give a later time, or a delay of 0s to run now",
        )
    return now_ms


def _age(ms: int) -> str:
    s = ms / 1000
    for unit, size in (("days", 86_400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.1f} s"


def _not_after_9999(field: str, ms: int) -> int:
    if ms > MAX_RUN_AT_MS:
        raise InvalidArgument(field, "the time must be before 9999-12-31T23:59:59.999Z")
    return ms


def schedule_to_pb(s: Schedule) -> pb.Schedule:
    return pb.Schedule(
        schedule_id=s.schedule_id,
        cron=s.cron,
        timezone=s.timezone,
        type=s.job_type,
        payload=s.payload,
        misfire=s.misfire.value,
        misfire_grace=dur(s.misfire_grace_ms),
        max_catchup=s.max_catchup,
        overlap=s.overlap.value,
        max_concurrent=s.max_concurrent,
        jitter=dur(s.jitter_ms),
        dst_gap=s.dst_gap,
        dst_fold=s.dst_fold,
        paused=s.paused,
        next_fire=ts(s.next_fire),
        max_attempts=s.max_attempts,
        skipped=s.skipped,
        last_skip_at=ts(s.last_skip_at) if s.last_skip_at else None,
        last_fire_at=ts(s.last_fire_at) if s.last_fire_at else None,
        active_jobs=list(s.active),
        queued_at=ts(s.queued_at) if s.queued_at else None,
        spread=dur(s.spread_ms) if s.spread_ms else None,
        revision=s.revision,
    )


def revision_to_pb(r: ScheduleRevision) -> pb.ScheduleRevision:
    return pb.ScheduleRevision(
        schedule_id=r.schedule.schedule_id,
        revision=r.revision,
        change=r.change.kind.value,
        actor=r.change.actor,
        at=ts(r.change.at_ms),
        reason=r.change.reason,
        rolled_back_to=r.change.rolled_back_to,
        schedule=schedule_to_pb(r.schedule),
    )


def _ms_of(d: Duration, field: str) -> int:
    if d.seconds < 0 or d.nanos < 0:
        raise InvalidArgument(field, "must not be negative")
    return round(dur_s(d) * 1000)


def schedule_from_pb(msg: pb.Schedule, schedule_id: str) -> Schedule:
    """A schedule as a client describes it; the server fills in shard and times."""
    if not msg.cron:
        raise InvalidArgument("cron", "a cron expression is required, e.g. '0 2 * * *'")
    if not msg.timezone:
        raise InvalidArgument("timezone", "an IANA time zone is required, e.g. Europe/Berlin")
    return Schedule(
        schedule_id=schedule_id,
        shard=0,
        cron=msg.cron,
        timezone=msg.timezone,
        dst_gap=msg.dst_gap,
        dst_fold=msg.dst_fold,
        job_type=msg.type,
        payload=msg.payload,
        max_attempts=check_attempts(msg.max_attempts),
        misfire=_policy(MisfirePolicy, "misfire", msg.misfire or "once"),
        misfire_grace_ms=_ms_of(msg.misfire_grace, "misfire_grace")
        if msg.HasField("misfire_grace")
        else 60_000,
        max_catchup=msg.max_catchup or 10,
        overlap=_policy(OverlapPolicy, "overlap", msg.overlap or "skip"),
        max_concurrent=msg.max_concurrent or 1,
        jitter_ms=_ms_of(msg.jitter, "jitter"),
        spread_ms=_ms_of(msg.spread, "spread"),
        next_fire=0,
        created_at=0,
    )


P = TypeVar("P", MisfirePolicy, OverlapPolicy)


def _policy(kind: type[P], field: str, value: str) -> P:
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(
            field, f"unknown policy {shown(value)}; use one of {[p.value for p in kind]}"
        ) from None
