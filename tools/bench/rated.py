"""``rated``: a rate-limited job type under overload. The type gets a cluster-wide rate of R
jobs/s (``SetTypeFlows``), then N jobs come due at once, far more than R can start in the
time; the workers have slots for all of them. The figures: jobs started per 1-second window
against R (printed, and plotted with ``--plot``), and the most started in any 10-second window
against the limit the design promises (R x 10 plus the burst, within 10 %)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import grpc

from timeshard.node.flow import default_burst
from timeshard.testing.loadworker import JOB_TYPE
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc

from .progress import Progress, note
from .records import figures, timeline
from .scenarios import machine, running, wait_fired
from .submit import now_ms, schedule


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("rated", help="a rate-limited type under overload: achieved vs configured")
    p.add_argument("--limit", type=float, default=50.0, help="the type's rate, jobs/s (50)")
    p.add_argument("--burst", type=int, default=0, help="its burst (0: the default)")
    p.add_argument("--jobs", type=int, default=1500, help="jobs due at once (1500: 30 s at 50/s)")
    return p


def set_rate(address: str, rate: float, burst: int) -> pb.TypeInfo:
    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.AdminServiceStub(ch)
        flow = pb.TypeFlow(type=JOB_TYPE, rate=rate, burst=burst)
        resp = stub.SetTypeFlows(pb.SetTypeFlowsRequest(flows=[flow]), timeout=10)
    info: pb.TypeInfo = resp.types[0]
    return info


def per_second(starts_ms: list[float], t0: float) -> list[int]:
    """Jobs started in each whole second from ``t0`` to the last start."""
    if not starts_ms:
        return []
    counts = [0] * (int((max(starts_ms) - t0) // 1000) + 1)
    for s in starts_ms:
        if s >= t0:
            counts[int((s - t0) // 1000)] += 1
    return counts


def most_in(starts_ms: list[float], span_ms: float, step_ms: float = 100) -> int:
    """The most jobs started in any window of ``span_ms``, sliding by ``step_ms``."""
    starts = sorted(starts_ms)
    if not starts:
        return 0
    best, lo = 0, 0
    t = starts[0]
    while t <= starts[-1]:
        while lo < len(starts) and starts[lo] < t:
            lo += 1
        hi = lo
        while hi < len(starts) and starts[hi] < t + span_ms:
            hi += 1
        best = max(best, hi - lo)
        t += step_ms
    return best


def rated(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    with running(args) as (ts, store, records):
        info = set_rate(ts.address, args.limit, args.burst)
        burst = info.burst or default_burst(args.limit)
        note(f"{JOB_TYPE}: rate {info.rate:g}/s, burst {burst}; {args.jobs} jobs due at once")
        due = int(now_ms() + 1000)
        progress = Progress("ingest", args.jobs)
        ids = schedule(ts.address, [due] * args.jobs, args.mode, progress)
        progress.close()
        wait_fired(ts, records, args.jobs, (due, due), args.drain, label="rated")
        result = figures(records, ids, due)
        rows = timeline(records, ids)
    starts = [start for _, start, _ in rows]
    seconds = per_second(starts, min(starts, default=due))  # from the first start
    steady = seconds[1:-1] or seconds  # the first and last second are partial
    ten_s = most_in(starts, 10_000)
    out: dict[str, Any] = {
        "scenario": "rated",
        "store": store.kind,
        "workers": args.workers,
        "configured_per_s": args.limit,
        "burst": burst,
        "jobs": args.jobs,
        "fired": result["fired"],
        "lost": result["lost"],
        "duplicates": result["duplicates"],
        "early": result["early"],
        "achieved_per_s": round(sum(steady) / len(steady), 2) if steady else None,
        "achieved_over_configured": round(sum(steady) / len(steady) / args.limit, 3)
        if steady
        else None,
        "min_1s": min(steady) if steady else None,
        "max_1s": max(steady) if steady else None,
        "max_10s": ten_s,
        "max_10s_limit": round(args.limit * 10 * 1.1, 1),
        "max_10s_over_configured": round(ten_s / (args.limit * 10), 3)
        if len(seconds) > 10
        else None,
        "per_1s": seconds,
        "machine": machine(),
    }
    return out, [("per 1 s", seconds)]


def plot_rated(path: str, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = result["per_1s"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.step(range(len(seconds)), seconds, where="post", label="started per 1 s window")
    ax.axhline(result["configured_per_s"], color="red", linestyle="--", label="configured rate")
    ax.set_xlabel("seconds since the first job started")
    ax.set_ylabel("jobs started / s")
    ax.set_title(
        f"timeshard loadtest rated ({result['store']}): {result['configured_per_s']:g}/s "
        f"configured, {result['achieved_per_s']}/s achieved, max 10 s window "
        f"{result['max_10s']} (limit {result['max_10s_limit']:g})"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=110)
    plt.close(fig)
