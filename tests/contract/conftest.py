"""One suite, every store: each test here runs against ``sqlite`` and ``cassandra``.

Cassandra is the session's (``cassandra_address`` in ``tests/conftest.py``).
``$TIMESHARD_CASSANDRA_OPTIONS`` is added to each store URL as its query, e.g.
``rf=3&consistency=quorum&serial=serial`` on a 3-node cluster (``make test-cluster``). Each test
gets a fresh keyspace, dropped afterwards. A Cassandra that can not start makes the tests error,
never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from timeshard.store.base import Store

OpenStore = Callable[..., AbstractAsyncContextManager[Store]]


def url_options() -> str:
    """``?rf=3&...`` from ``$TIMESHARD_CASSANDRA_OPTIONS``, or nothing."""
    options = os.environ.get("TIMESHARD_CASSANDRA_OPTIONS", "").lstrip("?")
    return f"?{options}" if options else ""


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
