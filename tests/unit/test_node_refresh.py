"""One refresh loop per node: a node owning many idle shards reads their buckets together (a
few multi-partition reads per refresh, not one request per shard), its dispatchers' loops
sleep while nothing is due, and every idle shard's cursor still moves on each minute."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.unit.helpers import START_MS, FixedCoordinator, advance
from timeshard.clock import FakeClock
from timeshard.model import BucketEntry
from timeshard.node import Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig, ShardDispatcher
from timeshard.sharding import minute_of
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until

SHARDS = 64


class CountedReads(SqliteStore):
    """Counts multi-partition read requests (one per ``read_buckets`` call)."""

    def __init__(self) -> None:
        super().__init__(":memory:", num_shards=SHARDS)
        self.requests = 0

    async def read_buckets(
        self, shards: Sequence[int], minute: int, **kw: Any
    ) -> dict[int, list[BucketEntry]]:
        self.requests += 1
        return await super().read_buckets(shards, minute, **kw)


def cluster_node(store: SqliteStore, clock: FakeClock, *, node_refresh: bool = True) -> Node:
    """A node that re-reads as a node of a cluster does, owning every shard."""
    dispatch = DispatchConfig(lookahead_s=5, refresh_s=1, reread_s=5, node_refresh=node_refresh)
    return Node(
        store=store,
        coordinator=FixedCoordinator(range(SHARDS)),
        clock=clock,
        config=NodeConfig(dispatch=dispatch),
        node_id="n",
    )


@pytest.mark.parametrize("node_refresh", [True, False])
async def test_idle_shards_are_read_together_and_their_loops_sleep(
    monkeypatch: pytest.MonkeyPatch, node_refresh: bool
) -> None:
    steps = 0
    step = ShardDispatcher._step

    async def counted(self: ShardDispatcher) -> None:
        nonlocal steps
        steps += 1
        await step(self)

    monkeypatch.setattr(ShardDispatcher, "_step", counted)
    clock = FakeClock(START_MS + 10_000)  # no minute boundary in the next 20 s
    store = CountedReads()
    node = cluster_node(store, clock, node_refresh=node_refresh)
    await node.start()
    try:
        await advance(node, clock, 2)
        await wait_until(  # every dispatcher made its first read (from its cursor) itself
            lambda: (
                len(node.dispatchers) == SHARDS
                and not (
                    node_refresh and any(d.refreshes_itself for d in node.dispatchers.values())
                )
            ),
            what="every dispatcher's first read",
        )
        await advance(node, clock, 1)  # and any step that first read started is over
        steps, store.requests = 0, 0
        await advance(node, clock, 10)
        if node_refresh:
            # About one request per refresh for all 64 shards, and no dispatcher step at all
            # (nothing came due, nothing was added, no minute ended).
            assert store.requests <= 12, f"{store.requests} read requests in 10 refreshes"
            assert steps == 0, f"{steps} dispatcher steps with nothing due"
        else:  # what a loop per shard costs: each wakes and reads every refresh
            assert steps >= SHARDS * 9
    finally:
        await node.stop()


async def test_every_idle_shards_cursor_moves_on_each_minute() -> None:
    clock = FakeClock(START_MS)
    store = CountedReads()
    node = cluster_node(store, clock)
    await node.start()
    try:
        await advance(node, clock, 3 * 60 + 10, step=1)
        cursors = [(await store.get_shard(s)).cursor for s in range(SHARDS)]
        # The minute that ended 10 s ago is past its settle time: every cursor is beyond it.
        assert min(cursors) == minute_of(clock.now_ms()), cursors
    finally:
        await node.stop()
