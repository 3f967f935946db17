"""Shard ownership (invariant 7): taking a shard moves its epoch with a conditional write, and
a deposed owner's cursor writes change nothing."""

from __future__ import annotations

import asyncio

from tests.contract.conftest import OpenStore
from timeshard.model import ShardState


async def test_a_shard_never_taken_has_epoch_and_cursor_zero(open_store: OpenStore) -> None:
    async with open_store() as store:
        assert await store.get_shard(5) == ShardState(shard=5, epoch=0, owner="", cursor=0)


async def test_first_acquire_creates_the_shard_with_its_cursor(open_store: OpenStore) -> None:
    async with open_store() as store:
        ok, state = await store.acquire_shard(2, "node-a", 0, 1_000)
        assert ok and state == ShardState(shard=2, epoch=1, owner="node-a", cursor=1_000)
        assert await store.get_shard(2) == state


async def test_acquire_with_a_stale_epoch_is_rejected(open_store: OpenStore) -> None:
    async with open_store() as store:
        _, first = await store.acquire_shard(2, "node-a", 0, 1_000)
        for stale in (0, 2, 7):
            ok, found = await store.acquire_shard(2, "node-b", stale, 5)
            assert not ok and found == first
        assert await store.get_shard(2) == first
        ok, missing = await store.acquire_shard(6, "node-b", 3, 5)  # never taken: epoch is 0
        assert not ok and missing == ShardState(shard=6)
        assert await store.get_shard(6) == ShardState(shard=6)


async def test_takeover_bumps_the_epoch_and_keeps_the_cursor(open_store: OpenStore) -> None:
    async with open_store() as store:
        await store.acquire_shard(1, "node-a", 0, 100)
        assert await store.save_cursor(1, 1, 140)
        ok, state = await store.acquire_shard(1, "node-b", 1, 999)
        assert ok and state == ShardState(shard=1, epoch=2, owner="node-b", cursor=140)
        assert await store.get_shard(1) == state


async def test_two_acquirers_with_one_expected_epoch_have_one_winner(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        for shard in range(1, 8, 2):  # odd shards are already owned, even ones never taken
            await store.acquire_shard(shard, "first", 0, 10)
        for shard in range(8):
            expect = 1 if shard % 2 else 0
            results = await asyncio.gather(
                *(store.acquire_shard(shard, f"n{i}", expect, 20) for i in range(4))
            )
            winners = [state for ok, state in results if ok]
            assert len(winners) == 1, f"shard {shard}: {results}"
            stored = await store.get_shard(shard)
            assert stored == winners[0] and stored.epoch == expect + 1
            assert all(state == stored for ok, state in results if not ok)


async def test_cursor_saves_only_for_the_current_epoch(open_store: OpenStore) -> None:
    async with open_store() as store:
        assert not await store.save_cursor(4, 0, 50)  # never taken
        assert await store.get_shard(4) == ShardState(shard=4)
        await store.acquire_shard(4, "old", 0, 100)
        assert await store.save_cursor(4, 1, 110)
        await store.acquire_shard(4, "new", 1, 0)
        assert not await store.save_cursor(4, 1, 500)  # the deposed owner
        assert await store.get_shard(4) == ShardState(shard=4, epoch=2, owner="new", cursor=110)
        assert await store.save_cursor(4, 2, 120)
        assert (await store.get_shard(4)).cursor == 120
