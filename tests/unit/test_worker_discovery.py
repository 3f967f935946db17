"""Workers find every node through ClusterInfo and claim from each, as nodes join and leave."""

from __future__ import annotations

import asyncio

from timeshard.clock import SystemClock
from timeshard.coordinator.base import Member
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import JobSpec, Node
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.worker import JobContext, Worker


class SharedMembership(LocalCoordinator):
    """Each node owns its own shards (its own store), but all report one member list."""

    members_list: list[Member] = []
    asked = 0
    """How many times any node was asked for the members (a worker's discovery round)."""

    async def members(self) -> list[Member]:
        SharedMembership.asked += 1
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

    async def rounds(n: int) -> None:
        """Until the worker's discovery has asked for the members ``n`` more times."""
        asked = SharedMembership.asked
        await wait_until(lambda: SharedMembership.asked >= asked + n, 10, f"{n} discoveries")

    def links() -> set[str]:
        return set(worker._nodes.links) if worker._nodes is not None else set()

    try:
        job_b, _ = await b.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await rounds(2)
        assert links() == {a.address} and ran == [], "claimed from a node that is not a member yet"
        SharedMembership.members_list = [
            Member(node_id="a", address=a.address),
            Member(node_id="b", address=b.address),
        ]
        await wait_until(lambda: job_b.job_id in ran, 10, "the job of the node that joined")
        assert ran == [job_b.job_id]
        # b leaves: its link stops claiming at once, and nothing more is taken from it.
        assert worker._nodes is not None
        link_b = worker._nodes.links[b.address]
        SharedMembership.members_list = [Member(node_id="a", address=a.address)]
        await wait_until(lambda: b.address not in links(), 10, "b dropped")
        await wait_until(lambda: link_b._main.done(), 10, "b's link to stop claiming")
        assert all(t.done() for t in link_b._unary)
        later, _ = await b.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        job_a, _ = await a.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await wait_until(lambda: job_a.job_id in ran, 10, "the job of the node still a member")
        await rounds(2)
        assert later.job_id not in ran
        assert (await b.node.jobs.get(later.job_id)).lease_owner == ""
    finally:
        stop.set()
        await task
        await a.stop(0)
        await b.stop(0)
