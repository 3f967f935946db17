"""The no-op worker of ``tools/loadtest.py``: ``loadtest.noop`` does nothing but note, for each
run, the job id, its due time and when the handler started (wall clock, ms), one line per run
in ``$TIMESHARD_RECORD``:

    <job_id> <run_at> <start_ms>

Lines are buffered and written out at least every 0.2 s (and at exit), so the load test can
follow progress while the recording costs a few microseconds per job.

    timeshard --server HOST:PORT worker timeshard.testing.loadworker:worker

``TIMESHARD_LOADTEST_STREAM=0`` (inherited from ``tools/loadtest.py``) makes it use the unary
calls instead of the worker stream (the SDK's default), to compare the two;
``TIMESHARD_LOADTEST_CLAIM_POLLS=N`` sets its long polls per node (``Worker.claim_polls``).

It follows the contract of ``tools/loadtest.py --worker-command`` (which other languages' load
workers follow too), so that command line is also a valid ``--worker-command``.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from typing import TextIO

from timeshard.worker import JobContext, Worker

JOB_TYPE = "loadtest.noop"
FLUSH_S = 0.2

worker = Worker(
    lease_s=60,
    claim_wait_s=5,
    use_stream=os.environ.get("TIMESHARD_LOADTEST_STREAM", "1") != "0",
    claim_polls=int(os.environ.get("TIMESHARD_LOADTEST_CLAIM_POLLS", "2")),
)
"""On the worker stream; ``TIMESHARD_LOADTEST_STREAM=0``: the unary Claim/Heartbeat/Finish."""


class RunLog:
    def __init__(self, path: str) -> None:
        self._out: TextIO = open(path, "a")  # noqa: SIM115 - closed at exit
        self._flusher: asyncio.Task[None] | None = None
        atexit.register(self.close)

    def add(self, job_id: str, run_at: int, start_ms: float, claimed_ms: int) -> None:
        """One run: the job, its due time, when its handler started here, and when the node
        claimed it (the attempt's ``started_at``: which node, the kill of a failover tells)."""
        self.write(f"{job_id} {run_at} {start_ms:.3f} {claimed_ms}")

    def write(self, line: str) -> None:
        """One line (given without its newline), out in the file within ``FLUSH_S``."""
        self._out.write(line + "\n")
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush_often(), name="loadworker-flush"
            )

    async def _flush_often(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self._out.flush()

    def close(self) -> None:
        self._out.close()


_log: RunLog | None = None


def run_log() -> RunLog:
    """This process's record, ``$TIMESHARD_RECORD``, opened on first use."""
    global _log
    if _log is None:
        _log = RunLog(os.environ["TIMESHARD_RECORD"])
    return _log


# TIMESHARD_CONCURRENCY as ``loadtest --worker-command`` sets it, or the older name
CONCURRENCY = os.environ.get("TIMESHARD_CONCURRENCY") or os.environ.get(
    "TIMESHARD_LOADTEST_CONCURRENCY", "512"
)


@worker.handler(JOB_TYPE, timeout=60, concurrency=int(CONCURRENCY))
async def noop(ctx: JobContext) -> None:
    start_ms = time.time_ns() / 1e6
    run_log().add(ctx.job_id, ctx.run_at, start_ms, ctx.started_at_ms)
