"""The worker stream on real Cassandra: pushes within the credits and never early, per-item
answers to heartbeats and results (a stale fence refused alone), and the worker SDK taking
jobs over the stream end to end."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from tests.integration.test_node_on_cassandra import node_with_worker
from tests.unit.test_worker_stream import Stream, _credits
from timeshard.api.workhub import WorkHub
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import JobState
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.server import Server
from timeshard.store.cassandra import CassandraStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, ts_ms

pytestmark = pytest.mark.timeout(300)


async def test_the_worker_stream_on_cassandra(cassandra_address: str, keyspace: str) -> None:
    url = f"cassandra://{cassandra_address}/{keyspace}"
    node = Node(
        store=CassandraStore.from_url(url, num_shards=8),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
    )
    server = Server(node, port=0)
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    try:
        now = node.clock.now_ms()
        ids = [
            (
                await node.jobs.schedule(
                    JobSpec(job_type="it.stream", payload=b"", run_at=now + 1500 + 50 * i)
                )
            )[0].job_id
            for i in range(10)
        ]
        s = Stream(channel)
        await s.hello(lease_ms=20_000, **{"it.stream": 4})
        first = await s.until_jobs(4)
        for c in first:
            assert ts_ms(c.job.started_at) >= ts_ms(c.job.run_at)
            assert time.time() * 1000 >= ts_ms(c.job.run_at)
        await wait_until(lambda: node.ready.count() == 6, 60, "the other six ready")
        running = [(await node.jobs.get(i)).state for i in ids].count(JobState.RUNNING)
        assert running == 4

        a, b = first[0], first[1]
        seq = await s.send(
            heartbeats=[
                pb.HeartbeatRequest(job_id=a.job.job_id, fence=a.fence, lease=dur(20_000)),
                pb.HeartbeatRequest(job_id=b.job.job_id, fence=b.fence + 1, lease=dur(20_000)),
            ],
            results=[pb.FinishItem(job_id=c.job.job_id, fence=c.fence) for c in first],
            credits=_credits({"it.stream": 6}),
        )
        answer = await s.answer(seq)
        assert answer.heartbeats[0].code == 0
        assert answer.heartbeats[1].code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert [r.code for r in answer.results] == [0, 0, 0, 0]
        rest = (await s.until_jobs(10))[4:]
        seq = await s.send(
            results=[pb.FinishItem(job_id=c.job.job_id, fence=c.fence) for c in rest]
        )
        assert [r.code for r in (await s.answer(seq)).results] == [0] * 6
        states = [(await node.jobs.get(i)).state for i in ids]
        assert states == [JobState.SUCCEEDED] * 10
        seq = await s.send(stop=True)
        while not (await s.read()).stopped:
            pass
    finally:
        await channel.close()
        await server.stop(0)


async def test_the_worker_sdk_runs_jobs_over_the_stream_on_cassandra(
    cassandra_address: str, keyspace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    results: list[str] = []
    submit = WorkHub.submit

    def recording(self: WorkHub, group: Any) -> None:
        results.extend(a.job_id for a in group.asked)
        submit(self, group)

    monkeypatch.setattr(WorkHub, "submit", recording)
    url = f"cassandra://{cassandra_address}/{keyspace}"
    async with node_with_worker(url, use_stream=True) as (server, ran):
        now = server.node.clock.now_ms()
        for i in range(30):
            await server.node.jobs.schedule(
                JobSpec(job_type="it.job", payload=b"", run_at=now + 20 * i)
            )
        await wait_until(lambda: len(ran) >= 30, 90, "thirty jobs run")
        assert all(ctx.started_at_ms >= ctx.run_at for ctx in ran)
        await wait_until(lambda: len(set(results)) >= 30, 60, "thirty results over the stream")


async def test_jobs_claimed_ahead_on_cassandra_start_at_due_time_from_one_batch(
    cassandra_address: str, keyspace: str
) -> None:
    """``claim_ahead_ms``: the owner claims the jobs due in the window before they are due, a
    conditional batch per partition, and hands them over at due time: every handler starts at
    or after its ``run_at``, the attempts claimed ahead show it as their claim time, and the
    claims of 40 jobs of 8 shards' partitions take far fewer Paxos rounds than jobs."""
    url = f"cassandra://{cassandra_address}/{keyspace}"
    config = NodeConfig(dispatch=DispatchConfig(claim_ahead_ms=400))
    async with node_with_worker(url, use_stream=True, config=config) as (server, ran):
        node = server.node
        stats = node.store.stats  # type: ignore[attr-defined]
        now = node.clock.now_ms()
        due = now + 3000
        ids = [
            (await node.jobs.schedule(JobSpec(job_type="it.job", payload=b"", run_at=due)))[
                0
            ].job_id
            for _ in range(40)
        ]
        await asyncio.sleep(max(0.0, (due - 1500 - node.clock.now_ms()) / 1000))
        before = stats.paxos_rounds
        await wait_until(lambda: len(ran) >= 40, 90, "forty jobs run")
        assert all(ctx.started_at_ms >= ctx.run_at for ctx in ran)
        rows = [await node.jobs.get(i) for i in ids]
        ahead = [r for r in rows if r.history[0].worker == node.ahead.holder]
        assert ahead, "no job was claimed ahead"
        assert all(r.history[0].started_at == r.run_at for r in ahead)
        rounds = stats.paxos_rounds - before  # claims and results of the 40
        assert rounds < 40, f"40 jobs due together took {rounds} Paxos rounds"
