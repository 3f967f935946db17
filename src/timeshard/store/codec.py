"""Job and schedule rows to and from the model, one mapping for every store: the column names
are the same in SQLite and Cassandra (``type`` holds ``job_type``; ``history`` and ``active``
are JSON text). A row is any mapping of column to value (a driver ``dict``, a ``sqlite3.Row``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from timeshard.limits import MIN_MISFIRE_GRACE_MS
from timeshard.model import (
    Attempt,
    Change,
    ChangeKind,
    Job,
    JobState,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleRevision,
    restore_job,
)
from timeshard.store.history import MAX_HISTORY, history_from_json

Row = dict[str, Any]

JOB_COLUMNS = (
    "job_id",
    "shard",
    "type",
    "payload",
    "state",
    "run_at",
    "created_at",
    "attempt",
    "max_attempts",
    "fence",
    "lease_owner",
    "lease_until",
    "started_at",
    "finished_at",
    "idempotency_key",
    "last_error",
    "history",
    "result",
    "result_encoding",
    "deadline",
    "priority",
    "unstarted",
    "start_noticed",
)
"""A job row's columns in the order of ``Job``'s fields: a row selected in this order decodes
by position (``job_from_row``)."""
_STATE = 4
_HISTORY = 16
_RESULT = 17
_START_NOTICED = 22
_STATES = {s.value: s for s in JobState}
_json_str = encode_basestring_ascii  # a JSON string literal, as json.dumps writes it


def job_from_row(row: Sequence[Any]) -> Job:
    """A job from a row of ``JOB_COLUMNS`` that a store wrote from a Job (not checked again;
    NOT NULL columns, as SQLite keeps them)."""
    values = list(row)
    values[_STATE] = _STATES[values[_STATE]]
    values[_HISTORY] = history_from_text(values[_HISTORY])
    values[_RESULT] = bytes(values[_RESULT])
    values[_START_NOTICED] = bool(values[_START_NOTICED])
    return restore_job(values)


def history_from_text(text: str | None) -> tuple[Attempt, ...]:
    return () if not text or text == "[]" else history_from_json(text)


def history_text(history: tuple[Attempt, ...]) -> str:
    """The history as JSON text, exactly as ``store.history.history_to_json`` writes it, built by
    hand: a claim and a result each rewrite it, and the JSON encoder's set-up per call cost
    more than the text itself."""
    if not history:
        return "[]"
    return "[" + ",".join(map(_attempt_text, history[-MAX_HISTORY:])) + "]"


def _attempt_text(a: Attempt) -> str:
    finished = "null" if a.finished_at is None else int.__repr__(a.finished_at)
    return (
        f'{{"attempt":{int.__repr__(a.attempt)},"worker":{_json_str(a.worker)},'
        f'"started_at":{int.__repr__(a.started_at)},"finished_at":{finished},'
        f'"error":{_json_str(a.error)},"outcome":{_json_str(a.outcome)}'
        + (f',"traceback":{_json_str(a.traceback)}}}' if a.traceback else "}")
    )


def to_job(row: Mapping[str, Any]) -> Job:
    """A Job from a row by column name (Cassandra's rows, where a column never set reads as
    None), not checked again (see ``restore_job``)."""
    get = row.get
    return restore_job(
        (
            row["job_id"],
            row["shard"],
            row["type"],
            bytes(get("payload") or b""),
            _STATES[row["state"]],
            row["run_at"],
            row["created_at"],
            row["attempt"],
            row["max_attempts"],
            row["fence"],
            get("lease_owner") or "",
            row["lease_until"],
            row["started_at"],
            row["finished_at"],
            get("idempotency_key") or "",
            get("last_error") or "",
            history_from_text(get("history")),
            # (None: a row written before results were stored, or a column never set)
            bytes(get("result") or b""),
            get("result_encoding") or "",
            get("deadline") or 0,
            get("priority") or 0,
            get("unstarted") or 0,
            bool(get("start_noticed")),
        )
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
        "history": history_text(job.history),
        "result": job.result,
        "result_encoding": job.result_encoding,
        "deadline": job.deadline,
        "priority": job.priority,
        "unstarted": job.unstarted,
        "start_noticed": job.start_noticed,
    }


def to_schedule(row: Mapping[str, Any]) -> Schedule:
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
        # a row written before the grace had its minimum is read with the minimum
        misfire_grace_ms=max(row["misfire_grace_ms"], MIN_MISFIRE_GRACE_MS),
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
        spread_ms=row["spread_ms"] or 0,  # (null: a Cassandra row from before the column)
        revision=row["revision"] or 0,  # (null: a row from before revisions were kept)
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
        "spread_ms": s.spread_ms,
        "revision": s.revision,
    }


def revision_record(s: Schedule, change: Change) -> str:
    """Revision ``s.revision`` as the text both stores keep: the change, and the schedule as
    it is after it (its definition, pause state and place; not the bookkeeping of its runs)."""
    return json.dumps(
        {
            "revision": s.revision,
            "kind": change.kind.value,
            "actor": change.actor,
            "at": change.at_ms,
            "reason": change.reason,
            "rolled_back_to": change.rolled_back_to,
            "schedule": {
                "schedule_id": s.schedule_id,
                "shard": s.shard,
                "cron": s.cron,
                "timezone": s.timezone,
                "dst_gap": s.dst_gap,
                "dst_fold": s.dst_fold,
                "type": s.job_type,
                "payload": base64.b64encode(s.payload).decode("ascii"),
                "max_attempts": s.max_attempts,
                "misfire": s.misfire.value,
                "misfire_grace_ms": s.misfire_grace_ms,
                "max_catchup": s.max_catchup,
                "overlap": s.overlap.value,
                "max_concurrent": s.max_concurrent,
                "jitter_ms": s.jitter_ms,
                "spread_ms": s.spread_ms,
                "paused": s.paused,
                "next_fire": s.next_fire,
                "created_at": s.created_at,
            },
        },
        separators=(",", ":"),
    )


def revision_from_record(text: str) -> ScheduleRevision:
    r = json.loads(text)
    s = r["schedule"]
    schedule = Schedule(
        schedule_id=s["schedule_id"],
        shard=s["shard"],
        cron=s["cron"],
        timezone=s["timezone"],
        dst_gap=s["dst_gap"],
        dst_fold=s["dst_fold"],
        job_type=s["type"],
        payload=base64.b64decode(s["payload"]),
        max_attempts=s["max_attempts"],
        misfire=MisfirePolicy(s["misfire"]),
        misfire_grace_ms=max(s["misfire_grace_ms"], MIN_MISFIRE_GRACE_MS),
        max_catchup=s["max_catchup"],
        overlap=OverlapPolicy(s["overlap"]),
        max_concurrent=s["max_concurrent"],
        jitter_ms=s["jitter_ms"],
        spread_ms=s["spread_ms"],
        paused=s["paused"],
        next_fire=s["next_fire"],
        created_at=s["created_at"],
        revision=r["revision"],
    )
    change = Change(
        kind=ChangeKind(r["kind"]),
        actor=r["actor"],
        at_ms=r["at"],
        reason=r["reason"],
        rolled_back_to=r["rolled_back_to"],
    )
    return ScheduleRevision(revision=r["revision"], change=change, schedule=schedule)
