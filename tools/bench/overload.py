"""``overload``: late, never dead (issue 33, invariant 9). Jobs are offered at ``--factor``
(5) times what the workers can run (``workers x concurrency / work``) for ``--duration``
seconds, with the CPU starved on purpose: ``--busy`` processes spinning beside the node, short
leases (``--lease``, 2 s), handlers that take a fixed ``--work-ms``. Then a drain until every
acknowledged job finished (bounded by ``--drain-limit``, and by ``--drain`` seconds with none
finishing). The workers (``timeshard.testing.overloadworker``) write down each handler run's
start and end; the store gives each job's state, counted attempts and history.

Must be zero: ``dead_without_start`` (a job dead none of whose attempts started a handler,
``timeshard.testing.attempts``), ``lost`` (acknowledged, not finished after the drain),
``early`` (a handler started before the job's due time), ``overlapping`` (two runs of one job
active at once), ``attempts_equal_starts`` (finished jobs whose counted attempts are not their
handler runs: waiting counted as an attempt, the bug this scenario is for). Also shown:
``attempts_per_succeeded`` (mean counted attempts of the jobs that succeeded: 1.0 when waiting
spends none and no started run loses its lease), ``not_started_deliveries``, schedule-to-start
(due time to the first handler start) p50 and p99, and the load average during the offered
load.

The run lasts about ``factor x duration``: what is offered beyond capacity is drained after.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from timeshard.testing.attempts import (
    TERMINAL,
    attempts_differ,
    dead_without_start,
    job_summary,
    not_started_deliveries,
    starts_by_job,
)
from timeshard.testing.overloadworker import JOB_TYPE
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc

from .procs import Timeshard, cpu_delta
from .progress import Progress, note
from .records import pct
from .report import loadavg
from .scenarios import counter_delta, machine, mean_ms, per_1k, running
from .submit import stream

WORKER = "timeshard.testing.overloadworker:worker"
MUST_BE_ZERO = ("dead_without_start", "lost", "early", "overlapping", "attempts_equal_starts")
FINISHED = tuple(
    f"timeshard_jobs_{name}_total" for name in ("succeeded", "dead_lettered", "expired")
)
"""The node's counters of jobs that reached a terminal state (none is cancelled here)."""
DEFAULTS = {"workers": 2, "concurrency": 10, "drain": 60.0, "lead": 1.0}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "overload",
        help="5x what the workers can run, CPU starved: late, never dead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=300.0, help="seconds of offered load (300)")
    p.add_argument("--factor", type=float, default=5.0, help="offered over capacity (5)")
    p.add_argument("--work-ms", type=float, default=100.0, help="each handler's time (100)")
    p.add_argument("--lease", type=float, default=2.0, help="the workers' lease, s (2)")
    p.add_argument("--busy", type=int, default=6, help="processes spinning beside the node (6)")
    p.add_argument(
        "--drain-limit",
        type=float,
        default=None,
        help="give up the drain after this many seconds (default: three times what the jobs "
        "acknowledged take at capacity, plus 300; and whenever none finished for --drain)",
    )
    return p


# -- what the workers wrote down ---------------------------------------------------------------


@dataclass(kw_only=True)
class HandlerRun:
    """One handler run as its worker recorded it (``overloadworker``)."""

    job: str
    fence: int
    attempt: int
    run_at: int
    start_ms: float
    end_ms: float | None = None
    outcome: str = ""


def parse_runs(lines: Iterable[str]) -> list[HandlerRun]:
    """The runs of ``S``/``E`` lines (one worker's file, or several one after the other); an
    end goes with the latest start of its (job, fence) that has none yet."""
    runs: list[HandlerRun] = []
    open_runs: dict[tuple[str, int], list[HandlerRun]] = {}
    for line in lines:
        kind, *f = line.split()
        if kind == "S" and len(f) == 5:
            run = HandlerRun(
                job=f[0], fence=int(f[1]), attempt=int(f[2]), run_at=int(f[3]), start_ms=float(f[4])
            )
            runs.append(run)
            open_runs.setdefault((run.job, run.fence), []).append(run)
        elif kind == "E" and len(f) == 4 and (waiting := open_runs.get((f[0], int(f[1])))):
            run = waiting.pop(0)
            run.end_ms, run.outcome = float(f[2]), f[3]
    return runs


def read_runs(paths: Sequence[Path]) -> list[HandlerRun]:
    lines: list[str] = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            lines += path.read_text().splitlines()
    return parse_runs(lines)


# -- the figures -------------------------------------------------------------------------------


def _overlapping(runs: Sequence[HandlerRun]) -> bool:
    """Two of one job's runs active at once (a run with no end is active to the last)."""
    latest_end = -float("inf")
    for run in sorted(runs, key=lambda r: r.start_ms):
        if run.start_ms < latest_end:
            return True
        latest_end = max(latest_end, run.end_ms if run.end_ms is not None else float("inf"))
    return False


