"""Start notices (invariant 9): an attempt counts when its handler started, and the worker says
when. The owner keeps each notice in memory until the job's lease ends, so an expired lease is a
failed attempt only after a start; a heartbeat with the notice also writes it into the row, for
a later owner. No gRPC types here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from timeshard.clock import Clock, sleep_or_wake
from timeshard.model import NOT_STARTED, Job, JobState

REVOKE_MARGIN_S = 0.5
"""Past the latest start of a job pushed with ``starts_in``, how long a cancel still waits for
its worker's answer (the answer's own way back)."""
IN_FLIGHT_S = 2.0
"""How long a cancel waits (real time) for the start notice of a job whose push may be on its
way: a push in flight reaches a running worker, and its notice comes back, well within it."""
MAX_TRACKED = 1_000_000
"""Deliveries followed at once; past it the oldest are forgotten (a notice then missing makes an
expired lease uncounted: late, bounded by ``max_unstarted``, never early or twice)."""


@dataclass(slots=True)
class _Delivery:
    fence: int
    job_type: str
    run_at: int
    started_at: int = 0
    """When its handler started, by the worker's notice (0: no notice yet)."""
    start_by: int = 0
    """Pushed with ``starts_in``: the latest its worker may start it (this node's clock, epoch
    ms; 0: not pushed so)."""
    revoke: Callable[[str, int], None] | None = None
    """Asks the worker it was pushed to not to start it (its stream's)."""
    revoked: bool = False
    """The worker answered a revoke: not started, and never will be."""
    worker: str = ""
    """The worker a job claimed ahead was handed to (its row names the node that held it,
    until a write of that worker's names it: ``worker``)."""


