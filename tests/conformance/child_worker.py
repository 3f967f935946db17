"""The worker C6 kills: ``c6.hang`` notes ``<job_id> <fence>`` in ``$CHILD_RECORD`` and then
waits until the process is killed.

    timeshard worker tests.conformance.child_worker:worker --lease 2
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from timeshard.worker import JobContext, Worker

worker = Worker(claim_wait_s=0.5)


@worker.handler("c6.hang", timeout=60)
async def hang(ctx: JobContext) -> None:
    Path(os.environ["CHILD_RECORD"]).write_text(f"{ctx.job_id} {ctx.fence}\n")
    await asyncio.sleep(3600)
