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
- ``ran_after_cancel``: handlers started after their job's cancel was acknowledged (the run's
  start in the workers' ledger: a job claimed ahead and pushed before it was due starts on its
  worker's clock, after its claim);
- ``early``: handlers started before their due time (the run's start in the workers' ledger;
  also a claim before it), including the due time a reschedule acknowledged before the start
  set;
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
  acknowledged and every node's refresh (``flows.PAUSE_REACH_MS``) had passed, before the resume
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
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from timeshard.testing.attempts import (
    TERMINAL,
    attempts_differ,
    dead_without_start,
    not_started_deliveries,
    why_dead,
)
from timeshard.testing.chaos.flows import ran_while_paused, rate_held
from timeshard.testing.chaos.ledger import Ledger, RunRecord, read_run
from timeshard.testing.chaos.report import MUST_BE_ZERO, Finding, Report
from timeshard.testing.chaos.times import Times, reruns
from timeshard.testing.chaos.view import JobPlan, RunView, schedules

__all__ = ["MUST_BE_ZERO", "Finding", "Report", "check", "check_dir", "main"]


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


def _describe(run: RunRecord, end: float) -> str:
    until = "still running" if math.isinf(end) else f"to {end:.3f}"
    return f"fence {run.fence} on {run.worker} (pid {run.pid}) from {run.mono:.3f} {until}"


