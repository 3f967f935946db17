"""A node takes the shards it gains together, at most ``TAKE_CONCURRENCY`` at a time, and names
the ones it could not take (``ShardsNotTaken``) while it dispatches the others: the ZooKeeper
coordinator gives back only those (tests/integration/test_zookeeper_coordinator.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.unit.helpers import FixedCoordinator
from timeshard.clock import FakeClock
from timeshard.coordinator.base import ShardsNotTaken
from timeshard.errors import StoreUnavailable
from timeshard.node import Node, core
from timeshard.store.sqlite import SqliteStore


class Takes:
    """Wraps a store's ``acquire_shard``: counts the takes in flight, fails ``failing``."""

    def __init__(self, store: SqliteStore, failing: set[int]) -> None:
        self.in_flight = 0
        self.most = 0
        self._failing = failing
        self._acquire = store.acquire_shard
        store.acquire_shard = self.acquire  # type: ignore[method-assign]

    async def acquire(self, shard: int, *args: Any) -> Any:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            if shard in self._failing:
                raise StoreUnavailable(f"down while taking shard {shard}")
            return await self._acquire(shard, *args)
        finally:
            self.in_flight -= 1


async def test_shards_gained_are_taken_together_and_only_the_failed_ones_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "TAKE_CONCURRENCY", 3)
    store = SqliteStore(":memory:", num_shards=16)
    node = Node(store=store, coordinator=FixedCoordinator([]), clock=FakeClock(), node_id="n")
    await node.start()
    try:
        takes = Takes(store, failing={2, 9})
        with pytest.raises(ShardsNotTaken) as raised:
            await node._shards_changed(frozenset(range(10)), frozenset())
        assert set(raised.value.failed) == {2, 9}
        assert "down while taking shard 2" in str(raised.value)
        assert set(node.dispatchers) == set(range(10)) - {2, 9}
        assert takes.most == 3  # together, within the bound
    finally:
        await node.stop()
