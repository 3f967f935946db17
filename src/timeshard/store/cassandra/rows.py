"""Rows as the driver returns them (``dict_factory``) to and from the model: jobs with the
image their next conditional write compares, schedules, shard states; and a bucket entry's TTL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from timeshard.model import Job, ShardState
from timeshard.store.codec import to_job
from timeshard.store.history import MAX_HISTORY

Row = dict[str, Any]

BUCKET_RETENTION_S = 7 * 24 * 3600
"""Bucket entries live this long past their due time (then TWCS drops them whole)."""
MAX_TTL_S = 20 * 365 * 24 * 3600  # Cassandra's limit; entries due later get no TTL at all

IMAGE = ("state", "fence", "run_at", "lease_until", "attempt")
"""The columns every conditional write on a job row compares: each transition's condition reads
only these (and what changes only with them), and each transition changes at least one of them,
so a row whose image matches is the row the new values were computed from. ``attempt`` is the
one an amend of a lease's count changes (``transitions.amend``): a claim or reschedule computed
from the row before it does not apply over it."""


@dataclass(frozen=True, slots=True)
class Found:
    """A job as read, with the raw values its next conditional write must compare."""

    job: Job
    image: tuple[Any, ...]

    @classmethod
    def from_row(cls, row: Row) -> Found:
        return cls(job=to_job(row), image=tuple(row[k] for k in IMAGE))

    @classmethod
    def of(cls, job: Job) -> Found:
        return cls(job=job, image=image_of(job))


def image_of(job: Job) -> tuple[Any, ...]:
    """The image ``job`` has once written."""
    return (job.state.value, job.fence, job.run_at, job.lease_until, job.attempt)


def row_image(row: Row) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in IMAGE)


def bounded_history(job: Job) -> Job:
    """Keep the newest ``MAX_HISTORY`` attempts, as stored."""
    if len(job.history) <= MAX_HISTORY:
        return job
    return job.with_(history=job.history[-MAX_HISTORY:])


def to_shard_state(shard: int, row: Row) -> ShardState:
    if row.get("epoch") is None:
        return ShardState(shard=shard)
    return ShardState(shard=shard, epoch=row["epoch"], owner=row["owner"], cursor=row["cursor"])


def bucket_ttl(due_at: int, now: int) -> int:
    """Seconds a bucket entry lives: until ``BUCKET_RETENTION_S`` after it is due (0: forever,
    for the rare entry due further out than Cassandra's TTL limit)."""
    ttl = max(0, due_at - now) // 1000 + BUCKET_RETENTION_S
    return ttl if ttl <= MAX_TTL_S else 0