def overload_figures(
    due: Mapping[str, int], rows: Mapping[str, Mapping[str, Any]], runs: Sequence[HandlerRun]
) -> dict[str, Any]:
    """The figures of a run: ``due`` is each acknowledged job's due time (epoch ms), ``rows``
    the jobs as the store showed them after the drain (``job_summary``; a job missing is
    lost), ``runs`` every handler run the workers recorded."""
    by_job: dict[str, list[HandlerRun]] = {}
    for run in runs:
        if run.job in due:
            by_job.setdefault(run.job, []).append(run)
    ours = {j: rows[j] for j in due if j in rows}
    starts = starts_by_job((r.job, r.attempt) for rs in by_job.values() for r in rs)
    states = Counter(str(ours[j]["state"]) if j in ours else "missing" for j in due)
    succeeded = [int(r["attempt"]) for r in ours.values() if r["state"] == "succeeded"]
    early = [j for j, rs in by_job.items() if any(r.start_ms < max(r.run_at, due[j]) for r in rs)]
    to_start = sorted(min(r.start_ms for r in rs) - due[j] for j, rs in by_job.items())
    dead = [r for r in ours.values() if r["state"] == "dead"]
    figures: dict[str, Any] = {
        "jobs": len(due),
        "states": dict(states),
        "dead_without_start": len(dead_without_start(ours, starts)),
        "lost": sum(n for s, n in states.items() if s not in TERMINAL),
        "early": len(early),
        "overlapping": sum(1 for rs in by_job.values() if _overlapping(rs)),
        "attempts_per_succeeded": round(statistics.fmean(succeeded), 4) if succeeded else None,
        "attempts_equal_starts": len(attempts_differ(ours, starts)),
        "not_started_deliveries": sum(not_started_deliveries(r) for r in ours.values()),
        "dead_never_started": sum(
            1 for r in dead if str(r.get("last_error", "")).startswith("never started:")
        ),
        "schedule_to_start_p50_ms": round(pct(to_start, 50), 1) if to_start else None,
        "schedule_to_start_p99_ms": round(pct(to_start, 99), 1) if to_start else None,
        "schedule_to_start_max_ms": round(to_start[-1], 1) if to_start else None,
        "handler_runs": sum(len(rs) for rs in by_job.values()),
        "jobs_run_more_than_once": sum(1 for rs in by_job.values() if len(rs) > 1),
        "runs_cut_short": dict(Counter(r.outcome or "no end" for r in runs if r.outcome != "ok")),
        "history_outcomes": dict(
            Counter(str(h.get("outcome", "")) for r in ours.values() for h in r["history"])
        ),
        "dead_errors": dict(Counter(str(r.get("last_error", ""))[:60] for r in dead)),
    }
    figures["failed"] = [k for k in MUST_BE_ZERO if figures[k]]
    return figures


# -- the run -----------------------------------------------------------------------------------


@contextlib.contextmanager
def spinning(count: int) -> Iterator[None]:
    """``count`` processes that spin on a core each until the block ends (killed by pid)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def finished_count(ts: Timeshard) -> int | None:
    """The jobs the node counts finished, or None when its metrics did not answer (a starved
    node may not, for a while: that is neither progress nor a stall of the drain)."""
    counters = ts.counters()
    if not counters:
        return None
    return int(sum(counters.get(name, 0.0) for name in FINISHED))


def offer(
    ts: Timeshard, args: argparse.Namespace, rate: float, count: int
) -> tuple[list[int], list[str], dict[str, Any]]:
    """Offer ``count`` jobs at ``rate`` per second, each due ``--lead`` after it is sent;
    returns the due times and ids of those acknowledged, and the offer's own figures (how long
    it took, the rate reached, the server's answer that stopped it if one did)."""
    run_ats: list[int] = []
    ids: list[str] = []
    failed: list[str] = []
    t0 = time.monotonic()

    def send() -> None:
        try:
            stream(
                ts.address,
                rate,
                count,
                args.lead,
                args.mode,
                run_ats,
                ids,
                job_type=JOB_TYPE,
                lead_from_send=True,
            )
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details()
            failed.append(f"{code}: {details}")
            note(f"the offer stopped: the server answered {code}: {details}")

    sender = threading.Thread(target=send, name="loadtest-offer", daemon=True)
    sender.start()
    progress = Progress("offer", count)
    while sender.is_alive():
        progress.update(len(ids), extra=f"finished {finished_count(ts):,}")
        ts.check_alive()
        time.sleep(1.0)
    sender.join()
    progress.close()
    seconds = time.monotonic() - t0
    reached = {
        "offered_s": round(seconds, 1),
        "ingest_per_s": round(len(ids) / seconds, 1),
        "offer_error": failed[0] if failed else None,
    }
    return run_ats[: len(ids)], ids, reached


