"""A worker for the chaos tests and tools/failover.py: ``chaos.run`` sleeps ``seconds`` (from
its payload) and appends one JSON line per run to ``$TIMESHARD_RECORD``: when the handler really
started and ended (wall clock, one machine), so the tests can see whether two runs of a job ever
overlapped.

    python -m timeshard.cli.main --server A,B,C worker timeshard.testing.recorder:worker
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from timeshard.worker import JobContext, Worker

worker = Worker(lease_s=4.0)


@worker.handler("chaos.run", timeout=30, concurrency=64)
async def run(ctx: JobContext) -> None:
    started = time.time()
    try:
        await asyncio.sleep(float(ctx.json().get("seconds", 0.05)))
    finally:
        record(ctx, started, time.time())


def record(ctx: JobContext, started: float, ended: float) -> None:
    line = {
        "job_id": ctx.job_id,
        "attempt": ctx.attempt,
        "fence": ctx.fence,
        "worker": ctx.worker_id,
        "run_at": ctx.run_at,
        "started_at_ms": ctx.started_at_ms,
        "start": started,
        "end": ended,
        "cancelled": ctx.cancelled,
    }
    with open(os.environ["TIMESHARD_RECORD"], "a") as out:
        out.write(json.dumps(line) + "\n")
