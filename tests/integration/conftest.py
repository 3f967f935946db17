"""Integration tier: real ZooKeeper (and Cassandra where a test needs it), started once per
session on free ports with ``timeshard.stack``, or reused from ``TIMESHARD_ZOOKEEPER`` /
``TIMESHARD_CASSANDRA``. Each test gets a fresh znode path or keyspace."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from timeshard.testing.services import zookeeper_ensemble


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
