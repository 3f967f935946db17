"""Replies that always fit in what the client accepts (see ``timeshard.limits``).

- A ``Claim`` writes before it answers, so its size is bounded up front: at most
  ``claim_cap(max_reply_bytes)`` jobs, each at most ``CLAIM_WORST_JOB_BYTES`` (every field at
  its limit; a claimed job is sent without its attempt history, which ``GetJob`` shows).
- A reply to a write that has applied (``ScheduleJobs``, ``ReplayDeadLetters``) is never given
  up: when the full jobs would not fit, it carries them without payload, history and last
  error (``GetJob`` has them).
- A listing is only a read: a page that would not fit is read again, shorter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from timeshard.errors import InvalidArgument
from timeshard.limits import (
    DEFAULT_MAX_REPLY_BYTES,
    MAX_CLAIM_JOBS,
    MAX_ERROR_BYTES,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_JOB_ID_CHARS,
    MAX_JOB_TYPE_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_REPLY_BYTES,
    MAX_WORKER_ID_BYTES,
    REPLY_HEADROOM_BYTES,
)
from timeshard.v1 import timeshard_pb2 as pb

_LATEST = Timestamp(seconds=253_402_300_799, nanos=999_000_000)  # 9999-12-31T23:59:59.999Z
_LONGEST = Duration(seconds=315_576_000_000, nanos=999_999_999)
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1


def _worst_claimed_job() -> pb.ClaimedJob:
    """A claimed job with every field at its limit, as ``claimed_to_pb`` sends it."""
    job = pb.Job(
        job_id="j" * MAX_JOB_ID_CHARS,
        type="t" * MAX_JOB_TYPE_CHARS,
        payload=b"\xff" * MAX_PAYLOAD_BYTES,
        state=pb.JOB_STATE_RUNNING,
        run_at=_LATEST,
        created_at=_LATEST,
        attempt=_INT32,
        max_attempts=_INT32,
        fence=_INT64,
        lease_owner="w" * MAX_WORKER_ID_BYTES,
        lease_until=_LATEST,
        started_at=_LATEST,
        finished_at=_LATEST,
        idempotency_key="k" * MAX_IDEMPOTENCY_KEY_BYTES,
        last_error="e" * MAX_ERROR_BYTES,
        shard=_INT32,
    )
    return pb.ClaimedJob(
        job=job,
        fence=_INT64,
        lease_until=_LATEST,
        idempotency_key="k" * max(MAX_IDEMPOTENCY_KEY_BYTES, MAX_JOB_ID_CHARS),
        lease=_LONGEST,
    )


def _in_repeated(msg: Message) -> int:
    """Bytes ``msg`` takes as one element of a repeated field: tag, length, body."""
    size = msg.ByteSize()
    return 1 + (size.bit_length() + 6) // 7 + size


CLAIM_WORST_JOB_BYTES = _in_repeated(_worst_claimed_job())
"""The most one claimed job adds to a ``ClaimResponse`` (261 KiB)."""


def reply_budget(max_reply_bytes: int) -> int:
    """What a reply may hold in jobs, for a client that accepts ``max_reply_bytes`` (0: the
    gRPC default)."""
    if max_reply_bytes < 0:
        raise InvalidArgument("max_reply_bytes", "must not be negative (0: the 4 MiB default)")
    accepted = min(max_reply_bytes or DEFAULT_MAX_REPLY_BYTES, MAX_REPLY_BYTES)
    return accepted - REPLY_HEADROOM_BYTES


def claim_cap(max_reply_bytes: int) -> int:
    """How many jobs one claim may take so that its reply fits, whatever they hold: 15 for a
    client with gRPC's default 4 MiB, 251 for one that accepts ``MAX_REPLY_BYTES``."""
    fits = reply_budget(max_reply_bytes) // CLAIM_WORST_JOB_BYTES
    if fits < 1:
        raise InvalidArgument(
            "max_reply_bytes",
            f"{max_reply_bytes} bytes can not hold one job; accept at least "
            f"{CLAIM_WORST_JOB_BYTES + REPLY_HEADROOM_BYTES} (or 0 for the 4 MiB default)",
        )
    return min(fits, MAX_CLAIM_JOBS)


def summary(job: pb.Job) -> pb.Job:
    """The job without payload, result, history and last error: what a reply to an applied
    write carries when the full jobs would not fit."""
    job.payload = b""
    job.result = b""
    job.result_encoding = ""
    job.last_error = ""
    del job.history[:]
    return job


def fit_written(jobs: Sequence[pb.Job]) -> list[pb.Job]:
    """The jobs of an applied write, whole if they fit in a default reply, else summaries."""
    if sum(_in_repeated(j) for j in jobs) <= reply_budget(0):
        return list(jobs)
    return [summary(j) for j in jobs]


T = TypeVar("T")
M = TypeVar("M", bound=Message)


async def fit_page(
    read: Callable[[int], Awaitable[tuple[list[T], str]]],
    limit: int,
    to_pb: Callable[[T], M],
) -> tuple[list[M], str]:
    """A page of at most ``limit`` items whose reply fits in gRPC's default 4 MiB: when the
    items read would not fit, read again (the same token, a smaller limit), so the store's own
    token goes on after the last item sent."""
    while True:
        items, token = await read(limit)
        out: list[M] = []
        size = 0
        for item in items:
            msg = to_pb(item)
            size += _in_repeated(msg)
            if size > reply_budget(0) and out:
                break
            out.append(msg)
        if len(out) == len(items):
            return out, token
        limit = len(out)
