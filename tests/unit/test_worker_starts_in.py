"""A job pushed with ``starts_in`` starts on the worker's own clock (``worker.startat``): never
before its receive time plus ``starts_in`` on the worker's monotonic clock, whatever its wall
clock says; given back unstarted when it can not start within the start's grace (a push that
sat in transit, a process stopped while it waited) or its lease; never started once the node
revoked it. A fake clock and a fake node link."""

from __future__ import annotations

import asyncio
from typing import Any

from timeshard.clock import FakeClock
from timeshard.limits import START_GRACE_MS
from timeshard.model import NOT_STARTED
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, ts
from timeshard.worker import JobContext, Worker
from timeshard.worker.stream import Host, NodeLink

LEASE_S = 30.0
WALL_OFFSET_MS = 5000


class SkewedClock(FakeClock):
    """A worker whose wall clock is 5 s off: its monotonic clock runs as the fake one."""

    def now_ms(self) -> int:
        return super().now_ms() + WALL_OFFSET_MS


class Link:
    """A node link that records start notices and results, and grants heartbeats."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, int]] = []
        self.finished: list[pb.FinishItem] = []

    def notice_start(self, job_id: str, fence: int, started_at_ms: int) -> asyncio.Future[None]:
        self.notices.append((job_id, fence))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def Finish(self, request: pb.FinishRequest, timeout: float) -> pb.FinishResponse:
        self.finished.extend(request.items)
        return pb.FinishResponse(results=[pb.FinishResult() for _ in request.items])

    async def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> Any:
        return pb.HeartbeatResponse(lease=dur(round(LEASE_S * 1000)))


def make_worker(clock: FakeClock) -> tuple[Worker, list[float]]:
    worker = Worker(worker_id="w1", lease_s=LEASE_S, clock=clock)
    started: list[float] = []

    @worker.handler("t", timeout=60)
    async def handler(ctx: JobContext) -> None:
        started.append(clock.monotonic())

    return worker, started


def pushed(clock: FakeClock, starts_in_ms: int, job_id: str = "j1", fence: int = 4) -> Any:
    job = pb.Job(
        job_id=job_id,
        type="t",
        attempt=1,
        max_attempts=3,
        run_at=ts(clock.now_ms() + starts_in_ms),
        started_at=ts(clock.now_ms() + starts_in_ms),
    )
    return pb.ClaimedJob(
        job=job,
        fence=fence,
        lease=dur(round(LEASE_S * 1000) + starts_in_ms),
        idempotency_key=job_id,
        starts_in=dur(starts_in_ms),
    )


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def drain(worker: Worker) -> None:
    async with asyncio.timeout(10):
        while worker._attempts.tasks:
            await asyncio.gather(*worker._attempts.tasks)


async def test_a_job_starts_no_earlier_than_its_receive_time_plus_starts_in() -> None:
    clock = SkewedClock()  # its wall clock 5 s ahead changes nothing: the monotonic one rules
    worker, started = make_worker(clock)
    link = Link()
    base = clock.monotonic()
    clock.advance(0.05)  # the push's transit: its start counts from its arrival
    received = clock.monotonic()
    worker._attempts.start(link, pushed(clock, 300), base)  # type: ignore[arg-type]
    clock.advance(0.299)
    await turns()
    assert started == [] and link.notices == [], "started before receive time + starts_in"
    clock.advance(0.002)
    await drain(worker)
    assert started and started[0] >= received + 0.3
    assert link.notices == [("j1", 4)]
    assert [i.failed for i in link.finished] == [False]  # it ran, and completed


async def test_a_wall_clock_behind_does_not_start_it_late_or_early() -> None:
    class Behind(FakeClock):
        def now_ms(self) -> int:
            return super().now_ms() - WALL_OFFSET_MS

    clock = Behind()
    worker, started = make_worker(clock)
    link = Link()
    base = clock.monotonic()
    worker._attempts.start(link, pushed(clock, 200), base)  # type: ignore[arg-type]
    clock.advance(0.199)
    await turns()
    assert started == []
    clock.advance(0.002)
    await drain(worker)
    assert started and started[0] >= base + 0.2


async def test_a_push_that_arrives_past_the_starts_grace_is_given_back_unstarted() -> None:
    clock = FakeClock()
    worker, started = make_worker(clock)
    link = Link()
    base = clock.monotonic()
    clock.advance(START_GRACE_MS / 1000 + 0.1)  # it sat in transit (the worker was stopped)
    worker._attempts.start(link, pushed(clock, 300), base)  # type: ignore[arg-type]
    await drain(worker)
    assert started == [] and link.notices == []
    (item,) = link.finished
    assert item.give_back and item.not_started and item.error.startswith(f"{NOT_STARTED}:")


async def test_a_worker_stopped_while_it_waits_to_start_gives_the_job_back_unstarted() -> None:
    clock = FakeClock()
    worker, started = make_worker(clock)
    link = Link()
    worker._attempts.start(link, pushed(clock, 300), clock.monotonic())  # type: ignore[arg-type]
    await turns()
    clock.advance(10.0)  # SIGSTOP inside the window, resumed 10 s later
    await drain(worker)
    assert started == [] and link.notices == []
    (item,) = link.finished
    assert item.give_back and item.not_started and (item.job_id, item.fence) == ("j1", 4)


async def test_a_revoked_job_never_starts_and_a_started_one_says_so() -> None:
    clock = FakeClock()
    worker, started = make_worker(clock)
    link = Link()
    attempts = worker._attempts
    attempts.start(link, pushed(clock, 300, "j1"), clock.monotonic())  # type: ignore[arg-type]
    attempts.start(link, pushed(clock, 0, "j2"), clock.monotonic())  # type: ignore[arg-type]
    await turns()
    assert attempts.revoke("j1", 3) is False  # another fence: not this push
    assert attempts.revoke("j1", 4) is False  # not started, and now never will be
    clock.advance(1.0)
    await drain(worker)
    assert len(started) == 1 and link.notices == [("j2", 4)]
    assert [i.job_id for i in link.finished] == ["j2"]  # nothing sent for the revoked one
    assert attempts.revoke("unknown", 1) is False


async def test_a_revoke_after_the_start_answers_started() -> None:
    clock = FakeClock()
    worker = Worker(worker_id="w1", lease_s=LEASE_S, clock=clock)
    release = asyncio.Event()

    @worker.handler("t", timeout=60)
    async def handler(ctx: JobContext) -> None:
        await release.wait()

    link = Link()
    worker._attempts.start(link, pushed(clock, 100), clock.monotonic())  # type: ignore[arg-type]
    clock.advance(0.2)
    await turns()
    assert link.notices == [("j1", 4)]
    assert worker._attempts.revoke("j1", 4) is True
    release.set()
    await drain(worker)


class Ticking(FakeClock):
    """Each read of the monotonic clock moves it on 1 ms: the time spent on each job."""

    def monotonic(self) -> float:
        self.advance(0.001)
        return super().monotonic()


async def test_the_jobs_of_one_push_count_from_its_receive_time_not_their_turn() -> None:
    """A push of many jobs: each starts at the push's receive time plus its ``starts_in``,
    not later by the time the worker spent on the jobs before it in the message."""
    clock = Ticking()
    worker, _ = make_worker(clock)
    stop = asyncio.Event()
    stop.set()  # (no claim loops: the push is handed to the link directly)

    async def no_claims(*_: Any) -> None:
        return None

    host = Host(
        worker_id="w1",
        lease_s=LEASE_S,
        safety_margin_s=worker.safety_margin_s,
        clock=clock,
        slots=worker._slots,
        concurrency=lambda t: 10,
        start=worker._attempts.start,
        claim_loop=no_claims,
    )
    link = NodeLink(host, Link(), "node", ["t"], stop, use_stream=False)  # type: ignore[arg-type]
    link._sent.append((1, clock.monotonic()))
    jobs = [pushed(clock, 300, f"j{i}") for i in range(5)]
    before = clock.monotonic()
    link._take(pb.WorkResponse(after_seq=1, jobs=jobs))
    starts = [f.at.not_before for f in worker._attempts.inflight.values() if f.at is not None]
    assert len(starts) == 5
    assert len(set(starts)) == 1, f"later jobs of the push start later: {starts}"
    assert starts[0] >= before + 0.3  # (and never before the receive time + starts_in)
    for i in range(5):
        worker._attempts.revoke(f"j{i}", 4)
    await drain(worker)
