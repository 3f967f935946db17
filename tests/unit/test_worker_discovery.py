"""Workers find every node through ClusterInfo and claim from each, as nodes join and leave."""

from __future__ import annotations

import asyncio
import time

from timeshard.clock import SystemClock
from timeshard.coordinator.base import Member
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import JobSpec, Node
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.worker import JobContext, Worker


class SharedMembership(LocalCoordinator):
    """Each node owns its own shards (its own store), but all report one member list."""

    members_list: list[Member] = []

    async def members(self) -> list[Member]:
        return list(self.members_list)


def make_server() -> Server:
    node = Node(
        store=SqliteStore(":memory:", num_shards=2),
        coordinator=SharedMembership(),
        clock=SystemClock(),
    )
    return Server(node, port=0)


async def test_worker_seeded_with_one_node_claims_from_a_node_that_joins() -> None:
    a, b = make_server(), make_server()
    await a.start()
    await b.start()
    ran: list[str] = []
    worker = Worker(lease_s=10, claim_wait_s=0.5)

    @worker.handler("t")
    async def handle(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    stop = asyncio.Event()
    SharedMembership.members_list = [Member(node_id="a", address=a.address)]
    task = asyncio.create_task(worker.run([a.address], stop, discover_every_s=0.2))
    try:
        job_b, _ = await b.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await asyncio.sleep(1.0)
        assert ran == [], "claimed from a node that is not a member yet"
        SharedMembership.members_list = [
            Member(node_id="a", address=a.address),
            Member(node_id="b", address=b.address),
        ]
        deadline = time.monotonic() + 10
        while job_b.job_id not in ran and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert ran == [job_b.job_id]
        # b leaves: no more claims from it.
        SharedMembership.members_list = [Member(node_id="a", address=a.address)]
        await asyncio.sleep(0.6)
        later, _ = await b.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        job_a, _ = await a.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        deadline = time.monotonic() + 10
        while job_a.job_id not in ran and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        assert job_a.job_id in ran and later.job_id not in ran
    finally:
        stop.set()
        await task
        await a.stop(0)
        await b.stop(0)
