"""A start notice names a handler that starts (invariant 9): when the worker's start notice went
out but the handler was stopped before its first step — its lease ran out while the notice left,
or the heartbeat loop stopped it then — the job is given back unstarted, so its lease's end does
not count an attempt no handler ran (``tools/loadtest.py overload``'s ``attempts_equal_starts``).
A fake clock and a fake node link: the stall is a clock jump inside the notice."""

from __future__ import annotations

import asyncio
from typing import Any

from timeshard.clock import FakeClock
from timeshard.model import NOT_STARTED
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.worker import JobContext, Worker

LEASE_S = 2.0


class StallingLink:
    """A node link whose start notice stalls the process past the lease (the clock jumps)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.notices: list[tuple[str, int]] = []
        self.finished: list[pb.FinishItem] = []
        self.heartbeats = 0

    def notice_start(self, job_id: str, fence: int, started_at_ms: int) -> None:
        self.notices.append((job_id, fence))
        self.clock.advance(10 * LEASE_S)

    async def Finish(self, request: pb.FinishRequest, timeout: float) -> pb.FinishResponse:
        self.finished.extend(request.items)
        return pb.FinishResponse(results=[pb.FinishResult() for _ in request.items])

    async def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> Any:
        self.heartbeats += 1
        raise AssertionError("no heartbeat is due")


async def test_a_handler_stopped_before_its_first_step_after_its_notice_is_given_back() -> None:
    clock = FakeClock()
    worker = Worker(worker_id="w1", lease_s=LEASE_S, clock=clock)
    ran: list[str] = []

    @worker.handler("t", timeout=60)
    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    link = StallingLink(clock)
    ctx = JobContext(
        job_id="j1",
        job_type="t",
        payload=b"",
        attempt=1,
        max_attempts=3,
        fence=7,
        idempotency_key="",
        run_at=clock.now_ms(),
        started_at_ms=clock.now_ms(),
        worker_id="w1",
    )
    attempts = worker._attempts
    deadline = clock.monotonic() + LEASE_S - worker.safety_margin_s
    async with asyncio.timeout(10):
        await attempts.execute(link, ctx, deadline)  # type: ignore[arg-type]
        while attempts.tasks:  # the give-back is sent in the background
            await asyncio.gather(*attempts.tasks)

    assert link.notices == [("j1", 7)]  # its notice went out ...
    assert ran == []  # ... and its handler never took a step ...
    # ... so it is given back unstarted, fenced: its lease's end would count an attempt
    assert len(link.finished) == 1, link.finished
    item = link.finished[0]
    assert (item.job_id, item.fence) == ("j1", 7)
    assert item.give_back and item.not_started and item.failed
    assert item.error.startswith(f"{NOT_STARTED}:"), item.error


async def test_a_lease_over_while_waiting_for_a_slot_sends_no_start_notice() -> None:
    """A job whose lease ran out before its handler could start sends no notice at all: its
    lease's end leaves it uncounted (the node heard of no start)."""
    clock = FakeClock()
    worker = Worker(worker_id="w1", lease_s=LEASE_S, clock=clock)
    ran: list[str] = []

    @worker.handler("t", timeout=60)
    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    link = StallingLink(clock)
    ctx = JobContext(
        job_id="j2",
        job_type="t",
        payload=b"",
        attempt=1,
        max_attempts=3,
        fence=3,
        idempotency_key="",
        run_at=clock.now_ms(),
        started_at_ms=clock.now_ms(),
        worker_id="w1",
    )
    # its deadline already passed as it gets its slot (the process stalled meanwhile)
    deadline = clock.monotonic() - 0.001
    attempts = worker._attempts
    async with asyncio.timeout(10):
        await attempts.execute(link, ctx, deadline)  # type: ignore[arg-type]
        while attempts.tasks:  # the give-back is sent in the background
            await asyncio.gather(*attempts.tasks)
    assert link.notices == []
    assert ran == []
    assert link.finished == []
