"""The worker of a chaos run: ``chaos.job`` works for ``seconds`` (from its payload), then
fails as the payload says (``fail_times``: a retryable failure on attempts up to that number;
``permanent``: straight to the dead-letter queue) or applies its effect, keyed by
``ctx.idempotency_key``, and succeeds. Every step goes to this process's ledger file; so do the
SDK's events (the result accepted, refused, not sent; the lease lost).

    TIMESHARD_CHAOS_DIR=RUN_DIR timeshard --server A,B,C worker \\
        timeshard.testing.chaos.worker:worker --id worker0

The ledger lives outside the system under test (see ``ledger.py``).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from timeshard.testing.chaos.ledger import (
    JOB_TYPE,
    LEDGER_DIR,
    RATED_TYPE,
    Effects,
    JsonLines,
    now_mono,
    now_wall_ms,
)
from timeshard.worker import JobContext, PermanentError, Worker
from timeshard.worker.lease import LeaseLost

LEASE_S = 4.0


class _Recorder:
    """This process's ledger file and the shared effects, opened on first use (the worker id
    is set by the command line after this module is imported)."""

    def __init__(self) -> None:
        self._lines: JsonLines | None = None
        self._effects: Effects | None = None

    @property
    def run_dir(self) -> Path:
        return Path(os.environ["TIMESHARD_CHAOS_DIR"])

    def write(self, ev: str, ctx: JobContext, **fields: Any) -> None:
        if self._lines is None:
            name = f"{ctx.worker_id}-{os.getpid()}.jsonl"
            self._lines = JsonLines(self.run_dir / LEDGER_DIR / name)
        self._lines.write(
            {
                "ev": ev,
                "job": ctx.job_id,
                "fence": ctx.fence,
                "mono": now_mono(),
                "wall": now_wall_ms(),
                **fields,
            }
        )

    def start(self, ctx: JobContext) -> None:
        self.write(
            "start",
            ctx,
            attempt=ctx.attempt,
            key=ctx.idempotency_key,
            worker=ctx.worker_id,
            pid=os.getpid(),
            run_at=ctx.run_at,
            started_at=ctx.started_at_ms,
        )

    def apply_effect(self, ctx: JobContext) -> None:
        if self._effects is None:
            self._effects = Effects(self.run_dir)
        result = self._effects.apply(
            key=ctx.idempotency_key, job=ctx.job_id, fence=ctx.fence, worker=ctx.worker_id
        )
        self.write(
            "effect",
            ctx,
            key=ctx.idempotency_key,
            result="applied" if result.applied else "duplicate",
            prior=result.prior,
        )


recorder = _Recorder()


def _on_event(kind: str, ctx: JobContext, detail: str) -> None:
    if kind != "started":  # the handler writes its own start
        recorder.write("sdk", ctx, kind=kind, detail=detail[:500])


worker = Worker(lease_s=LEASE_S, claim_wait_s=10.0, on_event=_on_event)


@worker.handler(JOB_TYPE, timeout=60, concurrency=64)
async def run(ctx: JobContext) -> None:
    spec = ctx.json() or {}
    recorder.start(ctx)
    outcome = "error"
    try:
        await asyncio.sleep(float(spec.get("seconds", 0.05)))  # 0: act at once
        ctx.check()  # the step after the work: a holder past its lease stops here
        if ctx.attempt <= int(spec.get("fail_times", 0)):
            outcome = "retry"
            raise RuntimeError(f"planned retryable failure on attempt {ctx.attempt}")
        if spec.get("permanent"):
            outcome = "permanent"
            raise PermanentError("planned permanent failure")
        recorder.apply_effect(ctx)
        outcome = "ok"
    except LeaseLost:
        outcome = "lost"
        raise
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        recorder.write("end", ctx, outcome=outcome, cancelled=ctx.cancelled)


@worker.handler(RATED_TYPE, timeout=60, concurrency=64)
async def run_rated(ctx: JobContext) -> None:
    await run(ctx)
