"""What the job-row modules share: limits, the partition key, batching and small helpers."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from timeshard.model import BucketEntry, Job
from timeshard.store.codec import job_columns

CAS_ROUNDS = 20
"""Conditional writes (a single row or a batch) retried on rows that changed but still meet
their conditions."""
ROWS_PER_BATCH = 100
"""Rows in one conditional batch (Cassandra's batch size limit must allow it; see deploy/)."""
BYTES_PER_BATCH = 256 * 1024
CACHE_SIZE = 200_000

Key = tuple[int, int]  # (shard, home minute)


class Lru(OrderedDict[str, Any]):
    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > CACHE_SIZE:
            self.popitem(last=False)


def row_params(job: Job, key: Key) -> dict[str, Any]:
    cols = job_columns(job)
    cols.pop("shard")
    return {**cols, "shard": key[0], "minute": key[1]}


def homed(e: BucketEntry, home: int) -> BucketEntry:
    return BucketEntry(shard=e.shard, minute=e.minute, due_at=e.due_at, job_id=e.job_id, home=home)


def sized(items: list[Any], weights: list[int]) -> Iterable[list[Any]]:
    """``items`` in chunks of at most ``ROWS_PER_BATCH`` and about ``BYTES_PER_BATCH``."""
    chunk: list[Any] = []
    size = 0
    for item, weight in zip(items, weights, strict=True):
        if chunk and (len(chunk) >= ROWS_PER_BATCH or size + weight > BYTES_PER_BATCH):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += weight
    if chunk:
        yield chunk


def chunks(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


async def gather(aws: Any) -> list[Any]:
    """Run concurrently and wait for all; then raise the first error, if any (so no write of
    this call is still in flight when it fails)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)


async def gather_bounded(aws: Iterable[Any], limit: int) -> list[Any]:
    """``gather`` with at most ``limit`` of them in flight at once."""
    gate = asyncio.Semaphore(limit)

    async def one(aw: Any) -> Any:
        async with gate:
            return await aw

    return await gather(one(aw) for aw in aws)
