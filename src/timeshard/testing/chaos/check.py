"""The checker of a chaos run: reads what the run wrote down (``ledger.py``) and the store as
the API showed it after the drain, and counts every way the guarantees of docs/architecture.md
could have been broken.

Must be zero (``MUST_BE_ZERO``):

- ``lost``: acknowledged (a ScheduleJobs reply, or a cron occurrence the store holds), not
  cancelled, and not terminal after the drain (or gone);
- ``overlapping``: jobs two of whose runs were active at the same time. A run ends when its end
  is recorded, or when its process was killed; a run whose process was paused (SIGSTOP) and
  took no step after it resumed ended, for this count, when it was stopped (invariant 6);
- ``double_effects``: effects applied twice: a job whose effect was applied under two keys, or a
  writer that reached the effect with a fence no newer than the one that applied it (a holder
  past its lease: the idempotency key alone stopped it);
- ``cron_missing`` / ``cron_doubled``: cron slots from the first fire to the schedule's final
  ``next_fire`` with no occurrence job, or with more than one;
- ``ran_after_cancel``: runs claimed after their job's cancel was acknowledged;
- ``early``: runs claimed (or started) before their due time, including the due time a
  reschedule acknowledged before the claim set;
- ``wrong_state``: jobs that ended otherwise than planned (a planned success dead, a permanent
  failure succeeded, an acknowledged cancel not cancelled, a success with no effect applied;
  a job with a deadline may also end expired);
- ``ran_after_deadline``: runs of a job with a deadline claimed after it (by the claiming
  node's clock), or attempts the store shows started after it;
- ``dead_without_start``: jobs dead none of whose attempts started a handler: no run of the
  job in the workers' ledger, or none under an attempt number its history shows counted
  (invariant 9: waiting never spends an attempt; see ``timeshard.testing.attempts``);
- ``rate_exceeded``: runs of the rate-limited type (``chaos.rated``) beyond its rate: more
  started (by the claiming nodes' clocks) in some 10-second window than ``rate x 10 + burst``
  plus one per node (each node's bucket holds at least one);
- ``ran_while_paused``: runs of that type claimed while it was paused: after the pause was
  acknowledged and every node's refresh (``PAUSE_REACH_MS``) had passed, before the resume
  was sent; a run claimed within ``PAUSE_REACH_MS`` after a fault ended (a node restarted or
  resumed, the store back: it reads the pause again then) is excused and counted apart.

Also counted and explained, but expected under faults: ``attempts_vs_starts``, finished jobs
whose counted attempts differ from their runs in the ledger (a worker killed before its start
notice left ran a handler that did not count), deliveries that ended without a start
(``not_started_deliveries``), sequential re-runs (a job run again
after a run whose result did not land: its worker killed or paused, its lease lost, its result
not delivered; with the node or service fault under way between the two runs, or the store
outage whose catch-up they fell in), planned retries, effects a re-run found applied already.

    python -m timeshard.testing.chaos.check RUN_DIR [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timeshard.testing.attempts import (
    TERMINAL,
    attempts_differ,
    dead_without_start,
    not_started_deliveries,
    why_dead,
)
from timeshard.testing.chaos.ledger import Fault, Ledger, RunRecord, read_run
from timeshard.testing.chaos.report import MUST_BE_ZERO, Finding, Report

__all__ = ["MUST_BE_ZERO", "Finding", "Report", "check", "check_dir", "main"]

STEP_OUTCOMES = frozenset({"ok", "retry", "permanent", "error"})
"""End outcomes that are the handler's own doing (a step), not the SDK stopping it."""
RATED_TYPE = "chaos.rated"
NODES = 3
PAUSE_REACH_MS = 6_000
"""A pause reaches every node within its refresh of the stored settings (5 s), plus a second."""
CATCH_UP_KINDS = frozenset({"store_outage"})
"""Faults after which a backlog of due jobs is released at once (``_Times.catching_up``)."""


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


