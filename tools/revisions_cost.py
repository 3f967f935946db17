"""What schedule revisions cost on each store: a person's change (which writes its revision in
the same conditional write) beside a fire's update (which writes none), and the read a fire
makes of a schedule that keeps 100 revisions of a large payload beside one that keeps one.

    python tools/revisions_cost.py [--changes 200] [--cassandra 127.0.0.1:9042] [--json]

On a fresh embedded store and, with ``--cassandra``, a fresh keyspace (dropped at the end):
``--changes`` pause/resume changes of one schedule (past 100, each also drops the oldest
revision, in the same batch on Cassandra), as many fire-path updates, and 200 reads (as a fire
reads) of each of two schedules with a 256 KiB payload: one created once (1 revision), one
changed 110 times (100 revisions kept, about 34 MiB of revisions as JSON); then 20 reads of
that one's whole history, of the first and of the last page of it (5 revisions, as many of that
payload as fit a 4 MiB reply, and one more: what a ListScheduleRevisions page reads), and of one
revision (what GetScheduleRevision reads). Median and p99 milliseconds on stdout; ``--json``
prints them as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from timeshard.limits import MAX_PAYLOAD_BYTES, REVISIONS_KEPT
from timeshard.model import Change, ChangeKind, Schedule
from timeshard.sharding import shard_of
from timeshard.store.base import Store, schedule_entry
from timeshard.store.sqlite import SqliteStore

NUM_SHARDS = 128
NOW = 1_800_000_000_000
READS = 200
PAGE = 5
"""Revisions of a page of history measured: as many of a 256 KiB payload as fit a 4 MiB reply."""


def schedule(sid: str, payload: bytes) -> Schedule:
    return Schedule(
        schedule_id=sid,
        shard=shard_of(sid, NUM_SHARDS),
        cron="0 2 * * *",
        timezone="Europe/Berlin",
        job_type="bench.revisions",
        payload=payload,
        next_fire=NOW + 3_600_000,
        created_at=NOW,
        revision=1,
    )


async def timed(n: int, step: Callable[[int], Awaitable[object]]) -> dict[str, float]:
    took = []
    for i in range(n):
        started = time.perf_counter()
        await step(i)
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return {"median_ms": statistics.median(took), "p99_ms": took[int(len(took) * 0.99) - 1]}


async def measure(store: Store, changes: int) -> dict[str, dict[str, float]]:
    s = schedule("changed", b"{}")
    await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
    state = {"s": s}

    async def change(i: int) -> None:
        cur = state["s"]
        new = cur.with_(paused=i % 2 == 0, revision=cur.revision + 1)
        ok, after = await store.update_schedule(
            new, cur.version, None, Change(kind=ChangeKind.PAUSE, at_ms=NOW + i)
        )
        assert ok and after is not None
        state["s"] = after

    async def fire(i: int) -> None:
        cur = state["s"]
        ok, after = await store.update_schedule(cur.with_(last_fire_at=NOW + i), cur.version, None)
        assert ok and after is not None
        state["s"] = after

    out = {"change": await timed(changes, change), "fire_update": await timed(changes, fire)}
    big_payload = b"x" * MAX_PAYLOAD_BYTES
    one, big = schedule("big-once", big_payload), schedule("big", big_payload)
    for made in (one, big):
        await store.create_schedule(made, schedule_entry(made, made.next_fire, NOW))
    cur = big
    for n in range(REVISIONS_KEPT + 10):
        new = cur.with_(paused=n % 2 == 0, revision=cur.revision + 1)
        ok, after = await store.update_schedule(
            new, cur.version, None, Change(kind=ChangeKind.PAUSE, at_ms=NOW)
        )
        assert ok and after is not None
        cur = after
    assert len(await store.schedule_revisions("big")) == REVISIONS_KEPT
    out["fire_read_1_revision"] = await timed(READS, lambda _: store.get_schedule("big-once"))
    out["fire_read_100_revisions"] = await timed(READS, lambda _: store.get_schedule("big"))
    out["history_read_100_revisions"] = await timed(20, lambda _: store.schedule_revisions("big"))
    newest = REVISIONS_KEPT + 11
    page = PAGE + 1  # (ListScheduleRevisions reads one more, to know whether more follow)
    out["history_first_page"] = await timed(
        20, lambda _: store.schedule_revisions("big", limit=page)
    )
    out["history_last_page"] = await timed(
        20,
        lambda _: store.schedule_revisions("big", below=newest - REVISIONS_KEPT + PAGE, limit=page),
    )
    out["one_revision"] = await timed(20, lambda _: store.schedule_revision("big", newest - 50))
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteStore(Path(tmp) / "bench.db", num_shards=NUM_SHARDS)
        await sqlite.open()
        try:
            figures["sqlite"] = await measure(sqlite, args.changes)
        finally:
            await sqlite.close()
    if args.cassandra:
        from timeshard.store.cassandra import CassandraStore
        from timeshard.testing.services import drop_keyspace

        keyspace = f"bench_rev_{uuid.uuid4().hex[:12]}"
        store = CassandraStore.from_url(
            f"cassandra://{args.cassandra}/{keyspace}", num_shards=NUM_SHARDS
        )
        await store.open()
        try:
            figures["cassandra"] = await measure(store, args.changes)
        finally:
            await store.close()
            drop_keyspace(args.cassandra, keyspace)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=200, help="changes (and fires) timed")
    parser.add_argument("--cassandra", default="", help="host:port of a Cassandra to measure too")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    for store, rows in figures.items():
        for what, f in rows.items():
            print(f"{store:9} {what:28} median {f['median_ms']:8.2f} ms  p99 {f['p99_ms']:8.2f} ms")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
