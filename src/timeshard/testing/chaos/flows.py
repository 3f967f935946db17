"""The checks of the rate-limited type of a chaos run (``chaos.rated``), for the checker
(``check``): its runs started within its rate in every 10-second window, and none claimed while
it was paused everywhere."""

from __future__ import annotations

import math

from timeshard.testing.chaos.ledger import RATED_TYPE, Ledger, RunRecord
from timeshard.testing.chaos.report import Finding
from timeshard.testing.chaos.times import Times

NODES = 3
PAUSE_REACH_MS = 6_000
"""A pause reaches every node within its refresh of the stored settings (5 s), plus a second."""


def rated_runs(ledger: Ledger, by_job: dict[str, list[RunRecord]]) -> list[RunRecord]:
    rated = {r["job"] for r in ledger.records("job") if r.get("type") == RATED_TYPE}
    return sorted((run for j in rated for run in by_job.get(j, ())), key=lambda r: r.started_at)


def rate_held(ledger: Ledger, by_job: dict[str, list[RunRecord]]) -> tuple[int, list[Finding], int]:
    """(runs of the rated type, the windows that went over its rate, the most in 10 s)."""
    runs = rated_runs(ledger, by_job)
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


def ran_while_paused(
    ledger: Ledger, by_job: dict[str, list[RunRecord]], times: Times
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
    for run in rated_runs(ledger, by_job):
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
