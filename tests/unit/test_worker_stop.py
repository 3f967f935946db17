"""Graceful shutdown: ``Worker.stop(drain_s)`` stops claiming, lets running
handlers finish for at most ``drain_s`` (a second ``stop()`` ends the wait at once), then stops
the rest and gives their jobs back: they run again at once, elsewhere, and the unfinished
attempt does not count against ``max_attempts``. A handler that does not stop is never given
back while it may still act. Real server, the embedded store, the system clock; the waits below
are bounds against a hang, never timings asserted."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from timeshard.cli.main import build_parser
from timeshard.cli.serve import _stop_worker_on_signals
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import GIVEN_BACK, Job, JobState
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.worker import JobContext, Worker

HANG_GUARD_S = 60.0  # a busy 2-core box; a drain that is not bounded waits 300 s


@asynccontextmanager
async def serving(path: Path) -> AsyncIterator[Server]:
    node = Node(
        store=SqliteStore(path, num_shards=2),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=NodeConfig(min_lease_s=0.5),
    )
    srv = Server(node, port=0)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(0)


class CountedClock(SystemClock):
    """The system clock, counting the sleeps begun on it: a drain looks at its running
    handlers every 50 ms, sleeping on the worker's clock in between."""

    def __init__(self) -> None:
        self.sleeps = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        await super().sleep(seconds)


def new_worker(name: str, events: list[tuple[str, str]]) -> Worker:
    return Worker(
        worker_id=name,
        lease_s=30.0,
        claim_wait_s=0.5,
        on_event=lambda kind, ctx, detail: events.append((kind, detail)),
        clock=CountedClock(),
    )


async def waited_on(worker: Worker, run: asyncio.Task[None]) -> None:
    """Until the worker's drain has looked at its running handler and gone back to waiting
    twice (or the run ended: the caller's assertion then fails)."""
    clock = worker._clock
    assert isinstance(clock, CountedClock)
    seen = clock.sleeps
    await wait_until(
        lambda: run.done() or clock.sleeps >= seen + 2, HANG_GUARD_S, "the drain to wait"
    )


async def job_now(srv: Server, job: Job) -> Job:
    return await srv.node.jobs.get(job.job_id)


async def test_a_job_still_running_after_the_drain_is_given_back_and_runs_elsewhere(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "db") as srv:
        events: list[tuple[str, str]] = []
        first = new_worker("w1", events)
        started = asyncio.Event()

        @first.handler("t", timeout=300)
        async def forever(ctx: JobContext) -> None:
            started.set()
            await asyncio.Event().wait()  # until stopped

        job, _ = await srv.node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=0, max_attempts=1)
        )
        run = asyncio.create_task(first.run([srv.address], discover_every_s=0))
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        first.stop(drain_s=0.2)
        await asyncio.wait_for(run, HANG_GUARD_S)  # bounded: not the handler's 300 s

        back = await job_now(srv, job)
        assert back.state is JobState.SCHEDULED and back.lease_owner == ""
        assert back.attempt == 0  # the unfinished attempt is not counted
        assert [(a.worker, a.outcome, a.error) for a in back.history] == [
            ("w1", GIVEN_BACK, "worker shut down")
        ]
        assert ("given back", "worker shut down") in events
        assert first.abandoned == 0

        # Another worker runs it at once, and its one attempt (max_attempts=1) is still there.
        second = new_worker("w2", events)

        @second.handler("t")
        async def quick(ctx: JobContext) -> None:
            pass

        run2 = asyncio.create_task(second.run([srv.address], discover_every_s=0))
        await wait_until(
            lambda: ("succeeded", "") in events, HANG_GUARD_S, "the second worker to run it"
        )
        second.stop()
        await asyncio.wait_for(run2, HANG_GUARD_S)
        done = await job_now(srv, job)
        assert done.state is JobState.SUCCEEDED and (done.attempt, done.max_attempts) == (1, 1)
        assert [a.worker for a in done.history] == ["w1", "w2"]


async def test_a_handler_that_finishes_within_the_drain_reports_its_result(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "db") as srv:
        events: list[tuple[str, str]] = []
        worker = new_worker("w1", events)
        started, release = asyncio.Event(), asyncio.Event()

        @worker.handler("t", timeout=300)
        async def slow(ctx: JobContext) -> None:
            started.set()
            await release.wait()

        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        run = asyncio.create_task(worker.run([srv.address], discover_every_s=0))
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        worker.stop(drain_s=HANG_GUARD_S * 10)
        await waited_on(worker, run)
        assert not run.done()  # draining: waiting for the handler
        release.set()
        await asyncio.wait_for(run, HANG_GUARD_S)
        done = await job_now(srv, job)
        assert done.state is JobState.SUCCEEDED and done.attempt == 1
        assert not any(kind == "given back" for kind, _ in events)


