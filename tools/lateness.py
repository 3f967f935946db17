"""Measure firing lateness against a running node (e.g. `timeshard dev`).

    python tools/lateness.py --jobs 1000 --spread 2 [--server 127.0.0.1:50051] [--json]

Schedules N `demo.echo` jobs due within the same few seconds (uniform over --spread seconds,
starting --lead seconds from now), waits until every one has succeeded, and prints the lateness
(started_at - run_at, both taken by the server) p50 / p99 / max. Needs a worker for demo.echo
(`timeshard dev` runs one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from timeshard.client import Client, Job
from timeshard.clock import to_datetime
from timeshard.model import JobState


def percentile(values: list[int], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return float(ordered[k])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--spread", type=float, default=2.0)
    ap.add_argument("--lead", type=float, default=4.0)
    ap.add_argument("--type", default="demo.echo")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    client = Client(args.server)
    start = time.time() + args.lead
    run_ats = [round((start + args.spread * i / args.jobs) * 1000) for i in range(args.jobs)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        ids = list(
            pool.map(
                lambda at: client.schedule(args.type, {"n": at}, at=to_datetime(at)).job_id, run_ats
            )
        )
    sched_s = time.monotonic() - t0
    print(f"scheduled {len(ids)} jobs in {sched_s:.2f}s", file=sys.stderr)
    if time.time() > start:
        print("warning: scheduling took longer than --lead; raise it", file=sys.stderr)

    pending = set(ids)
    lateness: list[int] = []
    deadline = time.monotonic() + args.lead + args.spread + 60
    while pending and time.monotonic() < deadline:
        time.sleep(0.5)
        done: list[Job] = []
        for job in client.list_jobs(state=JobState.SUCCEEDED, job_type=args.type, page_size=1000):
            if job.job_id in pending:
                done.append(job)
        for job in done:
            pending.discard(job.job_id)
            assert job.started_at is not None  # a succeeded job has started
            lateness.append(round((job.started_at - job.run_at).total_seconds() * 1000))
        print(f"  {len(ids) - len(pending)}/{len(ids)} done", file=sys.stderr)
    result = {
        "jobs": len(ids),
        "done": len(lateness),
        "schedule_per_s": round(len(ids) / sched_s, 1),
        "lateness_ms_p50": percentile(lateness, 50) if lateness else None,
        "lateness_ms_p99": percentile(lateness, 99) if lateness else None,
        "lateness_ms_max": max(lateness) if lateness else None,
        "early": sum(1 for x in lateness if x < 0),
        "mean_ms": round(statistics.fmean(lateness), 1) if lateness else None,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>18}: {v}")
    return 0 if not pending and result["early"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
