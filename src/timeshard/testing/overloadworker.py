"""The worker of ``tools/loadtest.py overload``: ``loadtest.work`` takes a fixed time
(``$TIMESHARD_LOADTEST_WORK_MS``, 100 by default, awaited: the handler holds its slot, not a
core) and notes each run's start and end in ``$TIMESHARD_RECORD``, one line each:

    S <job_id> <fence> <attempt> <run_at> <start_ms>
    E <job_id> <fence> <end_ms> <outcome>

``attempt`` is the number the claim gave the run, ``run_at`` the due time it carries (a
retry's own), times are the wall clock in epoch ms. ``outcome``: ``ok`` (returned), ``lost``
(its lease was lost: it stopped at its step after the work), ``cancelled`` (stopped by the SDK
mid-work: lease lost, timeout, the worker stopping). The load test counts from these lines
what the store cannot say: which deliveries really started a handler, and whether two runs of
one job were ever active at once.

    TIMESHARD_RECORD=runs.log timeshard --server H:P worker \\
        timeshard.testing.overloadworker:worker --lease 2

Slots per process: ``$TIMESHARD_LOADTEST_CONCURRENCY`` (4). The lease is the command line's.
"""

from __future__ import annotations

import asyncio
import os
import time

from timeshard.testing.loadworker import run_log
from timeshard.worker import JobContext, Worker
from timeshard.worker.lease import LeaseLost

JOB_TYPE = "loadtest.work"
WORK_S = float(os.environ.get("TIMESHARD_LOADTEST_WORK_MS", "100")) / 1000
CONCURRENCY = int(os.environ.get("TIMESHARD_LOADTEST_CONCURRENCY", "4"))

worker = Worker(lease_s=2.0, claim_wait_s=5.0)


def _now_ms() -> float:
    return time.time_ns() / 1e6


@worker.handler(JOB_TYPE, timeout=60, concurrency=CONCURRENCY)
async def work(ctx: JobContext) -> None:
    log = run_log()
    log.write(f"S {ctx.job_id} {ctx.fence} {ctx.attempt} {ctx.run_at} {_now_ms():.3f}")
    outcome = "error"
    try:
        await asyncio.sleep(WORK_S)
        ctx.check()  # the step after the work: a run past its lease stops here
        outcome = "ok"
    except LeaseLost:
        outcome = "lost"
        raise
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        log.write(f"E {ctx.job_id} {ctx.fence} {_now_ms():.3f} {outcome}")
