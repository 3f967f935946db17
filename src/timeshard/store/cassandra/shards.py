"""The shards' ownership rows on Cassandra: who owns each shard, at which epoch, and its cursor
(``Store.get_shard``, ``acquire_shard``, ``save_cursor``), each a lightweight transaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from timeshard.errors import StoreUnavailable
from timeshard.model import ShardState
from timeshard.store.cassandra.driver import Ambiguous, Connection
from timeshard.store.cassandra.parts import CAS_ROUNDS
from timeshard.store.cassandra.rows import to_shard_state


class ShardRows:
    """``took(shard, epoch)`` is told of each shard this store took (its job writes are
    fenced by that epoch)."""

    def __init__(self, conn: Connection, took: Callable[[int, int], None]) -> None:
        self._conn = conn
        self._took = took

    async def get(self, shard: int, *, serial: bool = False) -> ShardState:
        rows = await self._conn.rows("select_shard", (shard,), serial=serial)
        return to_shard_state(shard, rows[0]) if rows else ShardState(shard=shard)

    async def acquire(
        self, shard: int, owner: str, expect_epoch: int, initial_cursor: int
    ) -> tuple[bool, ShardState]:
        taken = ShardState(shard=shard, epoch=expect_epoch + 1, owner=owner)
        if expect_epoch == 0:
            try:
                row = await self._conn.one("create_shard", (shard, owner, initial_cursor))
            except Ambiguous:
                current = await self.get(shard, serial=True)
                won = replace(taken, cursor=initial_cursor) == current
                if won:
                    self._took(shard, 1)
                return won, current
            if row["[applied]"]:
                self._took(shard, 1)
                return True, replace(taken, cursor=initial_cursor)
            return False, to_shard_state(shard, row)
        current = await self.get(shard)
        for _ in range(CAS_ROUNDS):
            if current.epoch != expect_epoch:
                return False, current
            params = (expect_epoch + 1, owner, shard, current.epoch, current.owner, current.cursor)
            try:
                row = await self._conn.one("bump_epoch", params)
            except Ambiguous:
                settled = await self.get(shard, serial=True)
                if settled == replace(taken, cursor=current.cursor):
                    self._took(shard, taken.epoch)
                    return True, settled
                current = settled
                continue
            if row["[applied]"]:
                self._took(shard, taken.epoch)
                return True, replace(taken, cursor=current.cursor)
            current = to_shard_state(shard, row)
        raise StoreUnavailable(f"shard {shard} kept changing during {CAS_ROUNDS} attempts")

    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("save_cursor", (cursor, shard, epoch))
            except Ambiguous:
                settled = await self.get(shard, serial=True)
                if settled.epoch != epoch:
                    return False
                if settled.cursor == cursor:
                    return True
                continue  # still ours and not written: write again
            return bool(row["[applied]"])
        raise StoreUnavailable(f"shard {shard}: cursor write kept timing out")