class _Times:
    """The faults that touched each worker process, by pid."""

    def __init__(self, faults: list[Fault]) -> None:
        self.faults = faults
        self.stops: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.kills: dict[int, float] = {}
        for f in faults:
            if f.pid is None:
                continue
            if f.kind.endswith("_stop"):
                self.stops[f.pid].append((f.start_mono, f.end_mono or math.inf))
            elif f.kind.endswith("_kill"):
                self.kills[f.pid] = f.start_mono
        for stops in self.stops.values():
            stops.sort()

    def effective_end(self, run: RunRecord) -> float:
        """When the run stopped being active (see the module docstring)."""
        kill = self.kills.get(run.pid)
        if run.end is None:
            return kill if kill is not None and kill >= run.mono else math.inf
        end = float(run.end["mono"])
        steps = [float(e["mono"]) for e in run.effects]
        if run.outcome in STEP_OUTCOMES:
            steps.append(end)
        for stopped, resumed in self.stops.get(run.pid, []):
            if run.mono < stopped < end and not any(s > resumed for s in steps):
                return stopped
        return end

    def _wall_span(self, run: RunRecord, until: float) -> tuple[float, float]:
        """From the claim (the claiming node's clock: one machine) to the run's end."""
        return float(run.started_at), float(run.end["wall"]) if run.end else until

    def paused(self, run: RunRecord, until: float) -> bool:
        """Its process was stopped while it held the claim: a claim can be taken for a worker
        whose long poll is in flight when it is stopped, and reach it only when it resumes."""
        start, end = self._wall_span(run, until)
        stops = [f for f in self.faults if f.pid == run.pid and f.kind.endswith("_stop")]
        return any(f.start_wall <= end and (f.end_wall or math.inf) >= start for f in stops)

    def killed(self, run: RunRecord, until: float) -> bool:
        """Its process was killed while it ran or held its result, before ``until``."""
        kill = self.kills.get(run.pid)
        return kill is not None and run.mono <= kill <= until

    def around(self, start: float, end: float) -> list[Fault]:
        """Faults of scheduler nodes and services active during ``[start, end]``."""
        return [
            f
            for f in self.faults
            if not f.kind.startswith("worker")
            and f.start_mono <= end
            and (f.end_mono if f.end_mono is not None else math.inf) >= start
        ]

    def catching_up(self, start: float, end: float) -> list[Fault]:
        """Store outages whose catch-up overlaps ``[start, end]``: once the store answers, the
        jobs that fell due while it was away are released together, and on a busy machine
        leases run out in that burst. The catch-up is taken to last as long as the outage."""
        return [
            f
            for f in self.faults
            if f.kind in CATCH_UP_KINDS
            and f.end_mono is not None
            and f.end_mono <= end
            and f.end_mono + (f.end_mono - f.start_mono) >= start
        ]


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


def _schedules(ledger: Ledger) -> dict[str, dict[str, Any]]:
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


def _cancel_acked(plan: JobPlan | None) -> float | None:
    if plan and plan.cancel and plan.cancel.get("result") == "cancelled":
        return float(plan.cancel["acked"])
    return None


def _lost(
    plans: dict[str, JobPlan], occurrences: Iterable[str], store: dict[str, dict[str, Any]]
) -> list[Finding]:
    out = []
    for job in sorted({*plans, *occurrences}):
        if _cancel_acked(plans.get(job)) is not None:
            continue  # judged by wrong_state
        row = store.get(job)
        state = row["state"] if row else "missing"
        if state not in TERMINAL:
            attempts = len(row.get("history", [])) if row else 0
            detail = f"{state} after the drain, {attempts} attempt(s) in its history"
            out.append(Finding(kind="lost", job=job, detail=detail))
    return out


def _expected_state(plan: JobPlan | None) -> set[str]:
    if plan is None:
        return {"succeeded"}  # a cron occurrence
    if _cancel_acked(plan) is not None:
        return {"cancelled"}
    ends = {"permanent": {"dead"}}.get(plan.expect, {"succeeded"})
    if plan.cancel is not None:  # refused or unknown: either may stand
        ends = ends | {"cancelled"}
    if plan.deadline:  # not started in time (a fault held it): never run, and that is right
        ends = ends | {"expired"}
    return ends


