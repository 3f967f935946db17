"""A cancel through the node that does not dispatch the job, inside the claim-ahead window, on
real Cassandra and ZooKeeper (issue 36): two nodes claiming ahead, a Python worker on the worker
stream (``accepts_starts_in``) connected to both. The owner claimed the job ahead and holds it
or pushed it with ``starts_in``; the cancel, sent to the other node, is revoked through the
owner (``PeerService.Revoke``) and answered with its answer: not started. The handler never
starts."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from tests.integration.test_peer_hints import SHARDS, two_nodes
from timeshard.limits import START_GRACE_MS
from timeshard.model import JobState
from timeshard.node import JobSpec, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.sharding import shard_of
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.worker import JobContext, Worker

pytestmark = pytest.mark.timeout(180)

TYPE = "it.revoked"
WINDOW_MS = 3000
"""Claimed ahead half of it before due (1.5 s), pushed at once: a wide span to cancel in."""
DUE_IN_MS = 8000


async def test_a_cancel_sent_to_the_non_owner_inside_the_window_is_revoked_by_the_owner(
    cassandra_address: str, keyspace: str, zookeeper_hosts: str
) -> None:
    config = NodeConfig(dispatch=DispatchConfig(claim_ahead_ms=WINDOW_MS))
    async with two_nodes(cassandra_address, keyspace, zookeeper_hosts, config) as (a, b):
        ran: list[str] = []
        worker = Worker(lease_s=10, claim_wait_s=2, use_stream=True)

        @worker.handler(TYPE, concurrency=4)
        async def handle(ctx: JobContext) -> None:
            ran.append(ctx.job_id)

        stop = asyncio.Event()
        working = asyncio.create_task(worker.run([a.address, b.address], stop))
        try:
            await wait_until(lambda: b.ready.has_waiter(TYPE), 30, "the worker's stream to b")
            ids = [f"revoked-{uuid.uuid4().hex[:8]}" for _ in range(100)]
            job_id = next(i for i in ids if shard_of(i, SHARDS) in b.dispatching)
            due = a.clock.now_ms() + DUE_IN_MS
            await a.jobs.schedule_many(
                [JobSpec(job_type=TYPE, payload=b"", run_at=due, job_id=job_id)]
            )
            held = await wait_until(
                lambda: a.jobs.get(job_id),
                DUE_IN_MS / 1000,
                "b to claim the job ahead",
                until=lambda j: j.state is not JobState.SCHEDULED,
                every=0.02,
            )
            assert held.lease_owner == b.ahead.holder, held  # claimed ahead, not started
            assert a.clock.now_ms() < due, "the claim ahead came too late to cancel inside it"
            async with grpc.aio.insecure_channel(a.address) as channel:
                jobs = pb_grpc.JobServiceStub(channel)
                answer = await jobs.CancelJob(pb.CancelJobRequest(job_id=job_id), timeout=30)
            assert answer.state == pb.JOB_STATE_CANCELLED
            assert not answer.start_noticed, "the owner's answer: revoked, not started"
            assert a.revokes.counts == {"not_started": 1}, a.revokes.counts
            assert a.metrics.revokes_asked.labels("not_started")._value.get() == 1  # type: ignore[attr-defined]
            # Past the latest start any push of it could have had: nothing started it.
            await asyncio.sleep(max(0.0, (due + START_GRACE_MS - a.clock.now_ms()) / 1000 + 1))
            assert job_id not in ran, "the handler started; the cancel's answer said it did not"
            row = await a.jobs.get(job_id)
            assert row.state is JobState.CANCELLED
        finally:
            stop.set()
            await working
