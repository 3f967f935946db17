"""Celery ETA tasks on a Redis broker: the `tools/loadtest.py fire` and `steady` workloads here.

    python tools/peers/celery_redis.py --jobs 20000 [--window 10] [--pool threads] [--json]
    python tools/peers/celery_redis.py --rate 400 --duration 30 [--lead-s 2] [--json]

Starts a local redis-server (127.0.0.1, free port, fresh folder, AOF on with fsync every second,
no RDB snapshots) and one Celery worker process, sends N no-op tasks with an `eta` a few
seconds ahead, spread over --window seconds (one `send_task` per job, as an application would),
and measures jobs/s from the first due time until the last task body started, and lateness
(start minus eta) p50 / p99 / max. With --rate, the steady workload instead: --rate tasks a
second for --duration seconds, each sent --lead-s before its eta (as `loadtest steady` offers
them), and the CPU per fired task of the worker's and of redis-server's processes over that run.
Needs `redis-server` (Debian) and `celery[redis]` (pip). Progress on stderr; figures on stdout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _common as c
import celery

STEADY_LEAD_S = 2.0  # as `loadtest steady`'s default --lead

APP_MODULE = """
import os, time
from celery import Celery
from celery.signals import worker_ready

app = Celery("bench", broker=os.environ["BENCH_BROKER"])
app.conf.update(
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 3600},
)
OUT = os.environ["BENCH_OUT"]
_files = {}

@app.task(name="bench.noop")
def noop(index=-1, due=0.0):
    start = time.time_ns() / 1e6
    f = _files.get(os.getpid())
    if f is None:
        f = _files[os.getpid()] = open(f"{OUT}/starts-{os.getpid()}.txt", "a", buffering=1)
    f.write(f"{start:.3f} {due:.3f} {index}\\n")

@worker_ready.connect
def ready(**_):
    open(f"{OUT}/ready", "w").close()