def _wrong_state(
    plans: dict[str, JobPlan],
    occurrences: Iterable[str],
    store: dict[str, dict[str, Any]],
    effects_by_job: dict[str, list[str]],
) -> list[Finding]:
    out = []
    for job in sorted({*plans, *occurrences}):
        row = store.get(job)
        if row is None or row["state"] not in TERMINAL:
            continue  # lost (or an acknowledged cancel that did not hold: below)
        want = _expected_state(plans.get(job))
        if row["state"] not in want:
            outcomes = [h.get("outcome", "") for h in row.get("history", [])]
            out.append(
                Finding(
                    kind="wrong_state",
                    job=job,
                    detail=f"{row['state']}, expected {'/'.join(sorted(want))}; "
                    f"attempts {outcomes}; last error {row.get('last_error', '')[:120]!r}",
                )
            )
        elif row["state"] == "succeeded" and not effects_by_job.get(job):
            out.append(
                Finding(kind="wrong_state", job=job, detail="succeeded, but no effect applied")
            )
    for job, plan in sorted(plans.items()):
        row = store.get(job)
        if _cancel_acked(plan) is not None and (row is None or row["state"] not in TERMINAL):
            state = row["state"] if row else "missing"
            out.append(
                Finding(kind="wrong_state", job=job, detail=f"cancel acknowledged, yet {state}")
            )
    return out


