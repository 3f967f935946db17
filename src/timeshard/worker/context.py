"""What a handler is given and what it is: the ``JobContext`` of one attempt (its job, its
fence and idempotency key, and its lease: ``cancelled``, ``check()``, ``checkpoint()``),
``PermanentError``, and the types of a handler, its registration (``HandlerSpec``) and the
worker's event hook. Split out of ``core`` so the SDK's parts and a metrics hook can name
them without the ``Worker``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from timeshard.worker.lease import Lease, LeaseLost


class PermanentError(Exception):
    """Raise from a handler when retrying can not help (bad input): the job goes to the DLQ."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobContext:
    job_id: str
    job_type: str
    payload: bytes
    attempt: int
    max_attempts: int
    fence: int
    """Pass to external systems that must reject stale writers (invariant 6)."""
    idempotency_key: str
    run_at: int
    started_at_ms: int
    worker_id: str
    _lease: Lease = field(default_factory=Lease, repr=False)

    def json(self) -> Any:
        return json.loads(self.payload or b"null")

    @property
    def cancelled(self) -> bool:
        """True once this job is no longer the handler's to work on — its lease not extended in
        time, lost to another worker, the job cancelled, or the type's timeout passed: stop and
        do not write. Read from the monotonic clock when asked, so a process paused past its
        lease sees it the moment it resumes."""
        return self._lease.over

    def check(self) -> None:
        """Raise ``LeaseLost`` if ``cancelled``: call it before each step that has an effect."""
        if self._lease.over:
            raise LeaseLost(f"job {self.job_id}: {self._lease.why()}")

    async def checkpoint(self) -> None:
        """``check()``, after letting the event loop run (the heartbeat loop among the rest)."""
        await asyncio.sleep(0)
        self.check()

    @property
    def lateness_ms(self) -> int:
        return self.started_at_ms - self.run_at


Handler = Callable[[JobContext], Any]
EventHook = Callable[[str, JobContext, str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class HandlerSpec:
    job_type: str
    fn: Handler
    timeout_s: float
    concurrency: int
    is_async: bool
