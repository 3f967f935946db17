"""A chaos run as the checker (``check``) reads it: the jobs the driver planned and what it
asked of them (``JobPlan``), the store's jobs after the drain, the cron occurrences, the faults
in time and each job's runs in order (``RunView``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from timeshard.testing.chaos.ledger import Ledger, RunRecord
from timeshard.testing.chaos.times import Times


@dataclass(frozen=True, kw_only=True)
class RunView:
    """A run as the checks read it: its ledger, the jobs the driver planned, the store's jobs
    after the drain, the cron occurrences, the faults in time, and the runs of each job."""

    ledger: Ledger
    plans: dict[str, JobPlan]
    store: dict[str, dict[str, Any]]
    occurrences: dict[str, tuple[str, int]]
    times: Times
    by_job: dict[str, list[RunRecord]]
    all_jobs: set[str]

    @classmethod
    def of(cls, ledger: Ledger) -> RunView:
        plans = _plans(ledger)
        occurrences = _occurrences(ledger, schedules(ledger))
        return cls(
            ledger=ledger,
            plans=plans,
            store=_store_jobs(ledger),
            occurrences=occurrences,
            times=Times(ledger.faults()),
            by_job=_runs_by_job(ledger.runs),
            all_jobs={*plans, *occurrences},
        )


@dataclass(kw_only=True)
class JobPlan:
    """A job as the driver scheduled and changed it."""

    job: str
    expect: str
    run_at: int
    sent: float
    acked: float
    cancel: dict[str, Any] | None = None
    reschedules: list[dict[str, Any]] = field(default_factory=list)
    deadline: int = 0
    """No attempt may start after it (epoch ms; 0: none)."""


def _plans(ledger: Ledger) -> dict[str, JobPlan]:
    plans: dict[str, JobPlan] = {}
    for r in ledger.records("job"):
        plans[r["job"]] = JobPlan(
            job=r["job"],
            expect=r["expect"],
            run_at=r["run_at"],
            sent=r["sent"],
            acked=r["acked"],
            deadline=r.get("deadline", 0),
        )
    for r in ledger.records("cancel"):
        if r["job"] in plans:
            plans[r["job"]].cancel = r
    for r in ledger.records("reschedule"):
        if r["job"] in plans:
            plans[r["job"]].reschedules.append(r)
    return plans


def _store_jobs(ledger: Ledger) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = ledger.store.get("jobs", {})
    return jobs


def schedules(ledger: Ledger) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in ledger.records("schedule")}


def _occurrences(ledger: Ledger, schedules: Iterable[str]) -> dict[str, tuple[str, int]]:
    """Occurrence job id -> (schedule id, scheduled ms), from the store and the ledger."""
    ids = set(_store_jobs(ledger)) | {r.job for r in ledger.runs}
    out: dict[str, tuple[str, int]] = {}
    known = set(schedules)
    for job in ids:
        sid, at, ms = job.rpartition("@")
        if at and sid in known and ms.isdigit():
            out[job] = (sid, int(ms))
    return out


def _runs_by_job(runs: Iterable[RunRecord]) -> dict[str, list[RunRecord]]:
    by_job: dict[str, list[RunRecord]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    for rs in by_job.values():
        rs.sort(key=lambda r: (r.mono, r.fence))
    return by_job
