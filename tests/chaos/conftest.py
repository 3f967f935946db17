"""Chaos tier: three ``timeshard server`` processes on a 3-server ZooKeeper ensemble and one
Cassandra, with workers, while nodes are killed, paused and ZooKeeper servers restarted.

The ensemble and Cassandra start once per session (or Cassandra comes from
``TIMESHARD_CASSANDRA=host:port``); each test gets a fresh znode path and keyspace.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.fleet import Fleet
from tests.services import cassandra_node, zookeeper_ensemble
from timeshard.stack import ZooKeeperEnsemble

SESSION_TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    zk = zookeeper_ensemble(3, tmp_path_factory.mktemp("zk-ensemble"))
    try:
        yield zk
    finally:
        zk.stop()


@pytest.fixture(scope="session")
def cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("TIMESHARD_CASSANDRA")
    if given:
        yield given
        return
    node = cassandra_node(tmp_path_factory.mktemp("cassandra"))
    try:
        yield node.address
    finally:
        node.stop()


@pytest.fixture
def fleet(tmp_path: Path, ensemble: ZooKeeperEnsemble, cassandra: str) -> Iterator[Fleet]:
    keyspace = f"chaos_{uuid.uuid4().hex[:12]}"
    store = f"cassandra://{cassandra}/{keyspace}"
    shards = 16
    _create_schema(store, shards)
    zookeeper = (
        f"zookeeper://{ensemble.hosts}/timeshard-chaos/{uuid.uuid4().hex[:12]}"
        f"?session_timeout={SESSION_TIMEOUT_S}"
    )
    f = Fleet(tmp_path, zookeeper=zookeeper, store=store, shards=shards)
    try:
        yield f
    finally:
        f.stop_all()
        _drop_keyspace(cassandra, keyspace)


def _create_schema(store_url: str, shards: int) -> None:
    """Create the keyspace once, before three nodes race to do it."""
    from timeshard.store.cassandra import CassandraStore

    async def create() -> None:
        store = CassandraStore.from_url(store_url, num_shards=shards)
        await store.open()
        await store.close()

    asyncio.run(create())


def _drop_keyspace(address: str, keyspace: str) -> None:
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy

    host, port = address.rsplit(":", 1)
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=60)
    cluster = Cluster(
        contact_points=[(host, int(port))],
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        protocol_version=5,
    )
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    finally:
        cluster.shutdown()
