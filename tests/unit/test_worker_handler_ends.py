"""Every way a handler ends maps to one recorded outcome, the worker survives it, and a job never
runs twice at once in one worker (docs/handlers.md has the table these tests stand behind). Real
gRPC between the worker and an in-process node on the embedded store and the system clock."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.unit.helpers import advance, running
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import Job, JobState
from timeshard.node import Beat, JobSpec, Node, NodeConfig, TypePolicy
from timeshard.node.retry import RetryPolicy
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.worker import JobContext, PermanentError, Worker
from timeshard.worker.metrics import OUTCOMES

FAST_RETRY = RetryPolicy(base_s=0.05, max_backoff_s=0.05)


def make_server(types: tuple[str, ...] = ("t",), max_attempts: int = 3) -> Server:
    node = Node(
        store=SqliteStore(":memory:", num_shards=2),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=NodeConfig(
            min_lease_s=0.5,
            types={t: TypePolicy(max_attempts=max_attempts, retry=FAST_RETRY) for t in types},
        ),
    )
    return Server(node, port=0)


@dataclass
class Run:
    worker: Worker
    events: list[tuple[str, str, int]] = field(default_factory=list)
    """(kind, detail, attempt) as the worker's event hook heard them."""


@asynccontextmanager
async def working(
    worker: Worker, servers: list[Server], started: bool = False
) -> AsyncIterator[Run]:
    """``worker`` claiming from ``servers`` (started here unless ``started``) until the block
    ends; the servers are stopped then."""
    run = Run(worker)
    hook = worker._on_event

    def record(kind: str, ctx: JobContext, detail: str) -> None:
        run.events.append((kind, detail, ctx.attempt))
        if hook is not None:
            hook(kind, ctx, detail)

    worker._on_event = record
    for srv in servers if not started else ():
        await srv.start()
    stop = asyncio.Event()
    task = asyncio.create_task(
        worker.run([s.address for s in servers], stop, discover_every_s=0), name="test-worker"
    )
    try:
        yield run
        assert not task.done(), f"the worker stopped: {task}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        for srv in servers:
            await srv.stop(0)


async def wait_job(
    srv: Server, job: Job, pred: Callable[[Job], bool], timeout: float = 30.0, what: str = ""
) -> Job:
    """The job once ``pred`` holds for it (generous deadlines: a loaded 2-core box)."""
    what = what or f"job {job.job_id} to satisfy {pred}"
    return await wait_until(lambda: srv.node.jobs.get(job.job_id), timeout, what, until=pred)


def worker(lease_s: float = 30.0, **kw: Any) -> Worker:
    return Worker(worker_id="w1", lease_s=lease_s, claim_wait_s=1.0, **kw)


def first_error(job: Job) -> str:
    return next(a.error for a in job.history if a.error)


# -- 1. never twice at once in one worker ---------------------------------------------------------


async def test_a_sync_handler_past_its_timeout_keeps_its_slot_and_its_retry_waits() -> None:
    """Attempt 1 passes its timeout blocked in a C call (its thread can not be interrupted):
    the attempt is failed (retried), but its thread keeps a slot, and attempt 2, claimed by the
    same worker, does not start until that thread has really ended."""
    srv = make_server()
    w = worker()
    release = threading.Event()
    active: list[int] = []
    overlap: list[tuple[int, ...]] = []
    ended: list[int] = []

    @w.handler("t", timeout=1.5, concurrency=2)
    def handle(ctx: JobContext) -> None:
        active.append(ctx.attempt)
        if len(active) > 1:
            overlap.append(tuple(active))
        try:
            if ctx.attempt == 1:
                release.wait(60)  # blocked: an async exception waits until this returns
        finally:
            active.remove(ctx.attempt)
            ended.append(ctx.attempt)

    async with working(w, [srv]) as run:
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await wait_job(srv, job, lambda j: j.attempt == 2, what="attempt 2 claimed")
        await asyncio.sleep(0.3)  # time for a second run to start, if it were let
        assert overlap == [], "attempt 2 started while attempt 1's thread was still running"
        assert w._slots.free("t") == 0, "attempt 1's thread gave its slot back while running"
        release.set()
        done = await wait_job(srv, job, lambda j: j.state.terminal, what="the job to finish")
        assert done.state is JobState.SUCCEEDED, done
        assert first_error(done) == "timed out after 1.5s"
        assert ended == [1, 2] and overlap == []
        await wait_until(lambda: w._slots.free("t") == 2, 30.0, "both slots free again")
        # (the worker's event follows the node's answer, which follows the write just read)
        await wait_until(lambda: ("succeeded", "", 2) in run.events, 30.0, "the worker's event")


