"""Rows as the driver returns them (``dict_factory``) to and from the model: jobs with the
image their next conditional write compares, schedules, shard states; and a bucket entry's TTL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from timeshard.model import Job, ShardState
from timeshard.store.base import MAX_HISTORY
from timeshard.store.codec import job_columns, to_job

Row = dict[str, Any]

BUCKET_RETENTION_S = 7 * 24 * 3600
"""Bucket entries live this long past their due time (then TWCS drops them whole)."""
MAX_TTL_S = 20 * 365 * 24 * 3600  # Cassandra's limit; entries due later get no TTL at all

IMAGE = (
    "state",
    "fence",
    "attempt",
    "run_at",
    "lease_owner",
    "lease_until",
    "started_at",
    "finished_at",
    "last_error",
    "history",
)
"""The mutable columns of a job row: every conditional write compares all of them."""


@dataclass(frozen=True, slots=True)
class Found:
    """A job as read, with the raw values its next conditional write must compare."""

    job: Job
    image: Row

    @classmethod
    def from_row(cls, row: Row) -> Found:
        return cls(job=to_job(row), image={k: row[k] for k in IMAGE})

    def after(self, current: Row) -> Found:
        """This row with the current image Cassandra returned from a write that did not apply
        (the other columns are fixed when the job is created)."""
        image = {k: current[k] for k in IMAGE}
        return Found(job=to_job({**job_columns(self.job), **image}), image=image)


def image_of(job: Job) -> Row:
    """The image ``job`` has once written (what a SERIAL read of it returns)."""
    columns = job_columns(job)
    return {k: columns[k] for k in IMAGE}


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
