"""Start on the worker's clock, over the worker stream (issue 36 step 3): a node that claims
ahead pushes a held job before it is due, with ``starts_in``, only to a stream whose hello
accepts it; a cancel through the owner of a job so pushed is answered only once the worker
confirmed the revoke, or said it had started, or once it could no longer start it; a worker
cut off inside the window loses nothing (the job is released unstarted at its lease's end). Real
gRPC, in-process nodes on the embedded store, the system clock."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.unit.test_worker_handler_ends import wait_job, working
from tests.unit.test_worker_stream import Stream, record_notices_and_results, serving
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.limits import START_GRACE_MS
from timeshard.model import Job, JobState
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, dur_s, ts_ms
from timeshard.worker import JobContext, Worker, stream

WINDOW_MS = 1000
AHEAD_MS = 2500
"""Jobs are due this far ahead: claimed half a window before, pushed at once."""


def ahead_server(lease_s: float = 30.0) -> Server:
    node = Node(
        store=SqliteStore(":memory:", num_shards=2),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=NodeConfig(
            min_lease_s=0.5,
            default_lease_s=lease_s,
            dispatch=DispatchConfig(claim_ahead_ms=WINDOW_MS),
        ),
    )
    return Server(node, port=0)


async def hello(s: Stream, *, accepts: bool, credits: int = 10) -> None:
    h = pb.WorkHello(worker_id="w1", lease=dur(10_000), accepts_starts_in=accepts)
    await s.send(hello=h, credits=[pb.WorkCredit(type="t", credits=credits)])
    welcome = await s.call.read()
    assert welcome.seq == 1 and not welcome.jobs


async def due_later(srv: Server) -> Job:
    run_at = srv.node.clock.now_ms() + AHEAD_MS
    job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=run_at))
    return job


def now_ms() -> float:
    return time.time() * 1000


async def test_a_stream_that_accepts_starts_in_gets_a_held_job_before_it_is_due() -> None:
    async with serving(ahead_server()) as (srv, channel):
        s = Stream(channel)
        await hello(s, accepts=True)
        job = await due_later(srv)
        (c,) = await s.until_jobs(1)
        arrived = now_ms()
        assert c.job.job_id == job.job_id and c.HasField("starts_in")
        starts_in = dur_s(c.starts_in) * 1000
        assert starts_in > 0, "pushed at its due time, not ahead"
        assert arrived + starts_in >= job.run_at, "its start on the worker's clock is early"
        assert ts_ms(c.job.started_at) == job.run_at  # the attempt is claimed at due time
        row = await srv.node.jobs.get(job.job_id)
        assert row.state is JobState.RUNNING and row.lease_until > job.run_at


async def test_starts_in_is_to_the_microsecond_and_never_short() -> None:
    """Counted from the node's clock in whole milliseconds, a wait would be half a millisecond
    too long on average: every push's start would be that much late."""
    async with serving(ahead_server()) as (srv, channel):
        s = Stream(channel)
        await hello(s, accepts=True)
        jobs = {(await due_later(srv)).job_id: None for _ in range(4)}
        pushed = await s.until_jobs(4)
        arrived = now_ms()
        assert {c.job.job_id for c in pushed} == jobs.keys()
        for c in pushed:
            assert arrived + dur_s(c.starts_in) * 1000 >= ts_ms(c.job.run_at), "early"
        assert any(c.starts_in.nanos % 1_000_000 for c in pushed), "cut to whole milliseconds"


async def test_a_stream_that_does_not_accept_it_gets_the_job_at_its_due_time() -> None:
    async with serving(ahead_server()) as (srv, channel):
        s = Stream(channel)
        await hello(s, accepts=False)
        job = await due_later(srv)
        (c,) = await s.until_jobs(1)
        assert now_ms() >= job.run_at and not c.HasField("starts_in")
        assert (await srv.node.jobs.get(job.job_id)).lease_owner == srv.node.ahead.holder


async def revoke_of(s: Stream) -> pb.WorkRevoke:
    while True:
        message = await s.read()
        if message.revokes:
            (r,) = message.revokes
            return r


async def test_a_cancel_of_a_pushed_job_waits_for_the_workers_revoke() -> None:
    async with serving(ahead_server()) as (srv, channel):
        s = Stream(channel)
        await hello(s, accepts=True)
        job = await due_later(srv)
        (c,) = await s.until_jobs(1)
        cancel = asyncio.create_task(srv.node.jobs.cancel(job.job_id, wait_s=30))
        r = await revoke_of(s)
        assert (r.job_id, r.fence) == (job.job_id, c.fence)
        await asyncio.sleep(0)
        assert not cancel.done(), "the cancel was answered before the worker's revoke"
        await s.send(revoked=[pb.WorkRevoke(job_id=r.job_id, fence=r.fence, started=False)])
        out = await asyncio.wait_for(cancel, 5)
        assert out.state is JobState.CANCELLED and not out.start_noticed
        assert now_ms() < job.run_at + START_GRACE_MS, "it waited out the bound, not the answer"


async def test_a_cancel_of_a_job_the_worker_started_says_it_started() -> None:
    async with serving(ahead_server()) as (srv, channel):
        s = Stream(channel)
        await hello(s, accepts=True)
        job = await due_later(srv)
        await s.until_jobs(1)
        cancel = asyncio.create_task(srv.node.jobs.cancel(job.job_id, wait_s=30))
        r = await revoke_of(s)
        await s.send(revoked=[pb.WorkRevoke(job_id=r.job_id, fence=r.fence, started=True)])
        out = await asyncio.wait_for(cancel, 5)
        assert out.state is JobState.CANCELLED and out.start_noticed


