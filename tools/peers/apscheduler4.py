"""APScheduler 4 with a SQL data store: the `tools/loadtest.py fire` workload on this machine.

    python tools/peers/apscheduler4.py --jobs 20000 [--store sqlite|postgres] [--json]

Adds N schedules with a DateTrigger a few seconds ahead, spread over --window seconds, from the
driver process, and runs them in one separate scheduler process (role "both": it turns due
schedules into jobs and runs them, a no-op coroutine on the async executor). Measures jobs/s from
the first due time until the last job body started, and lateness (start minus due) p50/p99/max.

  sqlite:   SQLAlchemyDataStore on sqlite+aiosqlite (a file; SQLite defaults: rollback journal,
            synchronous=FULL). The local event broker cannot cross processes, so the scheduler
            process is started after the schedules are added (still before the due time).
  postgres: a local PostgreSQL cluster (Debian `postgresql`, initdb in a fresh folder, 127.0.0.1,
            default durability: fsync on, synchronous_commit on), SQLAlchemyDataStore on
            postgresql+psycopg and the PsycopgEventBroker (LISTEN/NOTIFY); the scheduler process
            runs while the schedules are added.
Needs apscheduler==4.0.0a6 (pip; 4.x is only out as pre-releases), aiosqlite, psycopg[binary].
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import _common as c
import anyio
from _pg import start_postgres
from apscheduler import AsyncScheduler
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.local import LocalEventBroker
from apscheduler.eventbrokers.psycopg import PsycopgEventBroker
from apscheduler.triggers.date import DateTrigger

TASKS_MODULE = """
import os, time
_f = None

async def noop(index=-1, due=0.0):
    global _f
    start = time.time_ns() / 1e6
    if _f is None:
        _f = open(f"{os.environ['BENCH_OUT']}/starts-{os.getpid()}.txt", "a", buffering=1)
    _f.write(f"{start:.3f} {due:.3f} {index}\\n")
"""

RUNNER_MODULE = """
import anyio, os, sys
sys.path.insert(0, os.environ["BENCH_PEERS_DIR"])
from apscheduler4 import make_scheduler

async def main():
    async with make_scheduler(os.environ["BENCH_STORE"], os.environ["BENCH_URL"],
                              int(os.environ["BENCH_MAX_CONCURRENT"])) as scheduler:
        await scheduler.start_in_background()
        open(os.environ["BENCH_OUT"] + "/ready", "w").close()
        await anyio.sleep_forever()