def drain(ts: Timeshard, jobs: int, idle_s: float, limit_s: float) -> dict[str, Any]:
    """Wait until the node counts ``jobs`` finished, none finished for ``idle_s``, or
    ``limit_s`` passed."""
    t0 = last_change = time.monotonic()
    progress = Progress("drain", jobs)
    done = finished_count(ts) or 0
    while done < jobs:
        now = time.monotonic()
        if now - last_change > idle_s or now - t0 > limit_s:
            why = f"none finished for {idle_s:g} s" if now - last_change > idle_s else "limit"
            note(f"drain given up ({why}): {jobs - done:,} not finished by the node's count")
            break
        time.sleep(1.0)
        now_done = finished_count(ts)
        if now_done is None:
            last_change = time.monotonic()  # unanswered: not a stall; the limit still holds
        elif now_done != done:
            done, last_change = now_done, time.monotonic()
        progress.update(done)
        ts.check_alive()
    progress.close()
    return {"drain_s": round(time.monotonic() - t0, 1), "drained": done >= jobs}


def list_jobs(address: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Every job of the run's type as the store shows it, and any acknowledged one the listing
    missed read one by one."""
    rows: dict[str, dict[str, Any]] = {}
    with grpc.insecure_channel(address.split(",")[0]) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        token = ""
        while True:
            reply = stub.ListJobs(
                pb.ListJobsRequest(type=JOB_TYPE, page_size=1000, page_token=token), timeout=120
            )
            rows.update((j.job_id, job_summary(j)) for j in reply.jobs)
            token = reply.next_page_token
            if not token:
                break
        for job_id in set(ids) - set(rows):
            try:
                rows[job_id] = job_summary(stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=30))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
    return rows


def overload(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    capacity = args.workers * args.concurrency * 1000 / args.work_ms
    rate = args.factor * capacity
    count = round(rate * args.duration)
    env = {"TIMESHARD_LOADTEST_WORK_MS": f"{args.work_ms:g}"}
    with running(args, lease_s=args.lease, worker_target=WORKER, worker_env=env) as (ts, store, _):
        note(
            f"capacity {capacity:,.0f} jobs/s ({args.workers} workers x {args.concurrency} slots"
            f" / {args.work_ms:g} ms); offering {rate:,.0f}/s for {args.duration:g} s with "
            f"{args.busy} spinning processes and a {args.lease:g} s lease"
        )
        cpu0, ctr0 = ts.cpu(), ts.counters()
        with spinning(args.busy):
            run_ats, ids, offered = offer(ts, args, rate, count)
            during = loadavg()
            limit_s = args.drain_limit
            if limit_s is None:
                limit_s = 3 * len(ids) / capacity + 300
            note(f"{len(ids):,} jobs acknowledged; draining (up to {limit_s:,.0f} s)")
            drained = drain(ts, len(ids), args.drain, limit_s)
        cpu1, ctr1 = ts.cpu(), ts.counters()
        note(f"reading {len(ids):,} jobs back")
        rows = list_jobs(ts.address, ids)
        ts.stop_workers()  # they write their records out as they exit
        runs = read_runs(ts.record_paths())
    due = dict(zip(ids, run_ats, strict=False))
    figures = overload_figures(due, rows, runs)
    used = cpu_delta(cpu0, cpu1)
    finished = len(ids) - figures["lost"]
    result = {
        "scenario": "overload",
        "store": store.kind,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "work_ms": args.work_ms,
        "lease_s": args.lease,
        "busy": args.busy,
        "capacity_per_s": round(capacity, 1),
        "offered_per_s": round(rate, 1),
        "duration_s": args.duration,
        **offered,
        **drained,
        **figures,
        "server_schedule_to_start_mean_ms": mean_ms(
            ctr0, ctr1, "timeshard_schedule_to_start_seconds"
        ),
        "node_lease_expiries": counter_delta(ctr0, ctr1, "timeshard_lease_expiries_total"),
        "cpu_s_per_1k": {
            "server": per_1k(used["server"], finished),
            "workers": per_1k(used["workers"], finished),
        },
        "load_average": {"during": during},
        "machine": machine(),
    }
    return result, [(f"timeshard {store.kind} overload", first_starts(due, runs))]


def first_starts(
    due: Mapping[str, int], runs: Iterable[HandlerRun]
) -> list[tuple[float, float, float]]:
    """(due ms, start ms, lateness s) of each job's first handler run, by start: for --plot."""
    first: dict[str, float] = {}
    for run in runs:
        if run.job in due:
            first[run.job] = min(first.get(run.job, run.start_ms), run.start_ms)
    rows = [(float(due[j]), start, (start - due[j]) / 1000) for j, start in first.items()]
    return sorted(rows, key=lambda r: r[1])
