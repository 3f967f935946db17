"""Stable placement of jobs on shards and of times in minute buckets."""

from __future__ import annotations

import zlib

MINUTE_MS = 60_000
DEFAULT_NUM_SHARDS = 128


def validate_num_shards(num_shards: int) -> int:
    if num_shards < 1 or num_shards & (num_shards - 1):
        raise ValueError(f"num_shards must be a power of two, got {num_shards}")
    return num_shards


def shard_of(job_id: str, num_shards: int) -> int:
    """The shard of a job: CRC-32 of its id, modulo the shard count.

    CRC-32 is stable across processes, platforms and Python versions (unlike ``hash()``),
    and with a power-of-two shard count, shard ``s`` of ``N`` splits into ``s`` and ``s + N``.
    """
    return zlib.crc32(job_id.encode("utf-8")) % num_shards


def minute_of(ms: int) -> int:
    """The bucket (minute number since the epoch) that holds a time."""
    return ms // MINUTE_MS


def minute_start(minute: int) -> int:
    return minute * MINUTE_MS
