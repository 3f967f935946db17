"""Chaos tier: three ``timeshard server`` processes on a 3-server ZooKeeper ensemble and one
Cassandra, with workers, while nodes are killed, paused and ZooKeeper servers restarted.

The ensemble and Cassandra start once per session (or Cassandra comes from
``TIMESHARD_CASSANDRA=host:port``); each test gets a fresh znode path and keyspace.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from timeshard.stack import ZooKeeperEnsemble
from timeshard.testing.fleet import Fleet
from timeshard.testing.services import (
    cassandra_node,
    create_keyspace,
    drop_keyspace,
    zookeeper_ensemble,
)

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
    create_keyspace(store, shards)
    zookeeper = (
        f"zookeeper://{ensemble.hosts}/timeshard-chaos/{uuid.uuid4().hex[:12]}"
        f"?session_timeout={SESSION_TIMEOUT_S}"
    )
    f = Fleet(tmp_path, zookeeper=zookeeper, store=store, shards=shards)
    try:
        yield f
    finally:
        f.stop_all()
        drop_keyspace(cassandra, keyspace)