anyio.run(main)
"""


def make_scheduler(store: str, url: str, max_concurrent: int = 100) -> AsyncScheduler:
    if store == "sqlite":
        return AsyncScheduler(
            SQLAlchemyDataStore(f"sqlite+aiosqlite:///{url}"),
            LocalEventBroker(),
            max_concurrent_jobs=max_concurrent,
        )
    return AsyncScheduler(
        SQLAlchemyDataStore(f"postgresql+psycopg://{url}"),
        PsycopgEventBroker(f"postgresql://{url}"),
        max_concurrent_jobs=max_concurrent,
    )


async def add_schedules(
    store: str, url: str, n: int, lead_s: float, in_flight: int, window_s: float = 0.0
) -> tuple:
    """Add N one-shot schedules due over `window_s` from this (client) process, `in_flight`
    add_schedule() calls at a time. Unless lead_s is given, the due time is set from the rate of
    a warm-up of paused schedules (removed again). Returns (due time in ms, schedules/s)."""
    import bench_tasks

    async with make_scheduler(store, url) as client:
        await client.configure_task(
            "bench.noop", func=bench_tasks.noop, job_executor="async", max_running_jobs=None
        )
        if not n:
            return 0.0, 0.0
        if not lead_s:
            far = DateTrigger(datetime(2100, 1, 1, tzinfo=UTC))
            t0 = time.monotonic()
            ids = [await client.add_schedule("bench.noop", far, paused=True) for _ in range(100)]
            lead_s = c.lead_from_rate(n, 100 / (time.monotonic() - t0))
            for schedule_id in ids:
                await client.remove_schedule(schedule_id)
        due_ms = c.now_ms() + lead_s * 1000
        dues = c.due_times(due_ms, n, window_s)
        c.log(f"scheduling {n} APScheduler date schedules due in {lead_s:.0f}s ({store})")
        t0 = time.monotonic()
        done = 0
        indices = iter(range(n))  # shared by the adders: each job is added once

        async def add() -> None:
            nonlocal done
            for i in indices:
                at = datetime.fromtimestamp(dues[i] / 1000, UTC)
                kwargs = {"index": i, "due": dues[i]}
                await client.add_schedule("bench.noop", DateTrigger(at), kwargs=kwargs)
                done += 1
                if done % 2_000 == 0:
                    c.log(f"  scheduled {done}/{n}")

        async with anyio.create_task_group() as tg:
            for _ in range(in_flight):
                tg.start_soon(add)
        return due_ms, n / (time.monotonic() - t0)


def main() -> int:
    ap = c.common_args(__doc__)
    ap.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    ap.add_argument(
        "--in-flight",
        type=int,
        default=4,
        help="add_schedule() calls in flight at once while scheduling",
    )
    ap.add_argument(
        "--max-concurrent",
        type=int,
        default=100,
        help="the scheduler's max_concurrent_jobs (APScheduler's default: 100)",
    )
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-aps4-"))
    out = tmp / "out"
    out.mkdir()
    (tmp / "bench_tasks.py").write_text(TASKS_MODULE)
    (tmp / "bench_runner.py").write_text(RUNNER_MODULE)
    sys.path.insert(0, str(tmp))
    log = open(tmp / "processes.log", "wb")  # noqa: SIM115
    pg = runner = None
    notes = [
        f"apscheduler {version('apscheduler')}, sqlalchemy {version('sqlalchemy')}",
        f"one scheduler process (role both), async executor, max_concurrent_jobs="
        f"{args.max_concurrent}, task max_running_jobs=None; one DateTrigger schedule per job,"
        f" added with add_schedule() from the driver process, {args.in_flight} calls in flight"
        " (there is no batch API); the lead time comes from a warm-up of 100 paused schedules,"
        " removed again",
    ]
    try:
        if args.store == "sqlite":
            url = str(tmp / "aps.db")
            notes[0] += f", aiosqlite {version('aiosqlite')}"
            notes.append(
                "store: SQLite file via aiosqlite, SQLite defaults (rollback journal, "
                "synchronous=FULL); LocalEventBroker, so the scheduler process is "
                "started after the schedules are added"
            )
        else:
            pg, url, pg_version = start_postgres(tmp, log)
            notes[0] += f", psycopg {version('psycopg')}, {pg_version}"
            notes.append(
                "store: local PostgreSQL (fsync on, synchronous_commit on) via psycopg,"
                " PsycopgEventBroker; the scheduler process runs during scheduling"
            )
        env = c.child_env(
            BENCH_OUT=str(out),
            BENCH_STORE=args.store,
            BENCH_URL=url,
            BENCH_MAX_CONCURRENT=str(args.max_concurrent),
            BENCH_PEERS_DIR=str(Path(__file__).resolve().parent),
            PYTHONPATH=str(tmp),
        )

        def start_runner() -> subprocess.Popen:
            p = subprocess.Popen(
                [sys.executable, str(tmp / "bench_runner.py")],
                stdout=log,
                stderr=log,
                env=env,
                cwd=tmp,
            )
            c.wait_file(out / "ready", 60, "the APScheduler process to start")
            return p

        if args.store == "postgres":
            # create the schema and the task first, then start the scheduler process
            asyncio.run(add_schedules(args.store, url, 0, 0, 1))
            runner = start_runner()
        due_ms, rate = asyncio.run(
            add_schedules(args.store, url, args.jobs, args.lead_s, args.in_flight, args.window)
        )
        c.log(f"  scheduled {args.jobs} at {rate:.0f}/s")
        if runner is None:
            runner = start_runner()
        if c.now_ms() > due_ms:
            c.log("warning: scheduling ran past the due time")
            notes.append("scheduling ran past the due time: raise --lead-s")
        c.wait_starts(out, args.jobs, args.timeout, [p for p in (runner, pg) if p])
        result = c.figures(
            f"apscheduler4+{args.store}", out, args.jobs, due_ms, rate, notes, args.window
        )
    finally:
        c.stop([runner, pg])
        log.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    c.emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
