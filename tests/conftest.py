"""Shared test plumbing: ``async def`` tests run on a fresh event loop (no plugin needed), and
the session's Cassandra, shared by the contract, integration and chaos tiers.

Cassandra: ``$TIMESHARD_CASSANDRA`` (host:port, or several for a cluster:
``127.0.0.1:9042,127.0.0.2:9042,127.0.0.3:9042``) if set, else one node started for the whole
session with ``timeshard.stack`` on free ports, only when a test asks for it."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {n: pyfuncitem.funcargs[n] for n in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
        if "/acceptance/" in str(item.fspath):
            item.add_marker(pytest.mark.acceptance)


@pytest.fixture(scope="session")
def cassandra_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a Cassandra node (or host:port,host:port,... of a cluster) for this
    session."""
    given = os.environ.get("TIMESHARD_CASSANDRA")
    if given:
        yield given
        return
    from timeshard.stack import CassandraProcess
    from timeshard.testing.services import free_port

    node = CassandraProcess(
        port=free_port(),
        storage_port=free_port(),
        run_dir=tmp_path_factory.mktemp("cassandra"),
        cluster_name="timeshard-contract",
        unsafe_system=True,  # quick keyspaces; this node is only ever stopped cleanly
    )
    node.start(timeout=240)
    try:
        yield node.address
    finally:
        node.stop()


@pytest.fixture(scope="session")
def cassandra_admin(cassandra_address: str) -> Iterator[Any]:
    """A plain driver session for test set-up and clean-up (dropping keyspaces)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy

    points = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in cassandra_address.split(","))]
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=60)
    cluster = Cluster(
        contact_points=points,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        protocol_version=5,
    )
    session = cluster.connect()
    try:
        yield session
    finally:
        cluster.shutdown()
