"""Build stores and coordinators from URLs given on the command line."""

from __future__ import annotations

from timeshard.coordinator.base import Coordinator
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import InvalidArgument, needs_extra, redact_url
from timeshard.sharding import DEFAULT_NUM_SHARDS
from timeshard.store.base import Retention, Store


def make_store(
    url: str, *, num_shards: int = DEFAULT_NUM_SHARDS, retention: Retention | None = None
) -> Store:
    """``sqlite:///path/to/file.db`` (the embedded default) or
    ``cassandra://HOST:PORT[,HOST:PORT...]/KEYSPACE``."""
    if url.startswith("sqlite://"):
        from timeshard.store.sqlite import SqliteStore

        return SqliteStore.from_url(url, num_shards=num_shards, retention=retention)
    if url.startswith("cassandra://"):
        with needs_extra("the cassandra:// store"):
            from timeshard.store.cassandra import CassandraStore

        store: Store = CassandraStore.from_url(url, num_shards=num_shards, retention=retention)
        return store
    raise InvalidArgument(
        "store", f"{redact_url(url)!r}: use sqlite:///PATH or cassandra://HOST:PORT/KEYSPACE"
    )


def make_coordinator(url: str) -> Coordinator:
    """``local`` (one process owns every shard) or ``zookeeper://HOST:PORT[,...]/PATH``."""
    if url in ("", "local", "local://"):
        return LocalCoordinator()
    if url.startswith("zookeeper://"):
        with needs_extra("the zookeeper:// coordinator"):
            from timeshard.coordinator.zookeeper import ZooKeeperCoordinator

        coordinator: Coordinator = ZooKeeperCoordinator.from_url(url)
        return coordinator
    raise InvalidArgument(
        "coordinator", f"{redact_url(url)!r}: use local or zookeeper://HOST:PORT/PATH"
    )
