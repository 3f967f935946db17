"""Keeping a running job's lease, for the worker SDK.

While its handler runs and until its result is in, a job's lease is extended every third of the
lease, on the job's node and, after a failure, on the next known node (``Results.targets``):
any node accepts a heartbeat. A heartbeat that has no answer after half the time left is asked
of the next node as well, and the first answer wins: a frozen node (SIGSTOP, cut off) neither
answers nor refuses, while a slow one (a slow store) may still answer in time, so it is not
given up. The handler is stopped once the lease is over — not extended before its deadline on
the worker's monotonic clock, or refused (stale fence, job gone) — so a paused or partitioned
worker stops before another may start the job (invariant 6).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from timeshard.clock import Clock, SystemClock
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import RemoteError, dur, dur_s, translate, ts
from timeshard.worker.lease import Lease
from timeshard.worker.results import Results

log = logging.getLogger("timeshard.worker")  # part of the worker SDK: its logger, as before

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub


class Heartbeats:
    """The heartbeat loop of one job's lease, made when the job starts, with the worker's lease
    settings then (``lease_s``, ``safety_margin_s``)."""

    __slots__ = (
        "_clock",
        "_fence",
        "_job_id",
        "_lease",
        "_lease_s",
        "_margin_s",
        "_results",
        "_started_at",
    )

    def __init__(
        self,
        *,
        clock: Clock,
        results: Results,
        job_id: str,
        fence: int,
        lease: Lease,
        lease_s: float,
        safety_margin_s: float,
        started_at_ms: Callable[[], int] = lambda: 0,
    ) -> None:
        self._clock = clock
        self._started_at = started_at_ms
        """When the handler started (0: not yet, it waits for its slot): every heartbeat after
        it carries the start notice (invariant 9), so a node that missed the first one writes
        it with the lease."""
        self._results = results
        self._job_id = job_id
        self._fence = fence
        self._lease = lease
        self._lease_s = lease_s
        self._margin_s = safety_margin_s

    def start(
        self, stub: WorkerStub, handler: asyncio.Task[Any], heartbeat_now: bool
    ) -> asyncio.Task[None] | DeferredHeartbeats:
        """The job's heartbeat loop. On the system clock it starts only when it first has
        something to do (the first heartbeat, or the deadline if that comes first): most jobs are
        done long before and never need its task and timer (a quarter of a busy worker's time)."""
        first_heartbeat = self._clock.monotonic() + (0.0 if heartbeat_now else self._lease_s / 3)

        def start() -> asyncio.Task[None]:
            keep = self.run(stub, handler, first_heartbeat=first_heartbeat)
            return asyncio.create_task(keep, name=f"lease-{self._job_id}")

        if heartbeat_now or type(self._clock) is not SystemClock:
            return start()
        wake = min(first_heartbeat, self._lease.deadline)
        return DeferredHeartbeats(start, max(0.0, wake - self._clock.monotonic()))

    async def run(
        self,
        stub: WorkerStub,
        handler: asyncio.Task[Any],
        *,
        first_heartbeat: float,
    ) -> None:
        """Send a heartbeat every third of the lease, from ``first_heartbeat`` on (on the job's
        node; after a failure, on the next known node) until cancelled — the result is in — and
        stop the handler once the lease is over: not extended before its deadline, or refused
        (stale fence, job gone)."""
        lease, every, failures = self._lease, self._lease_s / 3, 0
        next_heartbeat = first_heartbeat
        while lease.held():
            wake = min(next_heartbeat, lease.deadline)
            await self._clock.sleep(max(0.0, wake - self._clock.monotonic()))
            if not lease.held() or self._clock.monotonic() < next_heartbeat:
                continue  # (a pause past the deadline ends here: no heartbeat once it is over)
            targets = self._results.targets(stub)
            sent = self._clock.monotonic()
            try:
                resp = await self._heartbeat(targets, failures % len(targets))
            except grpc.RpcError as exc:
                err: RemoteError = translate(exc)
                if err.code in _REFUSED:
                    lease.lose(err.message)
                    break
                failures += 1  # every node asked failed: again soon, from the next one
                next_heartbeat = self._clock.monotonic() + min(1.0, every)
                continue
            lease.extend(sent + dur_s(resp.lease) - self._margin_s)
            failures, next_heartbeat = 0, sent + every
        lease.stop(lease.why())
        log.warning("job %s: %s; stopping its handler", self._job_id, lease.why())
        handler.cancel()

    async def _heartbeat(self, targets: list[WorkerStub], first: int) -> pb.HeartbeatResponse:
        """One heartbeat: asked of ``targets[first]``, and of the next node too whenever the
        ones asked have not answered within half the time left or have failed. The first
        answer wins (a heartbeat applied twice only extends the lease); raises a refusal at
        once, and the last error when every node asked failed."""
        request = pb.HeartbeatRequest(
            job_id=self._job_id, fence=self._fence, lease=dur(round(self._lease_s * 1000))
        )
        started_at = self._started_at()
        if started_at:
            request.started = True
            request.started_at.CopyFrom(ts(started_at))
        calls: set[asyncio.Future[Any]] = set()
        timer: asyncio.Future[Any] | None = None
        asked, last_error = 0, None
        try:
            while True:
                if timer is None and asked < len(targets):  # time to ask another node
                    left = max(0.1, self._lease.deadline - self._clock.monotonic())
                    stub = targets[(first + asked) % len(targets)]
                    calls.add(asyncio.ensure_future(stub.Heartbeat(request, timeout=left)))
                    asked += 1
                    if asked < len(targets):
                        timer = asyncio.ensure_future(self._clock.sleep(left / 2))
                if not calls:
                    assert last_error is not None
                    raise last_error
                done, _ = await asyncio.wait(
                    calls | ({timer} if timer else set()), return_when=asyncio.FIRST_COMPLETED
                )
                if timer is not None and timer in done:
                    timer = None
                for call in done & calls:
                    calls.discard(call)
                    exc = call.exception()
                    if exc is None:
                        return call.result()  # type: ignore[no-any-return]
                    if not isinstance(exc, grpc.RpcError) or translate(exc).code in _REFUSED:
                        raise exc
                    last_error = exc
                    if timer is not None:  # a node that failed: the next one at once
                        timer.cancel()
                        timer = None
        finally:
            for pending in (*calls, *([timer] if timer else [])):
                pending.cancel()


_REFUSED = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
"""A heartbeat the store refused: the lease is not this worker's any more."""


class DeferredHeartbeats:
    """A heartbeat loop not started yet: a timer on the loop that starts it when it is due."""

    __slots__ = ("_start", "_task", "_timer")

    def __init__(self, start: Callable[[], asyncio.Task[None]], delay: float) -> None:
        self._start = start
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(delay, self._begin)

    def _begin(self) -> None:
        self._task = self._start()

    def cancel(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
