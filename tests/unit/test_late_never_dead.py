"""Invariant 9, late never dead, at the node (fake clock, embedded store): a delivery is an
attempt only once its handler started (the worker's start notice); a lease that runs out with
no notice gives the job back uncounted, with its reason in the history; deliveries without a
start are bounded per type; and with ``max_ready`` the node refuses due-now work it could not
start, with a time to try again, while it keeps accepting future jobs."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.unit.helpers import LEASE_S, START_MS, advance, claim_one, node_with
from timeshard.api.status import node_status_to_pb
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import RETRY_AFTER_KEY, InvalidArgument, ResourceExhausted
from timeshard.model import JobState
from timeshard.node import Beat, JobSpec, Node, NodeConfig, TypePolicy
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.page import render
from timeshard.views.status import node_status
from timeshard.wire import dur


async def test_a_lease_over_with_no_start_notice_spends_no_attempt() -> None:
    async with node_with() as (node, clock):
        await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS, max_attempts=1)
        )
        job_id, fence = await claim_one(node, clock)
        assert (await node.jobs.get(job_id)).attempt == 1  # the number it will have if it starts
        await advance(node, clock, LEASE_S + 1)  # the worker never said it started
        back = await node.jobs.get(job_id)
        assert back.state is JobState.SCHEDULED, back  # not dead: waiting spent no attempt
        assert (back.attempt, back.unstarted) == (0, 1)
        assert back.history[-1].outcome == "not started"
        assert (
            back.history[-1].error == "not started: lease over with no start notice from worker w1"
        )
        assert node.metrics.totals()["t"]["not_started"] == 1
        assert node.metrics.totals()["t"]["lease_expiries"] == 0
        await wait_until(lambda: node.ready.count() == 1, what="the job due again")
        (again,) = await node.claims.claim(
            worker="w2", types=["t"], limit=1, wait_s=0, lease_s=LEASE_S
        )
        assert (again.job.attempt, again.job.fence) == (1, fence + 1)
        done = await node.attempts.complete(job_id, again.job.fence)
        assert (done.state, done.attempt) == (JobState.SUCCEEDED, 1)


async def test_a_lease_over_after_a_start_notice_is_a_failed_attempt() -> None:
    """The poison job still ends dead: its handler started, then its worker died."""
    async with node_with() as (node, clock):
        await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS, max_attempts=1)
        )
        job_id, fence = await claim_one(node, clock)
        node.attempts.notice_starts([Beat(job_id, fence, 0.0, clock.now_ms())])
        await advance(node, clock, LEASE_S + 1)
        dead = await node.jobs.get(job_id)
        assert (dead.state, dead.attempt, dead.unstarted) == (JobState.DEAD, 1, 0)
        assert dead.last_error == "lease expired"
        assert node.metrics.totals()["t"]["lease_expiries"] == 1
        # Schedule-to-start was measured from the notice: due at START_MS, started 0.5 s later.
        buckets, top = node.metrics.start_windows["t"].buckets(60)
        assert sum(buckets.values()) == 1 and top == pytest.approx(500, abs=1)
        status = await node_status(node, 60)
        assert status.as_json()["start_delay"]["t"]["count"] == 1
        reply = node_status_to_pb(status)
        [delay] = reply.start_delay
        assert (delay.type, delay.count, delay.max_ms) == ("t", 1, pytest.approx(500, abs=1))
        page = render(status)
        assert "Due to handler start" in page and "<td>t</td>" in page


async def test_a_start_notice_written_with_a_heartbeat_counts_for_a_later_owner() -> None:
    """The owner's memory is not the only record: a heartbeat carrying the notice writes it
    into the row, so a node that takes the shard over counts the attempt too."""
    async with node_with() as (node, clock):
        await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS, max_attempts=1)
        )
        job_id, fence = await claim_one(node, clock)
        job, _ = await node.attempts.heartbeat(job_id, fence, LEASE_S, started_at=clock.now_ms())
        assert job.start_noticed
        node.starts._deliveries.clear()  # as a new owner: nothing in memory
        await advance(node, clock, LEASE_S + 1)
        assert (await node.jobs.get(job_id)).state is JobState.DEAD


async def test_deliveries_without_a_start_are_bounded_by_the_type() -> None:
    types = {"t": TypePolicy(max_unstarted=2)}
    async with node_with(types=types) as (node, clock):
        await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS, max_attempts=5)
        )
        job_id, fence = await claim_one(node, clock)
        why = "not started: lease over before the worker received it"
        back = await node.attempts.give_back(job_id, fence, why, not_started=True)
        assert (back.state, back.unstarted, back.attempt) == (JobState.SCHEDULED, 1, 0)
        job_id, fence = await claim_one(node, clock)
        dead = await node.attempts.give_back(job_id, fence, why, not_started=True)
        assert (dead.state, dead.unstarted, dead.attempt) == (JobState.DEAD, 2, 0)
        assert dead.last_error == (
            "never started: 2 deliveries ended without a handler start (the last: "
            "not started: lease over before the worker received it)"
        )
        counts = node.metrics.totals()["t"]
        assert (counts["not_started"], counts["dead_unstarted"]) == (2, 1)
        assert counts["failed"] == 0


def test_a_bound_of_zero_deliveries_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="max_unstarted"):
        TypePolicy(max_unstarted=0)


async def test_max_ready_refuses_due_now_work_and_keeps_accepting_future_jobs() -> None:
    async with node_with(max_ready=2) as (node, clock):
        for _ in range(2):
            await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        await advance(node, clock, 0.5)
        assert node.ready.count() == 2
        with pytest.raises(ResourceExhausted) as refused:
            await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms()))
        assert 250 <= refused.value.retry_after_ms <= 5000
        assert "--max-ready 2" in refused.value.message
        later, created = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms() + 60_000)
        )
        assert created and later.state is JobState.SCHEDULED
        await node.claims.claim(worker="w", types=["t"], limit=2, wait_s=0, lease_s=LEASE_S)
        _, created = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms())
        )
        assert created  # room again once workers took the ready jobs
        assert node.metrics.ready_refusals_total._value.get() == 1


async def test_a_refusal_reaches_the_client_as_resource_exhausted_with_a_retry_after() -> None:
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=NodeConfig(max_ready=1),
    )
    server = Server(node, port=0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.JobServiceStub(channel)
            req = pb.ScheduleJobRequest(type="t", payload=b"{}", delay=dur(0))
            await stub.ScheduleJob(req)
            await wait_until(lambda: node.ready.count() == 1, what="the first job ready")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ScheduleJob(req)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(refused.value.trailing_metadata() or ())
            assert 250 <= int(trailers[RETRY_AFTER_KEY]) <= 5000
    finally:
        await server.stop(0)


# -- a cancel of a job whose push is in flight -------------------------------------------------


async def test_a_cancel_says_whether_the_handler_had_started() -> None:
    """The documented rule: a cancelled running job's handler does not start, or the cancel
    says it had started. A notice that came before the cancel, or comes while it waits (the
    push was on its way and the worker started it), makes the answer say so; with none by the
    lease's end, the worker could not have started it (its deadline is before that end)."""
    async with node_with() as (node, clock):
        for _ in range(3):
            await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        await advance(node, clock, 0.5)
        claimed = await node.claims.claim(
            worker="w1", types=["t"], limit=3, wait_s=0, lease_s=LEASE_S
        )
        noticed, in_flight, never = [(c.job.job_id, c.job.fence) for c in claimed]

        node.attempts.notice_starts([Beat(*noticed, 0.0, clock.now_ms())])
        assert (await node.jobs.cancel(noticed[0])).start_noticed

        cancelling = asyncio.ensure_future(node.jobs.cancel(in_flight[0]))
        await wait_until(lambda: bool(node.starts._waiters), what="the cancel waiting")
        # The worker started it:
        node.attempts.notice_starts([Beat(*in_flight, 0.0, clock.now_ms())])
        cancelled = await cancelling
        assert cancelled.state is JobState.CANCELLED and cancelled.start_noticed

        cancelling = asyncio.ensure_future(node.jobs.cancel(never[0]))
        await wait_until(lambda: bool(node.starts._waiters), what="the cancel waiting")
        clock.advance(LEASE_S)  # the lease ends with no notice
        cancelled = await cancelling
        assert cancelled.state is JobState.CANCELLED and not cancelled.start_noticed
        assert not node.starts._waiters and len(node.starts) == 0
