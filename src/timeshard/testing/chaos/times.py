"""The faults of a chaos run in time, for the checker (``check``): which faults touched each
worker process, when a run stopped being active (a process killed, or paused past its lease),
which node and service faults were under way between two runs, and so why a job ran again
(``reruns``)."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict

from timeshard.testing.chaos.ledger import Fault, RunRecord
from timeshard.testing.chaos.report import Finding

STEP_OUTCOMES = frozenset({"ok", "retry", "permanent", "error"})
"""End outcomes that are the handler's own doing (a step), not the SDK stopping it."""
CATCH_UP_KINDS = frozenset({"store_outage"})
"""Faults after which a backlog of due jobs is released at once (``Times.catching_up``)."""


class Times:
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


def rerun_cause(prev: RunRecord, nxt: RunRecord, times: Times) -> str:
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


def reruns(
    by_job: dict[str, list[RunRecord]], times: Times
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
            cause = rerun_cause(prev, nxt, times)
            causes[cause] += 1
            if cause.startswith("UNEXPLAINED"):
                unexplained.append(
                    Finding(kind="unexplained_rerun", job=job, detail=f"fence {nxt.fence}: {cause}")
                )
    return retries, reruns, causes, unexplained
