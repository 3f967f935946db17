"""One refresh loop per node: every ``refresh_s`` it reads the buckets of every shard the node
dispatches, grouped into a few multi-partition reads, and hands each dispatcher its entries.

A node that owns a thousand shards would otherwise run a thousand loops, each waking every
second to read one or two partitions with a request of its own (most of an idle node's CPU,
and most of the store's requests). Here the shards whose reads cover the same minute and the
same range (at a steady state, all of them) are read together (``Store.read_buckets``), and a
dispatcher's own loop only wakes when an entry comes due, an entry is added, or its cursor may
move. What a refresh reads, and when its horizon moves, is still each dispatcher's
(``ShardDispatcher.begin_refresh`` / ``end_refresh``): the rules of invariants 2 and 4 are
unchanged. A dispatcher makes its first read itself (from its cursor, which may lie far back).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping

from timeshard.clock import Clock
from timeshard.errors import TimeshardError
from timeshard.model import BucketEntry
from timeshard.node.dispatcher import ShardDispatcher
from timeshard.store.base import Store

log = logging.getLogger(__name__)

Group = tuple[int, int, int]
"""(minute, start, horizon): shards read by one ``read_buckets``."""


class BucketRefresher:
    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        dispatchers: Mapping[int, ShardDispatcher],
        refresh_s: Callable[[], float],
        page_size: int,
    ) -> None:
        self._store = store
        self._clock = clock
        self._dispatchers = dispatchers
        self._refresh_s = refresh_s
        self._page_size = page_size

    async def run(self) -> None:
        while True:
            started = self._clock.monotonic()
            await self.refresh_all()
            spent = self._clock.monotonic() - started
            await self._clock.sleep(max(0.0, self._refresh_s() - spent))

    def _due(self) -> list[ShardDispatcher]:
        """The dispatchers this loop refreshes: running, past their own first read."""
        return [
            d
            for d in self._dispatchers.values()
            if d.refreshed_by_node and not d.deposed and d.running and not d.refreshes_itself
        ]

    async def refresh_all(self) -> None:
        """One refresh of every shard it is due for, at one ``now``."""
        dispatchers = self._due()
        if not dispatchers:
            return
        now = self._clock.now_ms()
        ranges = {d.shard: d.begin_refresh(now) for d in dispatchers}
        entries: dict[int, list[BucketEntry]] = defaultdict(list)
        failed: set[int] = set()
        done = False
        try:
            groups: dict[Group, list[ShardDispatcher]] = defaultdict(list)
            for d in dispatchers:
                start, horizon = ranges[d.shard]
                for minute in d.minutes(start, horizon):
                    groups[(minute, start, horizon)].append(d)
            await asyncio.gather(
                *(self._read(group, ds, entries, failed) for group, ds in groups.items())
            )
            done = True
        finally:  # also when cancelled: then nothing counts as read
            for d in dispatchers:
                ok = done and d.shard not in failed
                d.end_refresh(now, ranges[d.shard][1], entries.pop(d.shard, []), read=ok)

    async def _read(
        self,
        group: Group,
        dispatchers: list[ShardDispatcher],
        entries: dict[int, list[BucketEntry]],
        failed: set[int],
    ) -> None:
        minute, start, horizon = group
        shards = [d.shard for d in dispatchers]
        try:
            pages = await self._store.read_buckets(
                shards, minute, due_from=start, due_to=horizon, limit=self._page_size
            )
            for d in dispatchers:
                page = pages.get(d.shard, [])
                entries[d.shard] += page
                if len(page) >= self._page_size:  # more in this partition: page on alone
                    entries[d.shard] += await self._rest(d.shard, minute, start, horizon, page)
        except TimeshardError as exc:
            failed.update(shards)
            log.warning(
                "bucket refresh of %d shards, minute %d: %s; again in %.1fs",
                len(shards),
                minute,
                exc,
                self._refresh_s(),
            )

    async def _rest(
        self, shard: int, minute: int, start: int, horizon: int, page: list[BucketEntry]
    ) -> list[BucketEntry]:
        out: list[BucketEntry] = []
        while len(page) >= self._page_size:
            after = (page[-1].due_at, page[-1].job_id)
            page = await self._store.read_bucket(
                shard, minute, due_from=start, due_to=horizon, after=after, limit=self._page_size
            )
            out += page
        return out
