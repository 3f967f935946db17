"""Hints between nodes on real Cassandra and ZooKeeper, through real gRPC servers: a job due now,
scheduled through the node that does not dispatch its shard, is handed to a worker by its owner
without waiting for the owner's next read of its buckets.

The nodes refresh their buckets every 120 s here (a node takes a shard with a read of its own,
then reads it again only at its refresh), so a job written by the other node after the shards
settled can only reach its owner within the test's waits by the hint."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.base import Member
from timeshard.coordinator.zookeeper import ZooKeeperCoordinator
from timeshard.model import Job, JobState
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.server import Server
from timeshard.sharding import shard_of
from timeshard.store.cassandra import CassandraStore
from timeshard.testing.waits import wait_until

pytestmark = pytest.mark.timeout(180)

SHARDS = 4
TYPE = "it.hinted"
SLOW_REFRESH = DispatchConfig(refresh_s=120.0, lookahead_s=125.0, reread_s=125.0, settle_s=125.0)


def sent(node: Node, outcome: str) -> float:
    return node.metrics.peer_hint_entries.labels("sent", outcome)._value.get()  # type: ignore[no-any-return]


async def claim_all(node: Node, ids: list[str], within_s: float = 20) -> set[str]:
    """What ``node`` claims of ``ids`` within ``within_s``."""
    claimed: set[str] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not claimed >= set(ids) and loop.time() < deadline:
        got = await node.claims.claim(worker="w", types=[TYPE], limit=10, wait_s=2, lease_s=30)
        claimed |= {c.job.job_id for c in got}
    return claimed


@asynccontextmanager
async def two_nodes(
    cassandra_address: str,
    keyspace: str,
    zookeeper_hosts: str,
    config: NodeConfig | None = None,
) -> AsyncIterator[tuple[Node, Node]]:
    """Nodes ``a`` and ``b`` serving on ZooKeeper and Cassandra, two shards each, each knowing
    the other's address; by default (``config``) their bucket reads two minutes apart."""
    url = f"cassandra://{cassandra_address}/{keyspace}"
    zk = f"zookeeper://{zookeeper_hosts}/timeshard-hints/{uuid.uuid4().hex[:8]}?session_timeout=4"
    servers = [
        Server(
            Node(
                store=CassandraStore.from_url(url, num_shards=SHARDS),
                coordinator=ZooKeeperCoordinator.from_url(zk),
                clock=SystemClock(),
                config=config or NodeConfig(dispatch=SLOW_REFRESH),
                node_id=name,
            ),
            port=0,
        )
        for name in ("a", "b")
    ]
    a, b = (s.node for s in servers)
    try:
        for s in servers:
            await s.start()
        await wait_until(
            lambda: len(a.dispatching) == len(b.dispatching) == SHARDS // 2, 60, "even shards"
        )
        await wait_until(
            lambda: all(a.coordinator.peer_for(s) for s in b.dispatching), 10, "a to know b"
        )
        await wait_until(
            lambda: all(b.coordinator.peer_for(s) for s in a.dispatching), 10, "b to know a"
        )
        yield a, b
    finally:
        for s in servers:
            await s.stop(0)


async def test_a_job_written_by_another_node_is_hinted_to_its_owner_and_runs_now(
    cassandra_address: str, keyspace: str, zookeeper_hosts: str
) -> None:
    async with two_nodes(cassandra_address, keyspace, zookeeper_hosts) as (a, b):
        # Jobs of b's shards, due now, written through a: only a hint can bring them to b
        # before its next refresh, two minutes away.
        ids = [f"hinted-{uuid.uuid4().hex[:8]}" for _ in range(200)]
        ids = [i for i in ids if shard_of(i, SHARDS) in b.dispatching][:5]
        now = a.clock.now_ms()
        await a.jobs.schedule_many(
            [JobSpec(job_type=TYPE, payload=b"", run_at=now, job_id=i) for i in ids]
        )
        claimed = await claim_all(b, ids)
        assert claimed == set(ids), "b must run the jobs a wrote for its shards, due now"
        await wait_until(lambda: sent(a, "taken") >= len(ids), 5, "a to count its hints")
        assert sent(a, "failed") == 0
        assert b.metrics.peer_hint_entries.labels("received", "taken")._value.get() >= len(ids)
        # Jobs of a's own shards are never hinted (a's dispatchers took them directly).
        own = [f"own-{uuid.uuid4().hex[:8]}" for _ in range(100)]
        own = [i for i in own if shard_of(i, SHARDS) in a.dispatching][:3]
        before = sent(a, "taken") + sent(a, "not_owned") + sent(a, "failed")
        await a.jobs.schedule_many(
            [JobSpec(job_type=TYPE, payload=b"", run_at=a.clock.now_ms(), job_id=i) for i in own]
        )
        assert await claim_all(a, own) == set(own)
        await asyncio.sleep(0.2)
        assert sent(a, "taken") + sent(a, "not_owned") + sent(a, "failed") == before
        # After a failed call a forgets b's address (b may have restarted elsewhere under its
        # id) and reads it again at once, not at the next resync.
        shard = min(b.dispatching)
        a.coordinator.forget_peer("b")
        assert a.coordinator.peer_for(shard) is None
        await wait_until(lambda: a.coordinator.peer_for(shard) is not None, 5, "b's address")
        assert a.coordinator.peer_for(shard) == Member(node_id="b", address=b.address)


async def test_a_wait_on_one_node_for_a_job_another_dispatches_is_answered_by_that_node(
    cassandra_address: str, keyspace: str, zookeeper_hosts: str
) -> None:
    async with two_nodes(cassandra_address, keyspace, zookeeper_hosts) as (a, b):
        a.waits.reread_s = 300.0  # only b's answer can bring the job in time
        ids = [f"waited-{uuid.uuid4().hex[:8]}" for _ in range(100)]
        job_id = next(i for i in ids if shard_of(i, SHARDS) in b.dispatching)
        await b.jobs.schedule_many(
            [JobSpec(job_type=TYPE, payload=b"", run_at=b.clock.now_ms(), job_id=job_id)]
        )
        [claimed] = await b.claims.claim(worker="w", types=[TYPE], limit=1, wait_s=10, lease_s=30)
        got: list[Job] = []

        async def wait() -> None:
            async for job in a.wait([job_id], 60):
                got.append(job)

        waiting = asyncio.create_task(wait())
        await asyncio.sleep(0.5)  # a asks b now
        assert not waiting.done()
        await b.attempts.complete(job_id, claimed.job.fence, b'"ok"', "json")
        await asyncio.wait_for(waiting, 10)
        assert [(j.job_id, j.state, j.result) for j in got] == [
            (job_id, JobState.SUCCEEDED, b'"ok"')
        ]