def _runs_by_job(runs: Iterable[RunRecord]) -> dict[str, list[RunRecord]]:
    by_job: dict[str, list[RunRecord]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    for rs in by_job.values():
        rs.sort(key=lambda r: (r.mono, r.fence))
    return by_job


def _describe(run: RunRecord, end: float) -> str:
    until = "still running" if math.isinf(end) else f"to {end:.3f}"
    return f"fence {run.fence} on {run.worker} (pid {run.pid}) from {run.mono:.3f} {until}"


def _overlapping(by_job: dict[str, list[RunRecord]], times: _Times) -> list[Finding]:
    out = []
    for job, runs in sorted(by_job.items()):
        latest: tuple[float, RunRecord] | None = None
        for run in runs:
            if latest is not None and run.mono < latest[0]:
                out.append(
                    Finding(
                        kind="overlapping",
                        job=job,
                        detail=f"{_describe(latest[1], latest[0])} and "
                        f"{_describe(run, times.effective_end(run))}",
                    )
                )
                break
            end = times.effective_end(run)
            if latest is None or end > latest[0]:
                latest = (end, run)
    return out


def _effects(
    ledger: Ledger, by_job: dict[str, list[RunRecord]]
) -> tuple[list[Finding], int, dict[str, list[str]]]:
    """Double effects, how many re-runs found their effect applied already, and the keys each
    job's effect was applied under."""
    found: list[Finding] = []
    by_job_keys: dict[str, list[str]] = defaultdict(list)
    for key, body in ledger.effects.items():
        by_job_keys[body["job"]].append(key)
    for job, keys in sorted(by_job_keys.items()):
        if len(keys) > 1:
            found.append(Finding(kind="double_effects", job=job, detail=f"applied under {keys}"))
    deduplicated = 0
    for job, runs in sorted(by_job.items()):
        for run in runs:
            for e in run.effects:
                if e["result"] != "duplicate":
                    continue
                first = ledger.effects.get(e["key"]) or e.get("prior") or {}
                if not first:
                    found.append(
                        Finding(
                            kind="double_effects",
                            job=job,
                            detail=f"key {e['key']!r} found applied, but by no one recorded",
                        )
                    )
                elif first.get("job") != job:
                    found.append(
                        Finding(
                            kind="double_effects",
                            job=job,
                            detail=f"key {e['key']!r} was applied for job {first.get('job')}",
                        )
                    )
                elif run.fence <= int(first.get("fence", -1)):
                    found.append(
                        Finding(
                            kind="double_effects",
                            job=job,
                            detail=f"fence {run.fence} on {run.worker} reached the effect after "
                            f"fence {first.get('fence')} on {first.get('worker')} applied it "
                            "(stopped only by the idempotency key)",
                        )
                    )
                else:
                    deduplicated += 1
    return found, deduplicated, by_job_keys


def _cron(
    ledger: Ledger, occurrences: dict[str, tuple[str, int]]
) -> tuple[list[Finding], list[Finding]]:
    store_schedules: dict[str, dict[str, Any]] = ledger.store.get("schedules", {})
    by_schedule: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for job, (sid, ms) in occurrences.items():
        by_schedule[sid][ms].append(job)
    missing: list[Finding] = []
    doubled: list[Finding] = []
    for sid, s in sorted(_schedules(ledger).items()):
        period, first = int(s["period_ms"]), int(s["first_fire"])
        slots: dict[int, list[str]] = defaultdict(list)
        for ms, jobs in by_schedule[sid].items():
            if ms >= first:
                slots[first + (ms - first) // period * period] += jobs
        final = store_schedules.get(sid, {}).get("next_fire")
        if final is None:
            final = max(slots, default=first - period) + period
            missing.append(Finding(kind="cron_missing", job=sid, detail="final next_fire unknown"))
        skipped = store_schedules.get(sid, {}).get("skipped", 0)
        why = f"no job (the schedule counts {skipped} skipped by its policies)"
        for slot in range(first, int(final), period):
            if not slots.get(slot):
                missing.append(Finding(kind="cron_missing", job=f"{sid}@{slot}", detail=why))
        for slot, jobs in sorted(slots.items()):
            if len(jobs) > 1:
                doubled.append(
                    Finding(kind="cron_doubled", job=f"{sid}@{slot}", detail=f"jobs {sorted(jobs)}")
                )
    return missing, doubled


def _ran_after_cancel(
    plans: dict[str, JobPlan], by_job: dict[str, list[RunRecord]]
) -> list[Finding]:
    out = []
    for job, plan in sorted(plans.items()):
        acked = _cancel_acked(plan)
        if acked is None:
            continue
        for run in by_job.get(job, []):
            if run.started_at > acked:
                out.append(
                    Finding(
                        kind="ran_after_cancel",
                        job=job,
                        detail=f"claimed at {run.started_at}, {run.started_at - acked:.0f} ms "
                        f"after the cancel was acknowledged (fence {run.fence} on {run.worker})",
                    )
                )
    return out


def _early(plans: dict[str, JobPlan], by_job: dict[str, list[RunRecord]]) -> list[Finding]:
    out = []
    for job, runs in sorted(by_job.items()):
        plan = plans.get(job)
        first_fence = min(r.fence for r in runs)
        for run in runs:
            due, why = run.run_at, "its due time as claimed"
            if plan is not None and not plan.reschedules and run.fence == first_fence:
                due, why = max(due, plan.run_at), "its scheduled time"
            if plan is not None:
                for r in plan.reschedules:
                    if r.get("result") == "applied" and run.started_at > r["acked"]:
                        due, why = max(due, r["run_at"]), "the time a reschedule set"
            if run.started_at < due or run.wall < due:
                out.append(
                    Finding(
                        kind="early",
                        job=job,
                        detail=f"claimed at {run.started_at}, handler at {run.wall:.0f}, "
                        f"{due - min(run.started_at, run.wall):.0f} ms before {why} ({due})",
                    )
                )
    return out


def _ran_after_deadline(
    plans: dict[str, JobPlan],
    by_job: dict[str, list[RunRecord]],
    store: dict[str, dict[str, Any]],
) -> list[Finding]:
    out = []
    for job, plan in sorted(plans.items()):
        if not plan.deadline:
            continue
        starts = [(r.started_at, f"fence {r.fence} claimed") for r in by_job.get(job, [])]
        history = store.get(job, {}).get("history", [])
        starts += [(int(a["started_at"]), f"attempt {a['attempt']} started") for a in history]
        out += [
            Finding(
                kind="ran_after_deadline",
                job=job,
                detail=f"{what} at {at}, {at - plan.deadline} ms after its deadline",
            )
            for at, what in starts
            if at > plan.deadline
        ]
    return out


def _rerun_cause(prev: RunRecord, nxt: RunRecord, times: _Times) -> str:
    kinds = prev.sdk_kinds()
    if times.killed(prev, nxt.mono) and "succeeded" not in kinds:
        return "its worker was killed (kill -9) before the result was in"
    if times.paused(prev, nxt.wall) and "succeeded" not in kinds:
        return "its worker was paused (SIGSTOP) past its lease"
    context = sorted({f"{f.kind}" for f in times.around(prev.mono, nxt.mono)})
    after = sorted({f"{f.kind}" for f in times.catching_up(prev.mono, nxt.mono)})
    if context:
        during = f" (during {', '.join(context)})"
    elif after:
        during = f" (in the catch-up after {', '.join(after)})"
    else:
        during = " (no node or service fault)"
    if prev.outcome in ("lost", "cancelled") or "lost" in kinds:
        return "its lease was lost" + during
    if "unreported" in kinds:
        return "its result could not be delivered" + during
    if "rejected" in kinds:
        return "its result was refused" + during
    if prev.end is None:
        return "UNEXPLAINED: the previous run has no end and its process was not killed"
    return f"UNEXPLAINED: the previous run ended {prev.outcome!r}, SDK events {kinds}"


def _reruns(
    by_job: dict[str, list[RunRecord]], times: _Times
) -> tuple[int, int, Counter[str], list[Finding]]:
    retries, reruns, causes = 0, 0, Counter[str]()
    unexplained: list[Finding] = []
    for job, runs in sorted(by_job.items()):
        ordered = sorted(runs, key=lambda r: r.fence)
        for prev, nxt in itertools.pairwise(ordered):
            if prev.outcome == "retry":
                retries += 1
                continue
            reruns += 1
            cause = _rerun_cause(prev, nxt, times)
            causes[cause] += 1
            if cause.startswith("UNEXPLAINED"):
                unexplained.append(
                    Finding(kind="unexplained_rerun", job=job, detail=f"fence {nxt.fence}: {cause}")
                )
    return retries, reruns, causes, unexplained


def _lateness(plans: dict[str, JobPlan], by_job: dict[str, list[RunRecord]]) -> list[float]:
    """Seconds from due to handler start of each job's first run; a job sent after its due time
    is due when it was sent."""
    out = []
    for job, runs in by_job.items():
        first = min(runs, key=lambda r: r.fence)
        floor = 0.0
        plan = plans.get(job)
        if plan is not None:
            floor = plan.sent
            for r in plan.reschedules:
                if r.get("result") == "applied" and r["run_at"] == first.run_at:
                    floor = max(floor, r["sent"])
        out.append((first.wall - max(first.run_at, floor)) / 1000.0)
    return out


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def _started_after_lease(ledger: Ledger) -> list[Finding]:
    """Handlers started once their claim's lease was over by this machine's clock (a claim
    taken for a worker stopped with its long poll in flight reaches it when it resumes): the
    SDK should drop such a claim, not run it. The harm it can do is counted above (an overlap, a
    stale effect); this shows how often the door was open."""
    runs = ledger.records("run")
    lease_ms = float(runs[0]["config"]["lease_s"]) * 1000 if runs else 4000.0
    return [
        Finding(
            kind="started_after_lease",
            job=r.job,
            detail=f"fence {r.fence} on {r.worker}: claimed at {r.started_at}, handler started "
            f"{r.wall - r.started_at:.0f} ms later (lease {lease_ms:.0f} ms)",
        )
        for r in ledger.runs
        if r.wall > r.started_at + lease_ms
    ]


def check(ledger: Ledger) -> Report:
    plans = _plans(ledger)
    store = _store_jobs(ledger)
    schedules = _schedules(ledger)
    occurrences = _occurrences(ledger, schedules)
    times = _Times(ledger.faults())
    by_job = _runs_by_job(ledger.runs)

    effects, deduplicated, effects_by_job = _effects(ledger, by_job)
    missing, doubled = _cron(ledger, occurrences)
    lost = _lost(plans, occurrences, store)
    wrong = _wrong_state(plans, occurrences, store, effects_by_job)
    overlapping = _overlapping(by_job, times)
    overlapping += [
        Finding(kind="overlapping", job=job, detail=f"fence {fence} started twice")
        for job, fence in ledger.duplicate_claims
    ]
    after_cancel = _ran_after_cancel(plans, by_job)
    early = _early(plans, by_job)
    after_deadline = _ran_after_deadline(plans, by_job, store)
    retries, reruns, causes, unexplained = _reruns(by_job, times)
    lateness = _lateness(plans, by_job)
    all_jobs = {*plans, *occurrences}
    unknown = sorted(set(by_job) - all_jobs)
    # Jobs of calls that were never answered (the client gave up): not acknowledged, so not
    # lost; but left scheduled they show the same hole from the other side.
    stray = sorted(
        j for j, row in store.items() if j not in all_jobs and row["state"] not in TERMINAL
    )
    after_lease = _started_after_lease(ledger)
    unstarted_dead, differ = _attempts_and_starts(store, all_jobs, by_job)
    rated_runs, over_rate, most_10s = _rate_held(ledger, by_job)
    while_paused, excused = _ran_while_paused(ledger, by_job, times)

    def jobs_of(findings: list[Finding]) -> int:
        return len({f.job for f in findings})

    counts: dict[str, Any] = {
        "jobs": len(all_jobs),
        "client_jobs": len(plans),
        "cron_occurrences": len(occurrences),
        "terminal": sum(1 for j in all_jobs if store.get(j, {}).get("state") in TERMINAL),
        "faults": dict(Counter(f.kind for f in times.faults)),
        "faults_total": len(times.faults),
        "runs": len(ledger.runs),
        "lost": jobs_of(lost),
        "overlapping": jobs_of(overlapping),
        "double_effects": jobs_of(effects),
        "cron_missing": len(missing),
        "cron_doubled": len(doubled),
        "ran_after_cancel": jobs_of(after_cancel),
        "early": jobs_of(early),
        "ran_after_deadline": jobs_of(after_deadline),
        "with_deadline": sum(1 for p in plans.values() if p.deadline),
        "expired": sum(1 for j in all_jobs if store.get(j, {}).get("state") == "expired"),
        "wrong_state": jobs_of(wrong),
        "dead_without_start": jobs_of(unstarted_dead),
        "attempts_vs_starts": jobs_of(differ),
        "not_started_deliveries": sum(
            not_started_deliveries(store[j]) for j in all_jobs if j in store
        ),
        "rate_exceeded": len(over_rate),
        "ran_while_paused": jobs_of(while_paused),
        "rated_runs": rated_runs,
        "rated_most_in_10s": most_10s,
        "paused_runs_excused": excused,
        "retries": retries,
        "reruns": reruns,
        "rerun_causes": dict(causes),
        "unexplained_reruns": len(unexplained),
        "effects_deduplicated": deduplicated,
        "unknown_jobs_run": len(unknown),
        "unacknowledged_not_terminal": len(stray),
        "cron_skipped": sum(
            int(s.get("skipped", 0)) for s in ledger.store.get("schedules", {}).values()
        ),
        "started_after_lease": len(after_lease),
        "crashes": [
            f"{r['name']} (pid {r['pid']}, code {r['code']})" for r in ledger.records("crash")
        ],
        "lateness_p50_s": round(_quantile(lateness, 0.5), 4),
        "lateness_p99_s": round(_quantile(lateness, 0.99), 4),
        "lateness_max_s": round(max(lateness, default=0.0), 4),
    }
    findings = [
        *lost,
        *overlapping,
        *effects,
        *missing,
        *doubled,
        *after_cancel,
        *early,
        *after_deadline,
        *wrong,
        *unstarted_dead,
        *over_rate,
        *while_paused,
        *unexplained,
        *after_lease,
        *differ,
        *(Finding(kind="unknown_job_run", job=j, detail="run, not acknowledged") for j in unknown),
        *(
            Finding(kind="unacknowledged_not_terminal", job=j, detail=store[j]["state"])
            for j in stray
        ),
    ]
    return Report(counts=counts, findings=findings)


def _attempts_and_starts(
    store: dict[str, dict[str, Any]], jobs: Iterable[str], by_job: dict[str, list[RunRecord]]
) -> tuple[list[Finding], list[Finding]]:
    """The dead jobs none of whose attempts started a handler (must be none), and the finished
    jobs whose counted attempts differ from their runs in the ledger (information)."""
    rows = {j: store[j] for j in jobs if j in store}
    starts = {j: [r.attempt for r in runs] for j, runs in by_job.items()}

    def runs_of(job: str) -> str:
        return f"{len(starts.get(job, []))} handler run(s) in the ledger"

    dead = [
        Finding(kind="dead_without_start", job=j, detail=f"{runs_of(j)}; {why_dead(rows[j])}")
        for j in dead_without_start(rows, starts)
    ]
    differ = [
        Finding(
            kind="attempts_vs_starts",
            job=j,
            detail=f"{rows[j]['state']} after {rows[j].get('attempt')} counted attempt(s), "
            f"{runs_of(j)}",
        )
        for j in attempts_differ(rows, starts)
    ]
    return dead, differ


def _rated_runs(ledger: Ledger, by_job: dict[str, list[RunRecord]]) -> list[RunRecord]:
    rated = {r["job"] for r in ledger.records("job") if r.get("type") == RATED_TYPE}
    return sorted((run for j in rated for run in by_job.get(j, ())), key=lambda r: r.started_at)


def _rate_held(
    ledger: Ledger, by_job: dict[str, list[RunRecord]]
) -> tuple[int, list[Finding], int]:
    """(runs of the rated type, the windows that went over its rate, the most in 10 s)."""
    runs = _rated_runs(ledger, by_job)
    rated = [r for r in ledger.records("flow") if r.get("rate")]
    if not rated:
        return len(runs), [], 0
    rate, burst = float(rated[0]["rate"]), int(rated[0]["burst"])
    limit = rate * 10 + burst + NODES
    starts = [r.started_at for r in runs]
    findings: list[Finding] = []
    most, hi, reported = 0, 0, -math.inf
    for lo, start in enumerate(starts):
        while hi < len(starts) and starts[hi] < start + 10_000:
            hi += 1
        most = max(most, hi - lo)
        if hi - lo > limit and start >= reported + 10_000:  # one finding per 10 s over
            reported = start
            findings.append(
                Finding(
                    kind="rate_exceeded",
                    job=runs[lo].job,
                    detail=f"{hi - lo} runs of {RATED_TYPE} started in the 10 s from {start} "
                    f"(rate {rate:g}/s, burst {burst}: at most {limit:g})",
                )
            )
    return len(runs), findings, most


def _ran_while_paused(
    ledger: Ledger, by_job: dict[str, list[RunRecord]], times: _Times
) -> tuple[list[Finding], int]:
    """Runs claimed while the rated type was paused everywhere, and those excused."""
    flows = [r for r in ledger.records("flow") if "paused" in r]
    pauses = [r for r in flows if r["paused"]]
    if not pauses:
        return [], 0
    held_from = pauses[0]["acked"] + PAUSE_REACH_MS
    resumes = [r for r in flows if not r["paused"] and r["sent"] > pauses[0]["acked"]]
    held_to = resumes[0]["sent"] if resumes else math.inf
    ends = [f.end_wall for f in times.faults if f.end_wall is not None]
    findings: list[Finding] = []
    excused = 0
    for run in _rated_runs(ledger, by_job):
        if not held_from <= run.started_at < held_to:
            continue
        if any(end <= run.started_at < end + PAUSE_REACH_MS for end in ends):
            excused += 1
            continue
        findings.append(
            Finding(
                kind="ran_while_paused",
                job=run.job,
                detail=f"claimed at {run.started_at} (fence {run.fence}); paused from "
                f"{pauses[0]['acked']:.0f}, resumed at {held_to}",
            )
        )
    return findings, excused


def check_dir(run_dir: Path) -> Report:
    return check(read_run(run_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", action="store_true", help="last stdout line: a JSON object")
    args = parser.parse_args(argv)
    report = check_dir(args.run_dir)
    out = sys.stdout
    out.write(report.text() + "\n")
    if args.json:
        findings = [dataclasses.asdict(f) for f in report.findings]
        out.write(json.dumps({**report.as_json(), "findings": findings}) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
