"""A deleted schedule's history on the real Cassandra, on the fake clock: kept for the ledger
retention (history and `why` answer), then purged by the entry its delete wrote, the row and
its revisions gone from the table; a schedule created again on the id is not purged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.unit.helpers import START_MS
from tests.unit.test_schedule_purge import KEEP_S, answers_then_purged, created_again_stays
from timeshard.clock import FakeClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import Node
from timeshard.store.base import Retention
from timeshard.store.cassandra import CassandraStore

pytestmark = pytest.mark.timeout(300)


@asynccontextmanager
async def kept_for(url: str) -> AsyncIterator[tuple[Node, FakeClock]]:
    clock = FakeClock(START_MS)
    store = CassandraStore.from_url(
        url, num_shards=4, clock=clock, retention=Retention(ledger_s=KEEP_S)
    )
    node = Node(store=store, coordinator=LocalCoordinator(), clock=clock, node_id="n")
    await node.start()
    try:
        yield node, clock
    finally:
        await node.stop()


def row_of(admin: Any, keyspace: str) -> Any:
    query = f"SELECT deleted, revisions FROM {keyspace}.schedules WHERE schedule_id = 's1'"
    return admin.execute(query).one()


async def test_a_deleted_schedule_is_purged_after_the_ledger_retention(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    async with kept_for(f"cassandra://{cassandra_address}/{keyspace}") as (node, clock):
        await answers_then_purged(node, clock)
        await node.schedules.delete("s1")  # (the test made it again at its end)
        assert row_of(cassandra_admin, keyspace).deleted
        assert await node.store.purge_schedule("s1", deleted_before=clock.now_ms()) == 0
        assert row_of(cassandra_admin, keyspace) is None


async def test_a_schedule_created_again_is_not_purged(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    async with kept_for(f"cassandra://{cassandra_address}/{keyspace}") as (node, clock):
        await created_again_stays(node, clock)
        stored = row_of(cassandra_admin, keyspace)
        assert not stored.deleted and sorted(stored.revisions) == [1, 2, 3]