"""


def main() -> int:
    ap = c.common_args(__doc__)
    ap.add_argument("--pool", default="threads", choices=["solo", "prefork", "threads"])
    ap.add_argument("--concurrency", type=int, default=0, help="worker pool size (default: pool's)")
    ap.add_argument("--rate", type=float, default=0, help="steady: tasks sent per second")
    ap.add_argument("--duration", type=float, default=30, help="steady: seconds of offered load")
    args = ap.parse_args()
    if args.rate < 0 or args.duration <= 0 or (args.rate and args.lead_s < 0):
        ap.error("--rate must be >= 0, --duration > 0 and --lead-s >= 0")

    tmp = Path(tempfile.mkdtemp(prefix="bench-celery-"))
    out = tmp / "out"
    out.mkdir()
    (tmp / "bench_app.py").write_text(APP_MODULE)
    port = c.free_port()
    broker = f"redis://127.0.0.1:{port}/0"
    env = c.child_env(BENCH_BROKER=broker, BENCH_OUT=str(out), PYTHONPATH=str(tmp))
    log = open(tmp / "processes.log", "wb")  # noqa: SIM115
    redis = worker = None
    notes = setup_notes(args)
    try:
        redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
            stdout=log, stderr=log,
        )  # fmt: skip
        c.wait_tcp(port)
        cmd = [sys.executable, "-m", "celery", "-A", "bench_app", "worker", "--pool", args.pool,
               "--loglevel", "WARNING", "--without-heartbeat", "--without-gossip",
               "--without-mingle"]  # fmt: skip
        if args.concurrency:
            cmd += ["--concurrency", str(args.concurrency)]
        worker = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=tmp)
        c.wait_file(out / "ready", 60, "the Celery worker to start")

        app = celery.Celery("client", broker=broker)
        app.conf.broker_transport_options = {"visibility_timeout": 3600}
        procs = {"worker": worker, "broker": redis}
        run = steady if args.rate else burst
        result = run(app, args, out, procs, notes)
    finally:
        c.stop([worker, redis])
        log.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    c.emit(result, args.json)
    return 0


def setup_notes(args) -> list[str]:
    return [
        f"celery {celery.__version__}, {redis_version()}; redis: appendonly yes, "
        "appendfsync everysec, RDB snapshots off",
        f"one worker process, --pool {args.pool}"
        + (f" --concurrency {args.concurrency}" if args.concurrency else "")
        + ", --without-heartbeat --without-gossip --without-mingle, no result backend (threads"
        " with 2 threads was the fastest here: prefork -c 2/4 fired ~0.5-0.7x as fast, threads"
        " -c 8 no faster, and solo stalled at ~19 ETA tasks/s in a 2000-job trial)",
        "ETA tasks are taken off the Redis list at once and held in the worker's memory until due"
        " (prefetch grows by one per ETA task); unacked ones are only redelivered after the"
        " broker visibility_timeout (set to 3600 s here), so an ETA further ahead than that is"
        " delivered again, possibly to a second worker",
        "tasks sent one by one with send_task(eta=...) from the driver process"
        + (
            f", {args.rate:g}/s, each {args.lead_s or STEADY_LEAD_S:g} s before its eta"
            if args.rate
            else ", after 1000 warm-up tasks due in 2100 (held by the worker, never run) to"
            " time the lead"
        ),
    ]


def burst(app: celery.Celery, args, out: Path, procs: dict, notes: list[str]) -> dict:
    """--jobs tasks due over --window seconds, all sent before the first is due."""
    with app.producer_or_acquire() as producer:
        lead_s = args.lead_s or warmup_lead(app, producer, args.jobs)
        due_ms = c.now_ms() + lead_s * 1000
        dues = c.due_times(due_ms, args.jobs, args.window)
        etas = [datetime.fromtimestamp(d / 1000, UTC) for d in dues]
        c.log(f"scheduling {args.jobs} Celery ETA tasks due in {lead_s:.0f}s")
        t0 = time.monotonic()
        for i in range(args.jobs):
            app.send_task("bench.noop", args=[i, dues[i]], eta=etas[i], producer=producer)
            if (i + 1) % 10_000 == 0:
                c.log(f"  scheduled {i + 1}/{args.jobs}")
    rate = args.jobs / (time.monotonic() - t0)
    c.log(f"  scheduled {args.jobs} at {rate:.0f}/s")
    if c.now_ms() > due_ms:
        c.log("warning: scheduling ran past the due time")
        notes.append("scheduling ran past the due time: raise --lead-s")
    c.wait_starts(out, args.jobs, args.timeout, list(procs.values()))
    return c.figures("celery+redis", out, args.jobs, due_ms, rate, notes, args.window)


def steady(app: celery.Celery, args, out: Path, procs: dict, notes: list[str]) -> dict:
    """--rate tasks a second for --duration s, each sent --lead-s before its eta; the CPU of
    the worker and of redis-server from the first send until the last task started."""
    count = round(args.rate * args.duration)
    lead_s = args.lead_s or STEADY_LEAD_S
    due_ms = c.now_ms() + lead_s * 1000
    dues = c.due_times(due_ms, count, count / args.rate)
    c.log(f"offering {count} Celery ETA tasks at {args.rate:g}/s, each due {lead_s:g}s later")
    pids = {name: p.pid for name, p in procs.items()}
    cpu0, t0, late_sends = c.cpu_seconds(pids), time.monotonic(), 0
    with app.producer_or_acquire() as producer:
        for i in c.paced(count, args.rate):
            eta = datetime.fromtimestamp(dues[i] / 1000, UTC)
            app.send_task("bench.noop", args=[i, dues[i]], eta=eta, producer=producer)
            late_sends += c.now_ms() > dues[i]
    rate = count / (time.monotonic() - t0)
    c.wait_starts(out, count, args.timeout, list(procs.values()))
    cpu1 = c.cpu_seconds(pids)
    if late_sends:
        notes.append(f"{late_sends} tasks were sent after their eta: the driver fell behind")
    result = c.figures("celery+redis", out, count, due_ms, rate, notes, args.duration)
    return {
        **result,
        "scenario": "steady",
        "offered_per_s": args.rate,
        "duration_s": args.duration,
        "lead_s": lead_s,
        "sent_after_due": late_sends,
        "per_fired_job": c.cpu_per_job(cpu0, cpu1, count - result["lost"]),
    }


def warmup_lead(app: celery.Celery, producer, n: int) -> float:
    """Time 1000 sends of far-future ETA tasks (the worker takes them in and holds them, as it
    will the real ones, so the rate includes that load), return the lead to use."""
    eta = datetime(2100, 1, 1, tzinfo=UTC)
    t0 = time.monotonic()
    for _ in range(1000):
        app.send_task("bench.noop", eta=eta, producer=producer)
    return c.lead_from_rate(n, 1000 / (time.monotonic() - t0))


def redis_version() -> str:
    text = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return "redis " + text.split("v=")[1].split()[0] if "v=" in text else "redis ?"


if __name__ == "__main__":
    sys.exit(main())
