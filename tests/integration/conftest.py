"""Integration tier: real ZooKeeper (and Cassandra where a test needs it), started once per
session on free ports with ``timeshard.stack``, or reused from ``TIMESHARD_ZOOKEEPER`` /
``TIMESHARD_CASSANDRA`` (the session's Cassandra is ``cassandra_address`` in
``tests/conftest.py``). Each test gets a fresh znode path or keyspace."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from timeshard.stack import CassandraProcess
from timeshard.testing.services import free_port, zookeeper_ensemble


@pytest.fixture(scope="session")
def zookeeper_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a ZooKeeper for this session (tick 500 ms: 1-10 s sessions)."""
    given = os.environ.get("TIMESHARD_ZOOKEEPER")
    if given:
        yield given
        return
    ensemble = zookeeper_ensemble(1, tmp_path_factory.mktemp("zookeeper"))
    try:
        yield ensemble.hosts
    finally:
        ensemble.stop()


@pytest.fixture
def zk_path() -> str:
    """A fresh cluster root per test."""
    return f"/timeshard-test/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def keyspace(cassandra_admin: Any) -> Iterator[str]:
    """A fresh keyspace name on the session's Cassandra, dropped after the test."""
    name = f"it_{uuid.uuid4().hex[:16]}"
    yield name
    cassandra_admin.execute(f"DROP KEYSPACE IF EXISTS {name}")


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[CassandraProcess]:
    """A Cassandra of this test's own, to kill and start again (the shared one is not
    disturbed)."""
    node = CassandraProcess(
        port=free_port(),
        storage_port=free_port(),
        run_dir=tmp_path / "cassandra",
        cluster_name="timeshard-crash",
    )
    node.start(timeout=240)
    try:
        yield node
    finally:
        node.stop()