async def test_a_second_stop_ends_the_drain_at_once(tmp_path: Path) -> None:
    async with serving(tmp_path / "db") as srv:
        events: list[tuple[str, str]] = []
        worker = new_worker("w1", events)
        started = asyncio.Event()

        @worker.handler("t", timeout=300)
        async def forever(ctx: JobContext) -> None:
            started.set()
            await asyncio.Event().wait()

        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        run = asyncio.create_task(worker.run([srv.address], discover_every_s=0))
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        worker.stop(drain_s=3600)  # the first signal: a drain of an hour
        await waited_on(worker, run)
        assert not run.done()
        worker.stop()  # the second signal
        await asyncio.wait_for(run, HANG_GUARD_S)
        back = await job_now(srv, job)
        assert back.state is JobState.SCHEDULED and back.attempt == 0
        assert back.history[-1].outcome == GIVEN_BACK


async def test_a_thread_handler_that_does_not_stop_is_not_given_back(tmp_path: Path) -> None:
    """A thread inside a blocking call can not be interrupted: it may still act, so its job is
    not handed to another worker; it is left to its lease expiry (a failed attempt)."""
    async with serving(tmp_path / "db") as srv:
        events: list[tuple[str, str]] = []
        worker = new_worker("w1", events)
        started, unblock = threading.Event(), threading.Event()

        @worker.handler("t", timeout=300)
        def wedged(ctx: JobContext) -> None:
            started.set()
            unblock.wait()  # one C call: the SDK's interrupt lands only after it returns

        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        run = asyncio.create_task(worker.run([srv.address], discover_every_s=0))
        try:
            await wait_until(started.is_set, HANG_GUARD_S, "the handler to start")
            worker.stop(drain_s=0.1)
            await asyncio.wait_for(run, HANG_GUARD_S)
            still = await job_now(srv, job)
            assert still.state is JobState.RUNNING and still.lease_owner == "w1"
            assert worker.abandoned == 1
            assert any(kind == "abandoned" for kind, _ in events)
        finally:
            unblock.set()


async def test_a_thread_handler_that_stops_when_interrupted_is_given_back(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "db") as srv:
        events: list[tuple[str, str]] = []
        worker = new_worker("w1", events)
        started = threading.Event()

        @worker.handler("t", timeout=300)
        def busy(ctx: JobContext) -> None:
            started.set()
            deadline = time.monotonic() + HANG_GUARD_S
            while time.monotonic() < deadline:  # Python steps: the interrupt lands at once
                time.sleep(0.01)

        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        run = asyncio.create_task(worker.run([srv.address], discover_every_s=0))
        await wait_until(started.is_set, HANG_GUARD_S, "the handler to start")
        worker.stop(drain_s=0.1)
        await asyncio.wait_for(run, HANG_GUARD_S)
        back = await job_now(srv, job)
        assert back.state is JobState.SCHEDULED and back.attempt == 0, back
        assert worker.abandoned == 0


async def test_timeshard_worker_drains_on_sigterm_and_a_second_signal_ends_it(
    tmp_path: Path,
) -> None:
    """The CLI's wiring: the first SIGTERM starts a drain of ``--drain-timeout``, the second
    (here SIGINT) ends it at once; the job is given back."""
    args = build_parser().parse_args(["worker", "m:w", "--drain-timeout", "3600"])
    assert args.drain_timeout == 3600.0
    async with serving(tmp_path / "db") as srv:
        events: list[tuple[str, str]] = []
        worker = new_worker("w1", events)
        started = asyncio.Event()

        @worker.handler("t", timeout=300)
        async def forever(ctx: JobContext) -> None:
            started.set()
            await asyncio.Event().wait()

        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        loop = asyncio.get_running_loop()
        _stop_worker_on_signals(worker, args.drain_timeout)
        try:
            run = asyncio.create_task(worker.run([srv.address], discover_every_s=0))
            await asyncio.wait_for(started.wait(), HANG_GUARD_S)
            os.kill(os.getpid(), signal.SIGTERM)
            await wait_until(lambda: worker.stopping, HANG_GUARD_S, "the first signal")
            await waited_on(worker, run)
            assert not run.done() and worker.drain_s == 3600.0  # draining
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.wait_for(run, HANG_GUARD_S)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        back = await job_now(srv, job)
        assert back.state is JobState.SCHEDULED and back.history[-1].outcome == GIVEN_BACK


def test_a_bad_drain_timeout_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "m:w", "--drain-timeout", "-1"])
    assert "--drain-timeout" in capsys.readouterr().err
