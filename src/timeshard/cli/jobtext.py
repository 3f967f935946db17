"""How a job is shown: JOB, as every ``--json`` prints it (docs/cli.md), a line, and a field a
line for ``jobs get``."""

from __future__ import annotations

import base64
import json
from typing import Any

from timeshard.console import when, when_local
from timeshard.model import RESULT_BYTES, RESULT_JSON
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import state_from_pb, ts_ms


def job_json(job: pb.Job) -> dict[str, Any]:
    """JOB in docs/cli.md: a job as every ``--json`` prints it."""

    def t(msg: Any, present: bool) -> str | None:
        return when(ts_ms(msg)) if present else None

    state = state_from_pb(job.state)
    return {
        "job_id": job.job_id,
        "type": job.type,
        "state": state.value if state else "unknown",
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "unstarted": job.unstarted,
        "start_noticed": job.start_noticed,
        "run_at": t(job.run_at, True),
        "created_at": t(job.created_at, True),
        "started_at": t(job.started_at, job.HasField("started_at")),
        "finished_at": t(job.finished_at, job.HasField("finished_at")),
        "lease_owner": job.lease_owner or None,
        "lease_until": t(job.lease_until, job.HasField("lease_until")),
        "fence": job.fence,
        "shard": job.shard,
        "idempotency_key": job.idempotency_key or None,
        "last_error": job.last_error or None,
        "payload": job.payload.decode("utf-8", errors="replace"),
        "history": [
            {
                "attempt": a.attempt,
                "worker": a.worker,
                "started_at": t(a.started_at, True),
                "finished_at": t(a.finished_at, a.HasField("finished_at")),
                "outcome": a.outcome,
                "error": a.error or None,
                "traceback": a.traceback or None,
            }
            for a in job.history
        ],
        "result_encoding": job.result_encoding or None,
        "result": _result_json(job),
        "deadline": t(job.deadline, job.HasField("deadline")),
        "priority": job.priority,
    }


def _result_json(job: pb.Job) -> Any:
    """The result for JSON output: the value of a JSON result, base64 text for bytes."""
    if job.result_encoding == RESULT_JSON:
        return json.loads(job.result)
    if job.result_encoding == RESULT_BYTES:
        return base64.b64encode(job.result).decode("ascii")
    return None


def job_line(job: pb.Job) -> str:
    d = job_json(job)
    return (
        f"{d['job_id']}  {d['type']:<16} {d['state']:<10} attempt {d['attempt']}  "
        f"run_at {d['run_at']}"
    )


_LOCAL_BESIDE = ("run_at", "lease_until")


def job_lines(job: pb.Job) -> list[str]:
    """One job for people: a field a line, the attempts last."""
    out = []
    for k, v in job_json(job).items():
        if k == "history" or v is None:
            continue
        if k in _LOCAL_BESIDE:
            v = when_local(ts_ms(getattr(job, k)))
        if k == "result":
            v = job.result.decode() if job.result_encoding == RESULT_JSON else f"{v} (base64)"
        out.append(f"{k:>16}: {v}")
    for a in job.history:
        out.append(
            f"{'attempt':>16}: #{a.attempt} by {a.worker}: {a.outcome or 'running'} {a.error}"
        )
        if a.traceback:  # indented under its attempt
            out += [f"{'':>18}{line}" for line in a.traceback.rstrip().splitlines()]
    return out
