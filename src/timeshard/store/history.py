"""A job's attempt history: an attempt opened by a claim and closed when it ends, the JSON text
the stores keep it as, and how many attempts a job keeps."""

from __future__ import annotations

import json
from dataclasses import replace

from timeshard.model import Attempt, Job


def new_attempt(job: Job, worker: str, now: int) -> Attempt:
    return Attempt(attempt=job.attempt + 1, worker=worker, started_at=now)


def history_to_json(history: tuple[Attempt, ...]) -> str:
    return json.dumps(
        [
            {
                "attempt": a.attempt,
                "worker": a.worker,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
                "error": a.error,
                "outcome": a.outcome,
                **({"traceback": a.traceback} if a.traceback else {}),
            }
            for a in history
        ],
        separators=(",", ":"),
    )


def history_from_json(text: str) -> tuple[Attempt, ...]:
    return tuple(Attempt(**item) for item in json.loads(text or "[]"))


def finish_attempt(
    job: Job, now: int, outcome: str, error: str = "", traceback: str = ""
) -> tuple[Attempt, ...]:
    """The history with its last attempt closed."""
    if not job.history:
        return job.history
    closed = replace(
        job.history[-1], finished_at=now, error=error, outcome=outcome, traceback=traceback
    )
    return (*job.history[:-1], closed)


MAX_HISTORY = 20
"""Attempts kept on a job (the newest); enough to diagnose, bounded so a row stays small."""


def amend_attempt(job: Job, outcome: str, error: str) -> tuple[Attempt, ...]:
    """The history with its last attempt, already closed, told again: another outcome and
    error, its times kept (a late word from its worker, ``transitions.amend``)."""
    if not job.history:
        return job.history
    told = replace(job.history[-1], error=error, outcome=outcome)
    return (*job.history[:-1], told)
