"""Procrastinate on PostgreSQL: the `tools/loadtest.py fire` workload on this machine.

    python tools/peers/procrastinate_pg.py --jobs 20000 [--concurrency 32] [--poll-s 5] [--json]

Starts a local PostgreSQL cluster (Debian `postgresql`, initdb in a fresh folder, 127.0.0.1,
default durability: fsync on, synchronous_commit on) and one Procrastinate worker process
(async no-op task), defers N jobs due a few seconds ahead, spread over --window seconds, in
batches of 500, 4 batches in flight (as batch_defer_async, with a schedule_at per job), and
measures jobs/s from the first due time until the last job body started, and lateness (start
minus due time) p50 / p99 / max.
Needs procrastinate (pip, with psycopg[binary]). Progress on stderr; figures on stdout.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import _common as c
import psycopg
from _pg import start_postgres

APP_MODULE = """
import os, time
import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=os.environ["BENCH_CONNINFO"], min_size=1, max_size=int(os.environ["BENCH_POOL"])))
_f = None

@app.task(name="bench.noop")
async def noop(index: int = -1, due: float = 0.0):
    global _f
    start = time.time_ns() / 1e6
    if _f is None:
        _f = open(f"{os.environ['BENCH_OUT']}/starts-{os.getpid()}.txt", "a", buffering=1)
    _f.write(f"{start:.3f} {due:.3f} {index}\\n")

def run():
    open(os.environ["BENCH_OUT"] + "/ready", "w").close()
    app.run_worker(concurrency=int(os.environ["BENCH_CONCURRENCY"]),
                   fetch_job_polling_interval=float(os.environ["BENCH_POLL_S"]))
"""


async def defer_all(noop, dues: list[float], batch: int = 500, in_flight: int = 4) -> float:
    """Defer one job per due time in batches (each job its own schedule_at: the jobs a batch
    carries are built as batch_defer_async builds them, with the time set per job)."""
    sem = asyncio.Semaphore(in_flight)
    deferrer = noop.configure(schedule_at=datetime.fromtimestamp(dues[0] / 1000, UTC))
    at = [datetime.fromtimestamp(d / 1000, UTC) for d in dues]
    n, done = len(dues), 0

    async def one(start: int) -> None:
        nonlocal done
        async with sem:
            jobs = [
                deferrer.job.evolve(task_kwargs={"index": i, "due": dues[i]}, scheduled_at=at[i])
                for i in range(start, min(n, start + batch))
            ]
            await deferrer.job_manager.batch_defer_jobs_async(jobs=jobs)
            done += len(jobs)
            if done % 10_000 < len(jobs):
                c.log(f"  scheduled {done}/{n}")

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(0, n, batch)))
    return n / (time.monotonic() - t0)


async def schedule(conninfo: str, n: int, lead_s: float, window_s: float) -> tuple[float, float]:
    import bench_app

    app = bench_app.app
    async with app.open_async():
        if not n:
            await app.schema_manager.apply_schema_async()
            return 0.0, 0.0
        if not lead_s:  # warm-up: 1000 far-future jobs on a queue of their own, then deleted
            far = datetime(2100, 1, 1, tzinfo=UTC)
            warm = bench_app.noop.configure(queue="bench.warmup", schedule_at=far)
            t0 = time.monotonic()
            for _ in range(2):
                await warm.batch_defer_async(*[{} for _ in range(500)])
            lead_s = c.lead_from_rate(n, 1000 / (time.monotonic() - t0))
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                await conn.execute(
                    "DELETE FROM procrastinate_jobs WHERE queue_name = 'bench.warmup'"
                )
        due_ms = c.now_ms() + lead_s * 1000
        c.log(f"scheduling {n} Procrastinate jobs due in {lead_s:.0f}s")
        rate = await defer_all(bench_app.noop, c.due_times(due_ms, n, window_s))
        c.log(f"  scheduled {n} at {rate:.0f}/s")
        return due_ms, rate


def main() -> int:
    ap = c.common_args(__doc__)
    ap.add_argument("--concurrency", type=int, default=32, help="worker concurrency")
    ap.add_argument(
        "--poll-s", type=float, default=5.0, help="fetch_job_polling_interval (default: 5.0)"
    )
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-procrastinate-"))
    out = tmp / "out"
    out.mkdir()
    (tmp / "bench_app.py").write_text(APP_MODULE)
    sys.path.insert(0, str(tmp))
    log = open(tmp / "processes.log", "wb")  # noqa: SIM115
    pg = worker = None
    try:
        pg, url, pg_version = start_postgres(tmp, log)
        conninfo = f"postgresql://{url}"
        env = c.child_env(
            BENCH_OUT=str(out),
            BENCH_CONNINFO=conninfo,
            BENCH_POOL=str(args.concurrency + 4),
            BENCH_CONCURRENCY=str(args.concurrency),
            BENCH_POLL_S=str(args.poll_s),
            PYTHONPATH=str(tmp),
        )
        os.environ.update(BENCH_CONNINFO=conninfo, BENCH_POOL="8", BENCH_OUT=str(out))
        notes = [
            f"procrastinate {version('procrastinate')}, psycopg {version('psycopg')}, "
            f"{pg_version} (fsync on, synchronous_commit on)",
            f"one worker process, concurrency {args.concurrency}, fetch_job_polling_interval "
            f"{args.poll_s}s, listen_notify on (NOTIFY fires when a job is deferred, not when it"
            " becomes due: a scheduled job waits for the next poll)",
            "jobs deferred with batch_defer_async, 500 a batch, 4 batches in flight; the lead"
            " time comes from a warm-up of 1000 far-future jobs on another queue, deleted again",
        ]
        asyncio.run(schedule(conninfo, 0, 0, 0))  # the schema only
        worker = subprocess.Popen(
            [sys.executable, "-c", "import bench_app; bench_app.run()"],
            stdout=log,
            stderr=log,
            env=env,
            cwd=tmp,
        )
        c.wait_file(out / "ready", 60, "the Procrastinate worker to start")
        due_ms, rate = asyncio.run(schedule(conninfo, args.jobs, args.lead_s, args.window))
        if c.now_ms() > due_ms:
            c.log("warning: scheduling ran past the due time")
            notes.append("scheduling ran past the due time: raise --lead-s")
        c.wait_starts(out, args.jobs, args.timeout, [worker, pg])
        result = c.figures(
            "procrastinate+postgres", out, args.jobs, due_ms, rate, notes, args.window
        )
    finally:
        c.stop([worker, pg])
        log.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    c.emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
