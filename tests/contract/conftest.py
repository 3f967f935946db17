"""One suite, every store: each test here runs against ``sqlite`` and ``cassandra``.

Cassandra: ``$TIMESHARD_CASSANDRA`` (host:port, or several for a cluster:
``127.0.0.1:9042,127.0.0.2:9042,127.0.0.3:9042``) if set, else one node started for the whole
session with ``timeshard.stack`` on free ports. ``$TIMESHARD_CASSANDRA_OPTIONS`` is added to each
store URL as its query, e.g. ``rf=3&consistency=quorum&serial=serial`` on a 3-node cluster
(``make test-cluster``). Each test gets a fresh keyspace, dropped afterwards. A Cassandra that
can not start makes the tests error, never skip.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from timeshard.store.base import Store

OpenStore = Callable[..., AbstractAsyncContextManager[Store]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def url_options() -> str:
    """``?rf=3&...`` from ``$TIMESHARD_CASSANDRA_OPTIONS``, or nothing."""
    options = os.environ.get("TIMESHARD_CASSANDRA_OPTIONS", "").lstrip("?")
    return f"?{options}" if options else ""


@pytest.fixture(scope="session")
def cassandra_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a Cassandra node (or host:port,host:port,... of a cluster) for this
    session."""
    given = os.environ.get("TIMESHARD_CASSANDRA")
    if given:
        yield given
        return
    from timeshard.stack import CassandraProcess

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


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("cassandra", marks=[pytest.mark.integration, pytest.mark.timeout(300)]),
    ]
)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """``async with open_store(num_shards=8, name="a") as store``: an open store on fresh
    storage; the same ``name`` within a test opens the same storage again."""
    backend: str = request.param
    keyspaces: dict[str, str] = {}
    address = request.getfixturevalue("cassandra_address") if backend == "cassandra" else ""
    admin = request.getfixturevalue("cassandra_admin") if backend == "cassandra" else None

    @asynccontextmanager
    async def opener(*, num_shards: int = 8, name: str = "a") -> AsyncIterator[Store]:
        store: Store
        if backend == "sqlite":
            from timeshard.store.sqlite import SqliteStore

            store = SqliteStore(tmp_path / f"{name}.db", num_shards=num_shards)
        else:
            from timeshard.store.cassandra import CassandraStore

            keyspace = keyspaces.setdefault(name, f"contract_{uuid.uuid4().hex[:16]}")
            store = CassandraStore.from_url(
                f"cassandra://{address}/{keyspace}{url_options()}", num_shards=num_shards
            )
        await store.open()
        try:
            yield store
        finally:
            await store.close()

    yield opener
    if admin is not None:
        for keyspace in keyspaces.values():
            admin.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