class StartNotices:
    """The jobs this node delivered (claimed for a worker) and the start notices it received.
    ``observe(job_type, seconds)`` is told each first start's schedule-to-start."""

    def __init__(self, clock: Clock, observe: Callable[[str, float], None]) -> None:
        self._clock = clock
        self._observe = observe
        self._deliveries: dict[str, _Delivery] = {}
        self._waiters: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._first_due: dict[str, int] = {}
        """Jobs delivered here and given back unstarted: their due time before that (a job due
        again moves its ``run_at`` to then), so schedule-to-start counts the whole wait."""

    def __len__(self) -> int:
        return len(self._deliveries)

    def delivered(self, job: Job, worker: str = "") -> None:
        """A claim of this node applied: ``job`` is running under a new fence, not started;
        ``worker``: a job claimed ahead, handed to that worker."""
        if len(self._deliveries) >= MAX_TRACKED:
            del self._deliveries[next(iter(self._deliveries))]
        due = self._first_due.pop(job.job_id, job.run_at)
        self._deliveries[job.job_id] = _Delivery(
            job.fence, job.job_type, min(due, job.run_at), worker=worker
        )

    def worker(self, job_id: str, fence: int) -> str:
        """The worker this node handed the lease ``(job_id, fence)`` to from its hold ("" for
        any other: its claim named its worker in the row already)."""
        d = self._deliveries.get(job_id)
        return d.worker if d is not None and d.fence == fence else ""

    def pushed(
        self, job_id: str, fence: int, start_by: int, revoke: Callable[[str, int], None]
    ) -> None:
        """The lease ``(job_id, fence)`` was pushed to a worker that starts it on its own clock,
        no later than ``start_by`` (this node's clock), and can be asked not to (``revoke``)."""
        d = self._deliveries.get(job_id)
        if d is not None and d.fence == fence:
            d.start_by, d.revoke = start_by, revoke
            waiter = self._waiters.pop((job_id, fence), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)  # a cancel waiting for its notice revokes it now

    def answered(self, job_id: str, fence: int, started: bool) -> None:
        """The worker answered a revoke of ``(job_id, fence)``: ``started`` or never will be."""
        d = self._deliveries.get(job_id)
        if d is None or d.fence != fence:
            return
        if started:
            self.notice(job_id, fence, d.started_at or self._clock.now_ms())
            return
        d.revoked = True
        waiter = self._waiters.pop((job_id, fence), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def notice(self, job_id: str, fence: int, started_at: int) -> bool:
        """A worker started ``job_id``'s handler under ``fence``: True if this node delivered
        that very lease (the notice is kept here), False if it does not know it (another node
        delivered it, or the lease is over): the caller writes the notice into the row."""
        d = self._deliveries.get(job_id)
        if d is None or d.fence != fence:
            return False
        if not d.started_at:
            d.started_at = started_at
            self._observe(d.job_type, max(0, started_at - d.run_at) / 1000)
            waiter = self._waiters.pop((job_id, fence), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        return True

    async def started_by(self, job_id: str, fence: int, timeout_s: float) -> bool | None:
        """Whether the handler of the lease ``(job_id, fence)``, delivered by this node, starts
        within ``timeout_s`` (at once if its notice came already); None if this node did not
        deliver it (it can not know). A lease pushed with ``starts_in``, before or while the
        notice is waited for (a claim writes its push after it handed the job out), is
        revoked (``_revoked``)."""
        d = self._deliveries.get(job_id)
        if d is None or d.fence != fence:
            return None
        if d.started_at:
            return True
        if d.revoke is None:
            waiter = self._waiter(job_id, fence)
            try:
                async with asyncio.timeout(max(0.0, min(timeout_s, IN_FLIGHT_S))):
                    await sleep_or_wake(self._clock, max(0.0, timeout_s), waiter)
            except TimeoutError:
                pass
            finally:
                self._waiters.pop((job_id, fence), None)
        if d.revoke is not None and not d.revoked and not d.started_at:
            return await self._revoked(d, job_id, fence)
        return self.started(job_id, fence)

    def _waiter(self, job_id: str, fence: int) -> asyncio.Future[None]:
        """Set by the lease's start notice, the worker's answer to a revoke, or its push."""
        return self._waiters.setdefault((job_id, fence), asyncio.get_running_loop().create_future())

    async def _revoked(self, d: _Delivery, job_id: str, fence: int) -> bool:
        """A lease pushed with ``starts_in``: its worker is asked not to start it, and the
        answer is its notice or its revoke, or, with neither, the time past which it can not
        start it (``start_by``), however short ``timeout_s``: a caller that can not wait that
        long gets no answer rather than a wrong one."""
        assert d.revoke is not None
        waiter = self._waiter(job_id, fence)
        d.revoke(job_id, fence)
        left = (d.start_by - self._clock.now_ms()) / 1000 + REVOKE_MARGIN_S
        try:  # (not cut short by the caller's time: no answer is one that could be wrong)
            await sleep_or_wake(self._clock, max(0.0, left), waiter)
        finally:
            self._waiters.pop((job_id, fence), None)
        return self.started(job_id, fence)

    def over(self, job_id: str, fence: int) -> None:
        """The lease ``(job_id, fence)`` ended by another node's write (its cancel): the
        delivery is forgotten."""
        d = self._deliveries.get(job_id)
        if d is not None and d.fence == fence:
            del self._deliveries[job_id]

    def observe_written(self, job: Job, started_at: int) -> None:
        """A notice written into the row by this node for a job it did not deliver: its
        schedule-to-start is observed from the row, once."""
        d = self._deliveries.get(job.job_id)
        if d is not None and d.fence == job.fence:
            self.notice(job.job_id, job.fence, started_at)
        elif job.state is JobState.RUNNING:
            self._deliveries[job.job_id] = _Delivery(
                job.fence, job.job_type, job.run_at, started_at
            )
            self._observe(job.job_type, max(0, started_at - job.run_at) / 1000)

    def started(self, job_id: str, fence: int) -> bool:
        """Whether a start notice for this lease reached this node."""
        d = self._deliveries.get(job_id)
        return d is not None and d.fence == fence and d.started_at > 0

    def ended(self, job: Job) -> None:
        """``job`` as a write left it: once it is no longer running under the fence followed,
        the delivery is forgotten."""
        d = self._deliveries.get(job.job_id)
        if d is not None and (job.state is not JobState.RUNNING or job.fence != d.fence):
            del self._deliveries[job.job_id]
            unstarted = job.history and job.history[-1].outcome == NOT_STARTED
            if unstarted and job.state is JobState.SCHEDULED and len(self._first_due) < MAX_TRACKED:
                self._first_due[job.job_id] = d.run_at
