"""A whole node on real Cassandra: gRPC in, the dispatcher, the worker SDK out. Jobs (and a late
one, due before the cursor), a cron schedule, and Cassandra dying and coming back mid-run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.server import Server
from timeshard.stack import CassandraProcess
from timeshard.store.cassandra import CassandraStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, ts, ts_ms
from timeshard.worker import JobContext, Worker

pytestmark = pytest.mark.timeout(300)


@asynccontextmanager
async def node_with_worker(
    url: str, *, use_stream: bool = False, config: NodeConfig | None = None
) -> AsyncIterator[tuple[Server, list[JobContext]]]:
    node = Node(
        store=CassandraStore.from_url(url, num_shards=8),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=config,
    )
    server = Server(node, port=0)
    await server.start()
    ran: list[JobContext] = []
    worker = Worker(lease_s=10, claim_wait_s=2, use_stream=use_stream)

    @worker.handler("it.job", concurrency=16)
    async def job(ctx: JobContext) -> None:
        ran.append(ctx)

    stop = asyncio.Event()
    task = asyncio.create_task(worker.run([server.address], stop))
    try:
        yield server, ran
    finally:
        stop.set()
        await task
        await server.stop(0)


async def test_jobs_late_writes_and_cron_run_end_to_end(
    cassandra_address: str, keyspace: str
) -> None:
    url = f"cassandra://{cassandra_address}/{keyspace}"
    async with (
        node_with_worker(url) as (server, ran),
        grpc.aio.insecure_channel(server.address) as ch,
    ):
        jobs = pb_grpc.JobServiceStub(ch)
        now = time.time_ns() // 1_000_000
        batch = [
            pb.ScheduleJobRequest(type="it.job", run_at=ts(now + 1500 + i * 20)) for i in range(30)
        ]
        resp = await jobs.ScheduleJobs(pb.ScheduleJobsRequest(jobs=batch))
        ids = {r.job.job_id for r in resp.results}
        # Due ten minutes ago: written into the bucket the dispatcher reads now. The API refuses
        # a run_at that far back, so through the node (as a catch-up or a replay writes).
        late, _ = await server.node.jobs.schedule(
            JobSpec(job_type="it.job", payload=b"", run_at=now - 600_000)
        )
        ids.add(late.job_id)
        await jobs.CreateSchedule(
            pb.CreateScheduleRequest(
                schedule=pb.Schedule(
                    schedule_id="each-second",
                    cron="* * * * * *",
                    timezone="UTC",
                    type="it.job",
                )
            )
        )
        await wait_until(lambda: ids <= {c.job_id for c in ran}, 60, "the jobs to run")
        await wait_until(
            lambda: sum(1 for c in ran if c.job_id.startswith("each-second@")) >= 3,
            30,
            "three cron runs",
        )
        assert all(c.lateness_ms >= 0 for c in ran if c.job_id in ids), "fired early"
        on_time = [c.lateness_ms for c in ran if c.job_id in ids and c.run_at > now]
        assert len(on_time) == 30
        for job_id in ids:
            job = await jobs.GetJob(pb.GetJobRequest(job_id=job_id))
            assert job.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_RUNNING)


@pytest.mark.timeout(600)
async def test_cassandra_down_mid_run_is_unavailable_then_nothing_is_lost(
    own_node: CassandraProcess,
) -> None:
    url = f"cassandra://{own_node.address}/crash"
    async with (
        node_with_worker(url) as (server, ran),
        grpc.aio.insecure_channel(server.address) as ch,
    ):
        jobs = pb_grpc.JobServiceStub(ch)
        now = time.time_ns() // 1_000_000
        batch = [
            pb.ScheduleJobRequest(type="it.job", run_at=ts(now + 4000 + i * 100)) for i in range(20)
        ]
        resp = await jobs.ScheduleJobs(pb.ScheduleJobsRequest(jobs=batch))
        ids = {r.job.job_id for r in resp.results}
        own_node.kill()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await jobs.ScheduleJob(pb.ScheduleJobRequest(type="it.job", delay=dur(0)), timeout=60)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "retry" in (info.value.details() or "")
        own_node.start(timeout=240)
        down_until = time.time_ns() // 1_000_000
        await wait_until(lambda: ids <= {c.job_id for c in ran}, 180, "every job to run")
        assert {c.job_id for c in ran} >= ids
        late = [c for c in ran if c.job_id in ids]
        assert all(c.started_at_ms >= c.run_at for c in late)
        assert any(c.run_at < down_until for c in late)  # some came due while it was down
        fresh = await jobs.ScheduleJob(pb.ScheduleJobRequest(type="it.job", delay=dur(0)))
        await wait_until(lambda: fresh.job.job_id in {c.job_id for c in ran}, 60, "a new job")
        assert ts_ms(fresh.job.run_at) > 0