async def test_an_async_handler_resumed_after_blocking_the_loop_past_its_lease_stops() -> None:
    """An ``async def`` that blocks the event loop past its lease (``time.sleep``) is stopped
    at its next ``await`` before it takes another step: no effect, no result sent."""
    srv = make_server()
    w = worker(lease_s=1.2, safety_margin_s=0.2)
    effects: list[int] = []
    calls: list[int] = []

    @w.handler("t", timeout=60)
    async def handle(ctx: JobContext) -> None:
        calls.append(ctx.fence)
        if len(calls) == 1:
            time.sleep(1.5)  # the loop (and this in-process node) blocked past the lease
            await asyncio.sleep(0)
            effects.append(ctx.attempt)  # a step taken without a lease

    async with working(w, [srv]) as run:
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await wait_until(lambda: any(k in OUTCOMES for k, _, a in run.events), 30.0, "a run ended")
        assert effects == [], "the handler went on after its lease was over"
        assert [k for k, _, a in run.events][:2] == ["started", "lost"]
        done = await wait_job(srv, job, lambda j: j.state.terminal, what="the job to finish")
        # The first run was not reported. Its start notice left before the handler blocked,
        # but this in-process node was blocked too and may have ended the lease before reading
        # it: then the run counted as not started (attempt 1 again), else as attempt 1.
        assert done.state is JobState.SUCCEEDED and len(calls) == 2, done
        assert done.attempt == 2 or done.unstarted == 1, done


# -- 3. SystemExit and KeyboardInterrupt ----------------------------------------------------------


def _raise(exc: str) -> None:
    if exc == "sys.exit":
        sys.exit(3)
    if exc == "SystemExit":
        raise SystemExit("bye")
    raise KeyboardInterrupt


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize(
    ("exc", "error"),
    [
        ("sys.exit", "SystemExit: 3"),
        ("SystemExit", "SystemExit: bye"),
        ("KeyboardInterrupt", "KeyboardInterrupt"),
    ],
)
async def test_a_handler_that_exits_fails_its_attempt_and_the_worker_survives(
    kind: str, exc: str, error: str
) -> None:
    srv = make_server()
    w = worker()

    if kind == "async":

        @w.handler("t", timeout=60)
        async def handle(ctx: JobContext) -> None:
            if ctx.attempt == 1:
                _raise(exc)

    else:

        @w.handler("t", timeout=60)
        def handle_sync(ctx: JobContext) -> None:
            if ctx.attempt == 1:
                _raise(exc)

    async with working(w, [srv]):
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        done = await wait_job(srv, job, lambda j: j.state.terminal, what="the job to finish")
        assert done.state is JobState.SUCCEEDED and done.attempt == 2, done  # the worker lived on
        assert first_error(done) == error


# -- 4. a handler's own CancelledError ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_handlers_own_cancelled_error_is_a_failed_attempt(kind: str) -> None:
    srv = make_server()
    w = worker()  # a 30 s lease: the attempt must be reported, not left to expire

    if kind == "async":

        @w.handler("t", timeout=60)
        async def handle(ctx: JobContext) -> None:
            if ctx.attempt == 1:
                raise asyncio.CancelledError("gave up")

    else:

        @w.handler("t", timeout=60)
        def handle_sync(ctx: JobContext) -> None:
            if ctx.attempt == 1:
                raise asyncio.CancelledError("gave up")

    async with working(w, [srv]):
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        done = await wait_job(srv, job, lambda j: j.state.terminal, timeout=15, what="finished")
        assert done.state is JobState.SUCCEEDED and done.attempt == 2, done
        assert first_error(done) == "CancelledError: gave up (raised by the handler)"


