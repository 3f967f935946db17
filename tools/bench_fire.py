"""Fire throughput and lateness of timeshard on one machine, through the real processes.

    python tools/bench_fire.py --jobs 20000 [--store sqlite] [--json]

Starts `timeshard server` and one worker process (a no-op handler), schedules N jobs all due at
the same instant a few seconds ahead, and measures how fast they are claimed and completed:
jobs/s from the due time to the last completion, and lateness (server start time minus due
time) p50 / p99 / max. Progress on stderr; figures on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from timeshard.api.convert import ts
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "timeshard.cli.main"]

WORKER_MODULE = """
import json, os, sys, time
from timeshard.worker import Worker
worker = Worker(lease_s=60, claim_wait_s=5)
N = int(os.environ["BENCH_N"])
OUT = os.environ["BENCH_OUT"]
lateness = []
@worker.handler("bench.noop", timeout=60, concurrency=int(os.environ.get("BENCH_CONC", "512")))
async def noop(ctx):
    lateness.append(ctx.lateness_ms)
    if len(lateness) % 1000 == 0:
        sys.stderr.write(f"  {len(lateness)}/{N} started\\n")
    if len(lateness) == N:
        with open(OUT + ".tmp", "w") as f:
            json.dump({"lateness": lateness, "last_start_wall_ms": time.time_ns() // 1_000_000}, f)
        os.rename(OUT + ".tmp", OUT)
"""


def pct(values: list[int], p: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def schedule_all(address: str, n: int, due_ms: int, batch: int = 500) -> float:
    """ScheduleJobs in batches, a few in flight at once; returns jobs per second."""
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.JobServiceStub(ch)
        sem = asyncio.Semaphore(4)
        done = 0
        t0 = time.monotonic()

        async def one(count: int) -> None:
            nonlocal done
            async with sem:
                req = pb.ScheduleJobsRequest(
                    jobs=[
                        pb.ScheduleJobRequest(type="bench.noop", payload=b"{}", run_at=ts(due_ms))
                        for _ in range(count)
                    ]
                )
                await stub.ScheduleJobs(req, timeout=120)
                done += count
                if done % 10_000 < count:
                    sys.stderr.write(f"  scheduled {done}/{n}\n")

        sizes = [min(batch, n - i) for i in range(0, n, batch)]
        await asyncio.gather(*(one(k) for k in sizes))
        return n / (time.monotonic() - t0)


def wait_port(address: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with grpc.insecure_channel(address) as ch:
                grpc.channel_ready_future(ch).result(timeout=1)
                return
        except grpc.FutureTimeoutError:
            time.sleep(0.2)
    raise SystemExit(f"server {address} did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--store", default="sqlite", help="sqlite, or a cassandra:// URL")
    ap.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.port:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            args.port = sock.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="bench-fire-"))
    (tmp / "bench_worker.py").write_text(WORKER_MODULE)
    store = f"sqlite://{tmp}/bench.db" if args.store == "sqlite" else args.store
    address = f"127.0.0.1:{args.port}"
    out = tmp / "result.json"
    env = {**os.environ, "BENCH_N": str(args.jobs), "BENCH_OUT": str(out), "PYTHONPATH": str(tmp)}
    log = open(tmp / "processes.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [*CLI, "server", "--port", str(args.port), "--store", store, "--shards", "16"],
        stdout=log,
        stderr=log,
        env=env,
    )
    worker = None
    try:
        wait_port(address)
        worker = subprocess.Popen(
            [*CLI, "--server", address, "worker", "bench_worker:worker", "--quiet"],
            stdout=log,
            stderr=log,
            env=env,
            cwd=tmp,
        )
        lead_s = max(5.0, args.jobs / 2000)
        due = time.time_ns() // 1_000_000 + round(lead_s * 1000)
        sys.stderr.write(f"scheduling {args.jobs} jobs due in {lead_s:.0f}s ({store})\n")
        rate = asyncio.run(schedule_all(address, args.jobs, due))
        if time.time_ns() // 1_000_000 > due:
            sys.stderr.write("warning: scheduling ran past the due time\n")
        deadline = time.monotonic() + 600
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not out.exists():
            raise SystemExit("timed out waiting for the jobs to run")
        data = json.loads(out.read_text())
        lat = data["lateness"]
        span_s = max(0.001, (data["last_start_wall_ms"] - due) / 1000)
        result = {
            "store": args.store,
            "jobs": args.jobs,
            "schedule_per_s": round(rate),
            "fire_per_s": round(args.jobs / span_s),
            "lateness_ms_p50": pct(lat, 50),
            "lateness_ms_p99": pct(lat, 99),
            "lateness_ms_max": max(lat),
            "early": sum(1 for x in lat if x < 0),
        }
    finally:
        for p in (worker, server):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (worker, server):
            if p is not None:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        log.close()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>16}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
