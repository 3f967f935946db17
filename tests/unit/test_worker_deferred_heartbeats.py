"""On the system clock a job's heartbeat loop starts only when its first heartbeat is due: a handler
that runs past several heartbeats still keeps its lease (and the job runs once), and one that
finishes at once never starts a heartbeat loop at all."""

from __future__ import annotations

import asyncio

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import JobState
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.worker import JobContext, Worker
from timeshard.worker.heartbeats import Heartbeats

LEASE_S = 1.2  # heartbeats every 0.4 s; the handler below runs past three of them


async def run_one(
    monkeypatch: pytest.MonkeyPatch,
    handler_s: float,
    lease_s: float = LEASE_S,
    margin_s: float = 0.2,
) -> tuple[list[int], JobState, int, int]:
    node = Node(
        store=SqliteStore(":memory:", num_shards=2),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=NodeConfig(min_lease_s=0.5),
    )
    server = Server(node, port=0)
    await server.start()
    worker = Worker(lease_s=lease_s, safety_margin_s=margin_s, claim_wait_s=0.5)
    runs: list[int] = []
    heartbeat_loops_started = 0
    keep = Heartbeats.run

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal heartbeat_loops_started
        heartbeat_loops_started += 1  # called when a heartbeat loop starts, not when its job does
        return keep(*args, **kwargs)

    monkeypatch.setattr(Heartbeats, "run", counting)

    @worker.handler("t", timeout=30)
    async def handle(ctx: JobContext) -> None:
        runs.append(ctx.fence)
        await asyncio.sleep(handler_s)
        ctx.check()  # raises if the lease was not kept

    # Ready before the worker asks: its claim is answered at once, not after a long poll
    # (a long-polled claim extends its lease at once, so it would start a heartbeat loop).
    job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
    await wait_until(node.ready.count, 10, "the job ready")
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run([server.address], stop, discover_every_s=0))
    try:
        found = await wait_until(
            lambda: node.jobs.get(job.job_id),
            15,
            "the job to end",
            until=lambda j: j.state.terminal,
            every=0.05,
        )
        return runs, found.state, found.attempt, heartbeat_loops_started
    finally:
        stop.set()
        await task
        await server.stop(0)


async def test_a_handler_longer_than_its_lease_keeps_it_through_a_deferred_heartbeat_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs, state, attempt, loops = await run_one(monkeypatch, handler_s=1.5)
    assert state is JobState.SUCCEEDED
    assert len(runs) == 1 and attempt == 1, "the lease was lost and the job ran again"
    assert loops == 1


async def test_a_quick_handler_never_starts_its_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    runs, state, attempt, loops = await run_one(monkeypatch, handler_s=0.0, lease_s=30, margin_s=5)
    assert state is JobState.SUCCEEDED and len(runs) == 1 and attempt == 1
    assert loops == 0