def _overlapping(by_job: dict[str, list[RunRecord]], times: Times) -> list[Finding]:
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
    for sid, s in sorted(schedules(ledger).items()):
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
            if run.wall > acked:
                out.append(
                    Finding(
                        kind="ran_after_cancel",
                        job=job,
                        detail=f"handler started at {run.wall:.0f} (claimed at "
                        f"{run.started_at}), {run.wall - acked:.0f} ms after the cancel was "
                        f"acknowledged (fence {run.fence} on {run.worker})",
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
                    if r.get("result") == "applied" and run.wall > r["acked"]:
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
    run = RunView.of(ledger)
    found = _Found.of(run)
    return Report(counts=_counts(run, found), findings=found.findings())


@dataclass(kw_only=True)
class _Found:
    """What the checks found in a run: the findings of each kind, in the order the report
    lists them, then what they counted besides."""

    lost: list[Finding]
    overlapping: list[Finding]
    effects: list[Finding]
    missing: list[Finding]
    doubled: list[Finding]
    after_cancel: list[Finding]
    early: list[Finding]
    after_deadline: list[Finding]
    wrong: list[Finding]
    unstarted_dead: list[Finding]
    over_rate: list[Finding]
    while_paused: list[Finding]
    unexplained: list[Finding]
    after_lease: list[Finding]
    differ: list[Finding]
    unknown: list[Finding]
    stray: list[Finding]
    deduplicated: int
    retries: int
    reruns: int
    causes: Counter[str]
    lateness: list[float]
    rated_runs: int
    most_10s: int
    excused: int

    @classmethod
    def of(cls, run: RunView) -> _Found:
        plans, store, by_job, times = run.plans, run.store, run.by_job, run.times
        effects, deduplicated, effects_by_job = _effects(run.ledger, by_job)
        missing, doubled = _cron(run.ledger, run.occurrences)
        overlapping = _overlapping(by_job, times)
        overlapping += [
            Finding(kind="overlapping", job=job, detail=f"fence {fence} started twice")
            for job, fence in run.ledger.duplicate_claims
        ]
        retries, reruns_, causes, unexplained = reruns(by_job, times)
        unstarted_dead, differ = _attempts_and_starts(store, run.all_jobs, by_job)
        rated, over_rate, most_10s = rate_held(run.ledger, by_job)
        while_paused, excused = ran_while_paused(run.ledger, by_job, times)
        # Jobs of calls that were never answered (the client gave up): not acknowledged, so not
        # lost; but left scheduled they show the same hole from the other side.
        stray = sorted(
            j for j, row in store.items() if j not in run.all_jobs and row["state"] not in TERMINAL
        )
        return cls(
            lost=_lost(plans, run.occurrences, store),
            overlapping=overlapping,
            effects=effects,
            missing=missing,
            doubled=doubled,
            after_cancel=_ran_after_cancel(plans, by_job),
            early=_early(plans, by_job),
            after_deadline=_ran_after_deadline(plans, by_job, store),
            wrong=_wrong_state(plans, run.occurrences, store, effects_by_job),
            unstarted_dead=unstarted_dead,
            over_rate=over_rate,
            while_paused=while_paused,
            unexplained=unexplained,
            after_lease=_started_after_lease(run.ledger),
            differ=differ,
            unknown=[
                Finding(kind="unknown_job_run", job=j, detail="run, not acknowledged")
                for j in sorted(set(by_job) - run.all_jobs)
            ],
            stray=[
                Finding(kind="unacknowledged_not_terminal", job=j, detail=store[j]["state"])
                for j in stray
            ],
            deduplicated=deduplicated,
            retries=retries,
            reruns=reruns_,
            causes=causes,
            lateness=_lateness(plans, by_job),
            rated_runs=rated,
            most_10s=most_10s,
            excused=excused,
        )

    def findings(self) -> list[Finding]:
        return [
            *self.lost,
            *self.overlapping,
            *self.effects,
            *self.missing,
            *self.doubled,
            *self.after_cancel,
            *self.early,
            *self.after_deadline,
            *self.wrong,
            *self.unstarted_dead,
            *self.over_rate,
            *self.while_paused,
            *self.unexplained,
            *self.after_lease,
            *self.differ,
            *self.unknown,
            *self.stray,
        ]


def _jobs_of(findings: list[Finding]) -> int:
    return len({f.job for f in findings})


def _counts(run: RunView, found: _Found) -> dict[str, Any]:
    """The report's counts (its JSON object), in the order it has them."""
    store, all_jobs, ledger = run.store, run.all_jobs, run.ledger
    lateness = found.lateness
    return {
        "jobs": len(all_jobs),
        "client_jobs": len(run.plans),
        "cron_occurrences": len(run.occurrences),
        "terminal": sum(1 for j in all_jobs if store.get(j, {}).get("state") in TERMINAL),
        "faults": dict(Counter(f.kind for f in run.times.faults)),
        "faults_total": len(run.times.faults),
        "runs": len(ledger.runs),
        "lost": _jobs_of(found.lost),
        "overlapping": _jobs_of(found.overlapping),
        "double_effects": _jobs_of(found.effects),
        "cron_missing": len(found.missing),
        "cron_doubled": len(found.doubled),
        "ran_after_cancel": _jobs_of(found.after_cancel),
        "early": _jobs_of(found.early),
        "ran_after_deadline": _jobs_of(found.after_deadline),
        "with_deadline": sum(1 for p in run.plans.values() if p.deadline),
        "expired": sum(1 for j in all_jobs if store.get(j, {}).get("state") == "expired"),
        "wrong_state": _jobs_of(found.wrong),
        "dead_without_start": _jobs_of(found.unstarted_dead),
        "attempts_vs_starts": _jobs_of(found.differ),
        "not_started_deliveries": sum(
            not_started_deliveries(store[j]) for j in all_jobs if j in store
        ),
        "rate_exceeded": len(found.over_rate),
        "ran_while_paused": _jobs_of(found.while_paused),
        "rated_runs": found.rated_runs,
        "rated_most_in_10s": found.most_10s,
        "paused_runs_excused": found.excused,
        "retries": found.retries,
        "reruns": found.reruns,
        "rerun_causes": dict(found.causes),
        "unexplained_reruns": len(found.unexplained),
        "effects_deduplicated": found.deduplicated,
        "unknown_jobs_run": len(found.unknown),
        "unacknowledged_not_terminal": len(found.stray),
        "cron_skipped": sum(
            int(s.get("skipped", 0)) for s in ledger.store.get("schedules", {}).values()
        ),
        "started_after_lease": len(found.after_lease),
        "crashes": [
            f"{r['name']} (pid {r['pid']}, code {r['code']})" for r in ledger.records("crash")
        ],
        "lateness_p50_s": round(_quantile(lateness, 0.5), 4),
        "lateness_p99_s": round(_quantile(lateness, 0.99), 4),
        "lateness_max_s": round(max(lateness, default=0.0), 4),
    }


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
