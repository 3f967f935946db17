"""Seen in chaos runs (tools/chaos.py, a node stopped with SIGSTOP past its ZooKeeper session):
jobs claimed from the frozen node ran again. The worker's heartbeat to a node that neither
answers nor refuses (frozen, or cut off) waits for the whole rest of the lease
(``timeout=lease.deadline - sent``), so it never tries another node before the lease is over,
although any node accepts a heartbeat (docs/architecture.md: a dead node does not make its in-flight
jobs run again). E.g. job 22ad4c45...: node a stopped at 00:45:17.761; its handler had finished at
00:45:20.321, the heartbeat hung, "the lease deadline passed (not extended in time)" at
00:45:20.892, and the job ran a second time at 00:45:21.7 (its effect deduplicated by its key).

Fixed: a heartbeat with no answer after half the time left is asked of the next node as well,
and the first answer wins (``heartbeats.Heartbeats._heartbeat``). A first fix gave up on the node
after a share of the time left instead; a 30-minute soak then re-ran 1,538 jobs (88 before):
a slow store made slow answers, not frozen nodes, and they were abandoned.
"""

from __future__ import annotations

import asyncio

import grpc

from tests.unit.test_worker_lease import (
    LEASE_S,
    FakeRpcError,
    FakeStub,
    claimed,
    make_worker,
    run_job,
)
from timeshard.clock import FakeClock
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur
from timeshard.worker.lease import Lease
from timeshard.worker.results import CALL_TIMEOUT_S, Results


class FrozenStub(FakeStub):
    """A node stopped with SIGSTOP: a call gets no answer until its deadline."""

    async def Heartbeat(self, req: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        self.calls.append(("heartbeat", self.clock.monotonic()))
        await self.clock.sleep(timeout)
        raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer")


async def test_a_frozen_node_does_not_cost_its_jobs_their_lease() -> None:
    clock = FakeClock()
    w, seen = make_worker(clock)
    frozen, other = FrozenStub(clock), FakeStub(clock, heartbeat="ok")
    w._attempts.results = Results(clock, lambda: [frozen, other])
    task = await run_job(w, frozen, clock, claimed(), seconds=LEASE_S * 3)
    try:
        assert any(kind == "heartbeat" for kind, _ in other.calls), "no other node was tried"
        assert "cancelled_at" not in seen, "the lease was lost while another node could extend it"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class SlowStub(FakeStub):
    """A live node on a slow store: it answers a heartbeat after ``DELAY_S`` (a third of the
    lease: more than half the time a heartbeat has left, less than all of it)."""

    DELAY_S = LEASE_S / 3

    async def Heartbeat(self, req: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        self.calls.append(("heartbeat", self.clock.monotonic()))
        await self.clock.sleep(min(timeout, self.DELAY_S))
        if timeout < self.DELAY_S:
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "gave up on it")
        return pb.HeartbeatResponse(lease=dur(round(LEASE_S * 1000)))


async def test_a_slow_answer_is_not_given_up_for_another_node() -> None:
    clock = FakeClock()
    w, seen = make_worker(clock)
    slow, down = SlowStub(clock), FakeStub(clock, heartbeat="unavailable")
    w._attempts.results = Results(clock, lambda: [slow, down])
    task = await run_job(w, slow, clock, claimed(), seconds=LEASE_S * 3)
    try:
        assert any(kind == "heartbeat" for kind, _ in down.calls), "no other node was asked"
        assert "cancelled_at" not in seen, "the slow node's heartbeat was abandoned"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class FrozenFinishStub(FakeStub):
    """A frozen node that took the job: no answer to a result until the call's deadline."""

    async def Finish(self, req: pb.FinishRequest, timeout: float) -> pb.FinishResponse:
        self.calls.append(("finish-timeout", timeout))
        await self.clock.sleep(timeout)
        raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer")


async def test_a_result_for_a_frozen_node_goes_to_another_after_its_timeout() -> None:
    """While the heartbeat loop holds the lease (here: a long one), a result the job's frozen node
    never answers goes to the next node once its call times out."""
    clock = FakeClock()
    frozen, other = FrozenFinishStub(clock), FakeStub(clock)
    results = Results(clock, lambda: [frozen, other])
    lease = Lease(clock, clock.monotonic() + 3 * CALL_TIMEOUT_S)
    item = pb.FinishItem(job_id="j1", fence=1)
    delivery = asyncio.ensure_future(results.deliver(item, frozen, lease))  # type: ignore[arg-type]
    for _ in range(round(2 * CALL_TIMEOUT_S / 0.1)):
        clock.advance(0.1)
        for _ in range(5):
            await asyncio.sleep(0)
        if delivery.done():
            break
    assert delivery.done(), "the result stayed with the frozen node"
    result, why = delivery.result()
    assert result is not None and result.code == 0, why
    assert ("complete", 1) in other.calls
    assert frozen.calls == [("finish-timeout", CALL_TIMEOUT_S)]
