"""The built-in demo handlers that ``timeshard dev`` runs: ``demo.echo``, ``demo.sleep``,
``demo.fail``. Importable as ``timeshard.cli.demo:worker`` for ``timeshard worker`` too."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from timeshard.worker import JobContext, Worker

log = logging.getLogger("timeshard.demo")


def add_demo_handlers(worker: Worker) -> Worker:
    @worker.handler("demo.echo", timeout=30, concurrency=64)
    async def echo(ctx: JobContext) -> None:
        log.info("demo.echo %s: %s", ctx.job_id, ctx.payload.decode("utf-8", "replace"))

    @worker.handler("demo.sleep", timeout=3600, concurrency=16)
    async def sleep(ctx: JobContext) -> None:
        seconds = float(_get(ctx, "seconds", 1.0))
        await asyncio.sleep(seconds)

    @worker.handler("demo.fail", timeout=30, concurrency=16)
    async def fail(ctx: JobContext) -> None:
        times = int(_get(ctx, "times", 1))
        if ctx.attempt <= times:
            raise RuntimeError(f"demo.fail: failing attempt {ctx.attempt} of the first {times}")

    return worker


def _get(ctx: JobContext, key: str, default: Any) -> Any:
    data = ctx.json()
    return data.get(key, default) if isinstance(data, dict) else default


worker = add_demo_handlers(Worker())
