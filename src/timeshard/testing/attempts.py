"""Counted attempts against handler starts: what the store says a job spent, held against what
its workers saw themselves start (invariant 9: an attempt counts when a handler started).

Shared by the chaos checker (``chaos/check.py``) and ``tools/loadtest.py overload``. Both read
jobs as ``job_summary`` makes them (the chaos run's ``store.json`` keeps them so) and the
handler starts their workers recorded, as attempt numbers per job (one per handler run).

- ``dead_without_start``: a job ``dead`` none of whose attempts started a handler: no start
  recorded for it at all, or none under an attempt number its history shows counted (an entry
  whose outcome is not ``not started``). Such a job spent its life waiting, and waiting must
  never kill a job. A history keeps its last ``MAX_HISTORY`` (20) entries: a job with more
  deliveries than that is judged on the ones kept.
- ``attempts_differ``: a finished job whose counted attempts (``attempt``) are not the number
  of handler runs recorded for it. Information: a handler whose start notice never left (its
  worker killed at once) started without counting.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import ts_ms

STATE_NAMES = {
    pb.JOB_STATE_SCHEDULED: "scheduled",
    pb.JOB_STATE_RUNNING: "running",
    pb.JOB_STATE_SUCCEEDED: "succeeded",
    pb.JOB_STATE_DEAD: "dead",
    pb.JOB_STATE_CANCELLED: "cancelled",
    pb.JOB_STATE_EXPIRED: "expired",
}
TERMINAL = frozenset({"succeeded", "dead", "cancelled", "expired"})
NOT_STARTED = "not started"
"""The outcome of a delivery that ended without a handler start (its error says why)."""


def job_summary(j: pb.Job) -> dict[str, Any]:
    """A job as the API shows it, as plain data (what the checkers read)."""
    return {
        "job_id": j.job_id,
        "state": STATE_NAMES.get(j.state, "unknown"),
        "run_at": ts_ms(j.run_at),
        "attempt": j.attempt,
        "max_attempts": j.max_attempts,
        "unstarted": j.unstarted,
        "fence": j.fence,
        "shard": j.shard,
        "started_at": ts_ms(j.started_at),
        "finished_at": ts_ms(j.finished_at),
        "last_error": j.last_error[:300],
        "history": [
            {
                "attempt": a.attempt,
                "worker": a.worker,
                "started_at": ts_ms(a.started_at),
                "finished_at": ts_ms(a.finished_at),
                "outcome": a.outcome,
                "error": a.error[:200],
            }
            for a in j.history
        ],
    }


def not_started(entry: Mapping[str, Any]) -> bool:
    """A history entry of a delivery that started no handler (not a counted attempt)."""
    return entry.get("outcome") == NOT_STARTED or str(entry.get("error", "")).startswith(
        NOT_STARTED + ":"
    )


def counted_attempts(row: Mapping[str, Any]) -> set[int]:
    """The attempt numbers a job's history shows counted."""
    return {int(h["attempt"]) for h in row.get("history", []) if not not_started(h)}


def not_started_deliveries(row: Mapping[str, Any]) -> int:
    """Deliveries of a job that ended without a handler start: its ``unstarted`` count, or
    its history's where that says more (a node that does not count them)."""
    shown = sum(1 for h in row.get("history", []) if not_started(h))
    return max(int(row.get("unstarted", 0)), shown)


def died_without_start(row: Mapping[str, Any], started: Collection[int]) -> bool:
    """``row`` is dead and none of its attempts started a handler (``started``: the attempt
    numbers of its recorded handler runs)."""
    if row.get("state") != "dead":
        return False
    if not started:
        return True
    counted = counted_attempts(row)
    return bool(counted) and not counted & set(started)


def dead_without_start(
    rows: Mapping[str, Mapping[str, Any]], starts: Mapping[str, Collection[int]]
) -> list[str]:
    """The dead jobs none of whose attempts started a handler, by id."""
    return sorted(j for j, row in rows.items() if died_without_start(row, starts.get(j, ())))


def attempts_differ(
    rows: Mapping[str, Mapping[str, Any]], starts: Mapping[str, Collection[int]]
) -> list[str]:
    """The finished jobs whose counted attempts differ from their recorded handler runs."""
    return sorted(
        j
        for j, row in rows.items()
        if row.get("state") in TERMINAL and int(row.get("attempt", 0)) != len(starts.get(j, ()))
    )


def starts_by_job(runs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """(job, attempt) of each recorded handler run -> each job's attempt numbers."""
    out: dict[str, list[int]] = {}
    for job, attempt in runs:
        out.setdefault(job, []).append(attempt)
    return out


def why_dead(row: Mapping[str, Any]) -> str:
    """A dead job's story in one line: its counted attempts, history outcomes, last error."""
    outcomes = [h.get("outcome", "") for h in row.get("history", [])]
    return (
        f"attempt {row.get('attempt')}, {not_started_deliveries(row)} unstarted, "
        f"history {outcomes}, last error {str(row.get('last_error', ''))[:120]!r}"
    )
