"""Rows as the driver returns them (``dict_factory``) to and from the model: jobs with the
image their next conditional write compares, schedules, shard states; and a bucket entry's TTL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from timeshard.model import Job, JobState, MisfirePolicy, OverlapPolicy, Schedule, ShardState
from timeshard.store.base import MAX_HISTORY, history_from_json, history_to_json

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


def to_job(row: Row) -> Job:
    return Job(
        job_id=row["job_id"],
        shard=row["shard"],
        job_type=row["type"],
        payload=bytes(row["payload"] or b""),
        state=JobState(row["state"]),
        run_at=row["run_at"],
        created_at=row["created_at"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        fence=row["fence"],
        lease_owner=row["lease_owner"] or "",
        lease_until=row["lease_until"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        idempotency_key=row["idempotency_key"] or "",
        last_error=row["last_error"] or "",
        history=history_from_json(row["history"]),
    )


def job_columns(job: Job) -> Row:
    return {
        "job_id": job.job_id,
        "shard": job.shard,
        "type": job.job_type,
        "payload": job.payload,
        "created_at": job.created_at,
        "max_attempts": job.max_attempts,
        "idempotency_key": job.idempotency_key,
        "state": job.state.value,
        "run_at": job.run_at,
        "attempt": job.attempt,
        "fence": job.fence,
        "lease_owner": job.lease_owner,
        "lease_until": job.lease_until,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "last_error": job.last_error,
        "history": history_to_json(job.history),
    }


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


def to_schedule(row: Row) -> Schedule:
    return Schedule(
        schedule_id=row["schedule_id"],
        shard=row["shard"],
        cron=row["cron"],
        timezone=row["timezone"],
        dst_gap=row["dst_gap"] or "",
        dst_fold=row["dst_fold"] or "",
        job_type=row["type"],
        payload=bytes(row["payload"] or b""),
        max_attempts=row["max_attempts"],
        misfire=MisfirePolicy(row["misfire"]),
        misfire_grace_ms=row["misfire_grace_ms"],
        max_catchup=row["max_catchup"],
        overlap=OverlapPolicy(row["overlap"]),
        max_concurrent=row["max_concurrent"],
        jitter_ms=row["jitter_ms"],
        paused=bool(row["paused"]),
        next_fire=row["next_fire"],
        created_at=row["created_at"],
        version=row["version"],
        active=tuple(json.loads(row["active"] or "[]")),
        queued_at=row["queued_at"],
        skipped=row["skipped"],
        last_skip_at=row["last_skip_at"],
        last_fire_at=row["last_fire_at"],
    )


def schedule_columns(s: Schedule) -> Row:
    return {
        "schedule_id": s.schedule_id,
        "shard": s.shard,
        "cron": s.cron,
        "timezone": s.timezone,
        "dst_gap": s.dst_gap,
        "dst_fold": s.dst_fold,
        "type": s.job_type,
        "payload": s.payload,
        "max_attempts": s.max_attempts,
        "misfire": s.misfire.value,
        "misfire_grace_ms": s.misfire_grace_ms,
        "max_catchup": s.max_catchup,
        "overlap": s.overlap.value,
        "max_concurrent": s.max_concurrent,
        "jitter_ms": s.jitter_ms,
        "paused": s.paused,
        "next_fire": s.next_fire,
        "created_at": s.created_at,
        "version": s.version,
        "active": json.dumps(list(s.active)),
        "queued_at": s.queued_at,
        "skipped": s.skipped,
        "last_skip_at": s.last_skip_at,
        "last_fire_at": s.last_fire_at,
    }


def bucket_ttl(due_at: int, now: int) -> int:
    """Seconds a bucket entry lives: until ``BUCKET_RETENTION_S`` after it is due (0: forever,
    for the rare entry due further out than Cassandra's TTL limit)."""
    ttl = max(0, due_at - now) // 1000 + BUCKET_RETENTION_S
    return ttl if ttl <= MAX_TTL_S else 0
