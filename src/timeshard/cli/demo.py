"""The built-in demo handlers that ``timeshard dev`` runs: ``demo.echo``, ``demo.sleep``,
``demo.fail``. Importable as ``timeshard.cli.demo:worker`` for ``timeshard worker`` too."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from timeshard.worker import JobContext, PermanentError, Worker

log = logging.getLogger("timeshard.demo")


def add_demo_handlers(worker: Worker) -> Worker:
    @worker.handler("demo.echo", timeout=30, concurrency=64)
    async def echo(ctx: JobContext) -> Any:
        """Logs its payload and returns it: the job's result (``jobs get ID --result``)."""
        log.info("demo.echo %s: %s", ctx.job_id, ctx.payload.decode("utf-8", "replace"))
        try:
            return ctx.json()
        except ValueError:
            return ctx.payload

    @worker.handler("demo.sleep", timeout=3600, concurrency=16)
    async def sleep(ctx: JobContext) -> None:
        seconds = float(_get(ctx, "seconds", 1.0))
        await asyncio.sleep(seconds)

    failures: dict[str, int] = {}  # per job id, in this process: a replay can then succeed

    @worker.handler("demo.fail", timeout=30, concurrency=16)
    async def fail(ctx: JobContext) -> None:
        """Fails ``times`` times (counted per job in this worker), then succeeds; with
        ``"permanent": true`` its failures are permanent (straight to the dead-letter queue)."""
        times = int(_get(ctx, "times", 1))
        seen = failures.get(ctx.job_id, 0)
        if seen < times:
            failures[ctx.job_id] = seen + 1
            error = PermanentError if _get(ctx, "permanent", False) else RuntimeError
            raise error(f"demo.fail: failure {seen + 1} of {times}")

    return worker


def _get(ctx: JobContext, key: str, default: Any) -> Any:
    data = ctx.json()
    return data.get(key, default) if isinstance(data, dict) else default


worker = add_demo_handlers(Worker())
