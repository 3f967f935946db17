"""Invariant 7 with the real coordinator and the real store, in one process: a node whose
ZooKeeper session expired while it was not listening (a long GC pause, a frozen thread) still
believes it owns its shards; another node takes them; every cursor write of the deposed owner is
refused by the epoch and its dispatchers stop.

The chaos tests pause a whole process with SIGSTOP, but there kazoo usually notices the expired
session before the dispatcher writes; here the deposed node is kept deaf on purpose, so the
store's fence is the only thing that stops it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.zookeeper import ZooKeeperCoordinator
from timeshard.node import Node
from timeshard.sharding import minute_of
from timeshard.stack import ZooKeeperEnsemble
from timeshard.store.cassandra import CassandraStore
from timeshard.testing.services import TcpProxy, create_keyspace, drop_keyspace
from timeshard.testing.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60, func_only=True)]
SHARDS = 4


class ShiftedClock(SystemClock):
    """The system clock plus ``offset_ms`` (moved on to make a minute pass at once)."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return super().now_ms() + self.offset_ms


@pytest.fixture
def store_url(cassandra: str) -> Any:
    keyspace = f"fencing_{uuid.uuid4().hex[:12]}"
    url = f"cassandra://{cassandra}/{keyspace}"
    create_keyspace(url, SHARDS)
    yield url
    drop_keyspace(cassandra, keyspace)


def node(name: str, zk: str, store_url: str, clock: SystemClock) -> Node:
    return Node(
        store=CassandraStore.from_url(store_url, num_shards=SHARDS),
        coordinator=ZooKeeperCoordinator.from_url(zk),
        clock=clock,
        node_id=name,
        address=f"addr-{name}",
    )


async def test_a_deposed_owner_that_did_not_notice_can_change_nothing(
    ensemble: ZooKeeperEnsemble, store_url: str
) -> None:
    first = ensemble.servers[0]
    proxy = TcpProxy((first.host, first.client_port))
    path = f"/timeshard-fencing/{uuid.uuid4().hex[:12]}"
    clock_a = ShiftedClock()
    a = node("a", f"zookeeper://{proxy.address}{path}?session_timeout=2", store_url, clock_a)
    b = node("b", f"zookeeper://{ensemble.hosts}{path}?session_timeout=2", store_url, SystemClock())
    try:
        await a.start()
        await wait_until(lambda: len(a.dispatchers) == SHARDS, 10, "a to dispatch every shard")
        taken = {s: await a.store.get_shard(s) for s in range(SHARDS)}
        assert all(st.owner == "a" for st in taken.values())

        # a goes deaf: its coordinator stops (as if its thread froze) and its connection to
        # ZooKeeper carries nothing, so its session expires unnoticed.
        coord = a.coordinator
        assert isinstance(coord, ZooKeeperCoordinator)
        assert coord._client is not None and coord._task is not None
        coord._client.remove_listener(coord._state_listener)
        coord._task.cancel()
        await asyncio.gather(coord._task, return_exceptions=True)
        coord._task = None
        proxy.block()

        await b.start()
        await wait_until(lambda: len(b.dispatchers) == SHARDS, 15, "b to take every shard")
        for s in range(SHARDS):
            now = await b.store.get_shard(s)
            assert now.owner == "b" and now.epoch > taken[s].epoch
        assert len(a.dispatchers) == SHARDS, "a must still believe it owns its shards"

        # A minute passes on a's clock: its dispatchers try to move their cursors on, under
        # their old epoch, and the store refuses each write.
        cursors = {s: (await b.store.get_shard(s)).cursor for s in range(SHARDS)}
        clock_a.offset_ms = 3 * 60_000
        await wait_until(
            lambda: all(d.deposed for d in a.dispatchers.values()),
            10,
            "every dispatcher of a to be deposed by the store",
        )
        real_minute = minute_of(SystemClock().now_ms())
        for s in range(SHARDS):
            now = await b.store.get_shard(s)
            assert now.owner == "b"
            # a wanted its cursor a minute or two past the real time; b's is behind it.
            assert cursors[s] <= now.cursor <= real_minute, f"shard {s}: a moved the cursor"
    finally:
        proxy.unblock()
        await b.stop()
        await a.stop()
        proxy.close()