async def test_a_worker_that_does_not_answer_holds_the_cancel_until_it_can_not_start() -> None:
    async with serving(ahead_server()) as (srv, channel):
        s = Stream(channel)
        await hello(s, accepts=True)
        job = await due_later(srv)
        await s.until_jobs(1)
        asked = now_ms()
        out = await asyncio.wait_for(srv.node.jobs.cancel(job.job_id, wait_s=30), 15)
        answered = now_ms()
        assert out.state is JobState.CANCELLED and not out.start_noticed
        # Not before its latest start on the worker (its push's time + starts_in + the grace),
        # and no longer than the window, the grace and a margin after the cancel came.
        assert answered >= job.run_at + START_GRACE_MS
        assert answered - asked <= WINDOW_MS + START_GRACE_MS + 1000


async def test_a_worker_cut_off_inside_the_window_loses_nothing() -> None:
    """Its stream breaks after the push and before the job is due: the job is released at
    its lease's end, not started, its attempt not spent (invariant 9), and runs again."""
    srv = ahead_server(lease_s=2.0)
    async with serving(srv) as (srv, channel):
        s = Stream(channel)
        await hello(s, accepts=True)
        job = await due_later(srv)
        await s.until_jobs(1)
        s.call.cancel()  # the worker died with the job in its hands
        back = await wait_job(srv, job, lambda j: j.unstarted == 1, 30, "released unstarted")
        assert back.state is JobState.SCHEDULED and back.attempt == 0
        again = Stream(channel)
        await hello(again, accepts=True)
        (c,) = await again.until_jobs(1)
        assert c.job.job_id == job.job_id and c.job.attempt == 1


class SkewedClock(SystemClock):
    """A worker whose wall clock is 5 s off (its monotonic clock is the system's)."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.offset_ms


@pytest.mark.parametrize("offset_ms", [5000, -5000], ids=["ahead", "behind"])
async def test_a_worker_whose_wall_clock_is_5s_off_starts_nothing_early(offset_ms: int) -> None:
    srv = ahead_server()
    w = Worker(worker_id="w1", lease_s=30.0, claim_wait_s=1.0, clock=SkewedClock(offset_ms))
    starts: dict[str, float] = {}

    @w.handler("t", timeout=60)
    async def handler(ctx: JobContext) -> None:
        starts[ctx.job_id] = now_ms()

    await srv.start()
    async with working(w, [srv], started=True):
        await wait_until(lambda: srv.node.ready.has_waiter("t"), 10, "the worker's claim")
        jobs = [await due_later(srv) for _ in range(3)]
        for job in jobs:
            await wait_job(srv, job, lambda j: j.state is JobState.SUCCEEDED)
    for job in jobs:
        assert starts[job.job_id] >= job.run_at, starts[job.job_id] - job.run_at


async def test_a_cancel_during_the_window_stops_the_sdk_worker_from_starting_it() -> None:
    srv = ahead_server()
    w = Worker(worker_id="w1", lease_s=30.0, claim_wait_s=1.0)
    ran: list[str] = []
    events: list[Any] = []

    @w.handler("t", timeout=60)
    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    await srv.start()
    async with working(w, [srv], started=True) as run:
        await wait_until(lambda: srv.node.ready.has_waiter("t"), 10, "the worker's claim")
        job = await due_later(srv)
        await wait_until(lambda: job.job_id in w._attempts.inflight, 10, "the push ahead")
        out = await srv.node.jobs.cancel(job.job_id, wait_s=30)
        assert out.state is JobState.CANCELLED and not out.start_noticed
        await wait_until(lambda: now_ms() > job.run_at + 500, 10, "past its due time")
        events = run.events
    assert ran == [], "a job cancelled (and acknowledged) before its start ran"
    assert any(kind == "lost" and "revoked" in detail for kind, detail, _ in events), events


@pytest.mark.parametrize("ride_s", [stream.RESULT_RIDE_S, 0.0], ids=["rides", "no-ride"])
async def test_a_result_rides_with_the_next_start_notice(
    ride_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs pushed ahead, due 20 ms apart: the first's result waits for the second's start
    notice and goes in the same request (one request per job at a trickle, not two); with no
    ride allowed it goes alone, before."""
    monkeypatch.setattr(stream, "RESULT_RIDE_S", ride_s)
    seen = record_notices_and_results(monkeypatch)
    srv = ahead_server()
    w = Worker(worker_id="w1", lease_s=30.0, claim_wait_s=1.0)

    @w.handler("t", timeout=60, concurrency=4)  # (credits for both: pushed together)
    async def handler(ctx: JobContext) -> None:
        pass

    await srv.start()
    async with working(w, [srv], started=True):
        await wait_until(lambda: srv.node.ready.has_waiter("t"), 10, "the worker's claim")
        run_at = srv.node.clock.now_ms() + AHEAD_MS
        first, second = [
            (await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=at)))[0]
            for at in (run_at, run_at + 20)
        ]
        for job in (first, second):
            await wait_job(srv, job, lambda j: j.state is JobState.SUCCEEDED)
    together = ([second.job_id], [first.job_id])
    if ride_s:
        assert together in seen, seen
        assert sum(1 for _, results in seen if results) == 2, seen
    else:
        assert together not in seen, seen
