"""Invariant 6: the worker SDK cancels a handler whose lease it could not extend before
``lease - safety_margin`` on its own monotonic clock. A fake WorkerService stub stands in for
the server (the real one is exercised by the acceptance tests)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc
import pytest

from timeshard.clock import FakeClock
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, ts
from timeshard.worker import JobContext, PermanentError, Worker
from timeshard.worker.lease import LeaseLost

LEASE_S = 3.0
MARGIN_S = 0.5


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeStub:
    """Answers heartbeats as told; records completions and failures."""

    def __init__(self, clock: FakeClock, heartbeat: str = "ok") -> None:
        self.clock = clock
        self.heartbeat = heartbeat
        self.calls: list[tuple[str, Any]] = []
        self.notices: list[tuple[str, int]] = []
        """Start notices (a stream sends them in its next request, no answer)."""

    def notice_start(self, job_id: str, fence: int, started_at_ms: int) -> None:
        self.notices.append((job_id, fence))

    async def Heartbeat(self, req: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        self.calls.append(("heartbeat", self.clock.monotonic()))
        if self.heartbeat == "unavailable":
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "partitioned")
        if self.heartbeat == "stale":
            raise FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "fence 1 is stale")
        return pb.HeartbeatResponse(lease=dur(round(LEASE_S * 1000)))

    async def Complete(self, req: pb.CompleteRequest, timeout: float) -> pb.CompleteResponse:
        self.calls.append(("complete", req.fence))
        return pb.CompleteResponse()

    async def Fail(self, req: pb.FailRequest, timeout: float) -> pb.FailResponse:
        self.calls.append(("fail", (req.error, req.permanent)))
        return pb.FailResponse()

    async def Finish(self, req: pb.FinishRequest, timeout: float) -> pb.FinishResponse:
        for item in req.items:
            if item.failed:
                self.calls.append(("fail", (item.error, item.permanent)))
            else:
                self.calls.append(("complete", item.fence))
        return pb.FinishResponse(results=[pb.FinishResult(job_id=i.job_id) for i in req.items])


def claimed(job_type: str = "t") -> pb.ClaimedJob:
    job = pb.Job(job_id="j1", type=job_type, attempt=1, max_attempts=3, fence=1)
    job.run_at.CopyFrom(ts(1000))
    job.started_at.CopyFrom(ts(1000))
    return pb.ClaimedJob(job=job, fence=1, lease=dur(round(LEASE_S * 1000)), idempotency_key="k")


def make_worker(clock: FakeClock) -> tuple[Worker, dict[str, Any]]:
    seen: dict[str, Any] = {}
    w = Worker(worker_id="w", lease_s=LEASE_S, safety_margin_s=MARGIN_S, clock=clock)

    @w.handler("t", timeout=100)
    async def forever(ctx: JobContext) -> None:
        seen["ctx"] = ctx
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen["cancelled_at"] = clock.monotonic()
            raise

    @w.handler("perm", timeout=100)
    async def bad(ctx: JobContext) -> None:
        raise PermanentError("invalid input")

    return w, seen


async def run_job(
    w: Worker, stub: FakeStub, clock: FakeClock, job: pb.ClaimedJob, seconds: float
) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(
        w._attempts.execute(stub, _ctx(w, job), clock.monotonic() + LEASE_S - MARGIN_S)  # type: ignore[arg-type]
    )
    steps = round(seconds / 0.1)
    for _ in range(steps):
        clock.advance(0.1)
        for _ in range(5):
            await asyncio.sleep(0)
        if task.done():
            break
    return task


def _ctx(w: Worker, c: pb.ClaimedJob) -> JobContext:
    return JobContext(
        job_id=c.job.job_id,
        job_type=c.job.type,
        payload=b"{}",
        attempt=1,
        max_attempts=3,
        fence=c.fence,
        idempotency_key=c.idempotency_key,
        run_at=1000,
        started_at_ms=1000,
        worker_id=w.worker_id,
    )


async def test_handler_is_cancelled_before_the_lease_ends_when_its_heartbeats_fail() -> None:
    clock = FakeClock()
    w, seen = make_worker(clock)
    stub = FakeStub(clock, heartbeat="unavailable")
    task = await run_job(w, stub, clock, claimed(), seconds=5)
    assert task.done()
    assert "cancelled_at" in seen, "the handler kept running without a lease"
    assert seen["cancelled_at"] <= LEASE_S - MARGIN_S + 1e-6  # before another may start it
    assert seen["ctx"].cancelled
    assert any(kind == "heartbeat" for kind, _ in stub.calls)
    assert not any(kind in ("complete", "fail") for kind, _ in stub.calls)


async def test_handler_is_cancelled_at_once_when_the_fence_is_stale() -> None:
    clock = FakeClock()
    w, seen = make_worker(clock)
    stub = FakeStub(clock, heartbeat="stale")
    task = await run_job(w, stub, clock, claimed(), seconds=2)
    assert task.done()
    first_heartbeat = next(t for kind, t in stub.calls if kind == "heartbeat")
    assert first_heartbeat <= seen["cancelled_at"] <= first_heartbeat + 0.25  # not at the deadline


async def test_a_lease_extended_by_heartbeats_keeps_the_handler_running() -> None:
    clock = FakeClock()
    w, seen = make_worker(clock)
    stub = FakeStub(clock, heartbeat="ok")
    task = await run_job(w, stub, clock, claimed(), seconds=10)
    assert not task.done() and "cancelled_at" not in seen
    assert sum(1 for kind, _ in stub.calls if kind == "heartbeat") >= 9
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_permanent_error_is_reported_as_permanent() -> None:
    clock = FakeClock()
    w, _ = make_worker(clock)
    stub = FakeStub(clock)
    task = await run_job(w, stub, clock, claimed("perm"), seconds=0.3)
    assert task.done()
    assert ("fail", ("PermanentError: invalid input", True)) in stub.calls


async def test_sync_handler_thread_is_interrupted_when_the_lease_is_lost() -> None:
    clock = FakeClock()
    w = Worker(worker_id="w", lease_s=LEASE_S, safety_margin_s=MARGIN_S, clock=clock)
    stopped = threading.Event()

    @w.handler("t", timeout=100)
    def busy(ctx: JobContext) -> None:
        try:
            while True:
                time.sleep(0.005)
        finally:
            stopped.set()

    from concurrent.futures import ThreadPoolExecutor

    w._attempts.threads = ThreadPoolExecutor(1)
    stub = FakeStub(clock, heartbeat="unavailable")
    await run_job(w, stub, clock, claimed(), seconds=4)
    await wait_until(stopped.is_set, what="the handler thread to stop")
    w._attempts.threads.shutdown()


def test_handler_signature_is_checked_when_registered() -> None:
    w = Worker()
    with pytest.raises(TypeError, match="one argument"):

        @w.handler("x")
        async def no_ctx() -> None: ...

    with pytest.raises(ValueError, match="already registered"):
        w.handler("y")(lambda ctx: None)
        w.handler("y")(lambda ctx: None)


async def test_a_job_that_waited_in_a_long_poll_sends_a_heartbeat_at_once() -> None:
    clock = FakeClock()
    w, seen = make_worker(clock)
    stub = FakeStub(clock, heartbeat="ok")
    clock.advance(10)
    waited = w._poll_wait_s()  # as long as a long poll may wait
    w._attempts.start(stub, claimed(), sent=clock.monotonic() - waited)  # type: ignore[arg-type]
    for _ in range(20):
        await asyncio.sleep(0)
    beats = [t for kind, t in stub.calls if kind == "heartbeat"]
    assert beats and beats[0] == clock.monotonic(), "the lease base must be re-established at once"
    for _ in range(30):  # extended, so still running past the provisional deadline
        clock.advance(0.1)
        for _ in range(5):
            await asyncio.sleep(0)
    assert "cancelled_at" not in seen
    for t in list(w._attempts.tasks):
        t.cancel()
    await asyncio.gather(*w._attempts.tasks, return_exceptions=True)


async def test_a_worker_paused_past_its_deadline_cancels_before_its_next_heartbeat() -> None:
    clock = FakeClock()
    w, seen = make_worker(clock)
    stub = FakeStub(clock, heartbeat="ok")
    task = await run_job(w, stub, clock, claimed(), seconds=0.5)
    clock.advance(10)  # SIGSTOP for 10 s, then SIGCONT
    for _ in range(20):
        await asyncio.sleep(0)
    assert task.done() and "cancelled_at" in seen
    assert [k for k, _ in stub.calls] == [], "it extended or reported after losing the lease"


async def test_handler_over_its_type_timeout_is_cancelled_and_retried() -> None:
    clock = FakeClock()
    w = Worker(worker_id="w", lease_s=LEASE_S, safety_margin_s=MARGIN_S, clock=clock)
    cancelled = asyncio.Event()

    @w.handler("t", timeout=1.0)
    async def slow(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()

    stub = FakeStub(clock, heartbeat="ok")
    task = asyncio.ensure_future(
        w._attempts.execute(stub, _ctx(w, claimed()), clock.monotonic() + LEASE_S - MARGIN_S)  # type: ignore[arg-type]
    )
    await wait_until(task.done, what="the timeout to fire")  # asyncio.timeout uses loop time
    assert cancelled.is_set()
    assert ("fail", ("timed out after 1s", False)) in stub.calls


# -- a process paused past its lease (invariant 6) ---------------------------------------------


def pausable_worker(clock: FakeClock, check: str) -> tuple[Worker, asyncio.Event, dict[str, Any]]:
    """A handler that waits for ``go`` (its call to an external system), then either asks
    ``ctx.cancelled`` ("ask"), calls ``await ctx.checkpoint()`` ("checkpoint") or nothing
    ("ignore") before writing its effect."""
    w = Worker(worker_id="w", lease_s=LEASE_S, safety_margin_s=MARGIN_S, clock=clock)
    go = asyncio.Event()
    seen: dict[str, Any] = {"effects": 0}

    @w.handler("t", timeout=100)
    async def handler(ctx: JobContext) -> None:
        await go.wait()
        seen["cancelled_on_resume"] = ctx.cancelled
        if check == "ask" and ctx.cancelled:
            return
        if check == "checkpoint":
            await ctx.checkpoint()
        seen["effects"] += 1

    return w, go, seen


async def pause_then_resume(w: Worker, go: asyncio.Event, clock: FakeClock) -> FakeStub:
    stub = FakeStub(clock, heartbeat="ok")
    task = await run_job(w, stub, clock, claimed(), seconds=0.5)
    calls_before = len(stub.calls)
    # SIGSTOP for 10 s, well past the lease; the external call's answer arrived meanwhile.
    # SIGCONT: the loop runs again, and the handler's wake-up happens to come first.
    go.set()
    clock.advance(10)
    for _ in range(50):
        await asyncio.sleep(0)
    assert task.done()
    del stub.calls[:calls_before]  # what happened after the pause
    return stub


async def test_a_handler_resumed_after_a_pause_past_its_lease_sees_cancelled_at_once() -> None:
    """An ``async def`` is not even resumed: ``LeaseLost`` is raised at its
    ``await`` (``attempts._Guarded``), so it never gets to ask."""
    clock = FakeClock()
    w, go, seen = pausable_worker(clock, check="ask")
    stub = await pause_then_resume(w, go, clock)
    assert "cancelled_on_resume" not in seen, "resumed after its lease was over"
    assert seen["effects"] == 0
    assert stub.calls == [], "it extended or reported after the lease was over"


async def test_a_checkpoint_after_a_pause_past_the_lease_raises_lease_lost() -> None:
    clock = FakeClock()
    w, go, seen = pausable_worker(clock, check="checkpoint")
    events: list[tuple[str, str]] = []
    w._on_event = lambda kind, ctx, detail: events.append((kind, detail))
    stub = await pause_then_resume(w, go, clock)
    assert seen["effects"] == 0
    assert stub.calls == []
    assert ("lost", "the lease deadline passed (not extended in time); handler stopped") in events


async def test_a_result_is_not_sent_once_the_lease_is_over() -> None:
    """A handler that never looks at its lease is stopped at its ``await`` after the pause
    (it once took the step and finished), and nothing is reported (another worker may
    hold the job by now); the job is left to its lease expiry."""
    clock = FakeClock()
    w, go, seen = pausable_worker(clock, check="ignore")
    events: list[tuple[str, str]] = []
    w._on_event = lambda kind, ctx, detail: events.append((kind, detail))
    stub = await pause_then_resume(w, go, clock)
    assert seen["effects"] == 0, "it took a step after its lease was over"
    assert stub.calls == [], "a success was reported after the lease was over"
    assert [k for k, _ in events][-1] == "lost"


def test_check_raises_once_the_deadline_passes_on_the_monotonic_clock() -> None:
    clock = FakeClock()
    ctx = _ctx(Worker(worker_id="w", clock=clock), claimed())
    ctx._lease.begin(clock, deadline=clock.monotonic() + 2.5)
    ctx.check()  # held
    assert not ctx.cancelled
    clock.advance(2.5)  # no task ran: the clock alone says the lease is over
    assert ctx.cancelled
    with pytest.raises(LeaseLost, match="deadline passed"):
        ctx.check()