# -- 5. a hook that raises ------------------------------------------------------------------------


async def test_an_event_hook_that_raises_does_not_leak_the_handlers_slot() -> None:
    srv = make_server()

    def hook(kind: str, ctx: JobContext, detail: str) -> None:
        raise RuntimeError(f"hook broke on {kind}")

    w = worker(on_event=hook)

    @w.handler("t", timeout=60, concurrency=1)
    async def handle(ctx: JobContext) -> None:
        pass

    async with working(w, [srv]):
        jobs = [
            (await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0)))[0]
            for _ in "ab"
        ]
        for job in jobs:
            done = await wait_job(srv, job, lambda j: j.state.terminal, what="both jobs done")
            assert done.state is JobState.SUCCEEDED and done.attempt == 1, done
        await wait_until(lambda: w._slots.free("t") == 1, 30.0, "the slot back")


# -- the other rows of docs/handlers.md -----------------------------------------------------------


async def test_a_return_succeeds_and_any_other_exception_is_a_retried_attempt() -> None:
    srv = make_server()
    w = worker()

    @w.handler("t", timeout=60)
    async def handle(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise ValueError("boom")

    async with working(w, [srv]) as run:
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        done = await wait_job(srv, job, lambda j: j.state.terminal, what="the job to finish")
        assert done.state is JobState.SUCCEEDED and done.attempt == 2, done
        assert [(a.attempt, a.error) for a in done.history] == [(1, "ValueError: boom"), (2, "")]
        await wait_until(lambda: ("succeeded", "", 2) in run.events, 30.0, "the success heard")
        assert ("failed", "ValueError: boom", 1) in run.events


async def test_a_permanent_error_sends_the_job_to_the_dead_letters_at_once() -> None:
    srv = make_server()
    w = worker()

    @w.handler("t", timeout=60)
    def handle(ctx: JobContext) -> None:
        raise PermanentError("no recipient")

    async with working(w, [srv]):
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        done = await wait_job(srv, job, lambda j: j.state.terminal, what="the job to finish")
        assert done.state is JobState.DEAD and done.attempt == 1, done
        assert done.last_error == "PermanentError: no recipient"


async def test_a_cancelled_job_stops_its_handler_at_the_next_heartbeat() -> None:
    srv = make_server()
    w = worker(lease_s=1.5, safety_margin_s=0.25)  # a heartbeat every 0.5 s
    started = asyncio.Event()
    stopped: list[str] = []

    @w.handler("t", timeout=60)
    async def handle(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.append(ctx.job_id)
            raise

    async with working(w, [srv]) as run:
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await asyncio.wait_for(started.wait(), 30)
        await srv.node.jobs.cancel(job.job_id)
        await wait_until(lambda: stopped == [job.job_id], 30.0, "the handler stopped")
        await wait_until(lambda: any(k == "lost" for k, _, _ in run.events), 30.0, "lost")
        done = await srv.node.jobs.get(job.job_id)
        assert done.state is JobState.CANCELLED and done.history[-1].outcome == "cancelled"
        assert not any(k in ("succeeded", "failed") for k, _, _ in run.events)


async def test_a_worker_that_dies_holding_a_job_leaves_it_to_its_lease_expiry() -> None:
    """Process death after its handler started (its start notice came): nothing more comes
    from the worker; the node records the attempt as "lease expired" when the lease ends and
    the job runs again (at max_attempts it is dead)."""
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms())
        )
        await advance(node, clock, 0.5)
        claimed = await node.claims.claim(worker="gone", types=["t"], limit=1, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]
        node.attempts.notice_starts([Beat(job.job_id, claimed[0].job.fence, 0.0, clock.now_ms())])
        await advance(node, clock, 8)
        after = await node.jobs.get(job.job_id)
        assert after.history[0].error == "lease expired", after
        assert after.state is not JobState.RUNNING or after.attempt == 2, after
