"""What a listing of jobs costs on each store, as the jobs stored grow.

    python tools/listing_cost.py [--jobs 20000] [--cassandra 127.0.0.1:9042] [--json]

Stores ``--jobs`` jobs (four types, due over a day, every other one with an idempotency key,
one in 500 dead)
in a fresh embedded store and, with ``--cassandra``, a fresh keyspace (dropped at the end),
then times through ``Store.find_jobs``, a page of 50 each, counted as ListJobs counts:
the first page by due time; the first page of one type in one state; the first page of the
dead letters; by id, uncounted (as the node's own listings page); the dead-letter count the
status page shows (``Store.dead_letters``); one idempotency key (a lookup); and the writer's
create of one job while a listing by due time runs beside it (SQLite: the listing's read runs
on a connection of its own, so the writer is not held up). Figures on stdout; ``--json``
prints them as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from timeshard.model import Job, JobState
from timeshard.sharding import shard_of
from timeshard.store.base import Store, entry_for
from timeshard.store.listing import JobOrder, JobQuery
from timeshard.store.sqlite import SqliteStore

NUM_SHARDS = 128
NOW = 1_800_000_000_000
PAGE = 50
TYPES = ("mail", "sms", "report", "audit")
DEAD_EVERY = 500


def make_jobs(n: int) -> list[Job]:
    out = []
    for i in range(n):
        job_id = uuid.uuid4().hex
        out.append(
            Job(
                job_id=job_id,
                shard=shard_of(job_id, NUM_SHARDS),
                job_type=TYPES[i % len(TYPES)],
                payload=b'{"n":1}',
                run_at=NOW + (i * 7919) % 86_400_000,
                created_at=NOW,
                idempotency_key=f"order-{i}" if i % 2 else "",
                state=JobState.DEAD if i % DEAD_EVERY == DEAD_EVERY - 1 else JobState.SCHEDULED,
            )
        )
    return out


async def load(store: Store, jobs: list[Job]) -> float:
    started = time.perf_counter()
    for i in range(0, len(jobs), 500):
        await store.create_jobs([(j, entry_for(j, j.run_at, NOW)) for j in jobs[i : i + 500]])
    return time.perf_counter() - started


async def timed(what: Callable[[], Awaitable[Any]], times: int = 3) -> float:
    """The best of ``times`` runs, in ms."""
    best = float("inf")
    for _ in range(times):
        started = time.perf_counter()
        await what()
        best = min(best, time.perf_counter() - started)
    return best * 1000


async def measure(store: Store, n: int) -> dict[str, float]:
    jobs = make_jobs(n)
    figures = {"load_s": round(await load(store, jobs), 2)}
    cases = {
        "due_page_ms": (JobQuery(), True),
        "type_state_page_ms": (
            JobQuery(job_type="mail", states=frozenset([JobState.SCHEDULED])),
            True,
        ),
        "dead_page_ms": (JobQuery(states=frozenset([JobState.DEAD])), True),
        "id_page_uncounted_ms": (JobQuery(order=JobOrder.ID), False),
        "key_lookup_ms": (JobQuery(key="order-1"), True),
    }
    for name, (query, count) in cases.items():

        async def page(query: JobQuery = query, count: bool = count) -> None:
            await store.find_jobs(query, limit=PAGE, page_token="", count=count)

        figures[name] = round(await timed(page), 1)

    async def dead_letters() -> None:
        await store.dead_letters(limit=100_000, latest=10)  # as the status page asks

    figures["dead_letters_count_ms"] = round(await timed(dead_letters), 1)
    extra = iter(make_jobs(20))

    async def create() -> None:
        job = next(extra)
        await store.create_jobs([(job, entry_for(job, job.run_at, NOW))])

    figures["create_ms_idle"] = round(await timed(create, 5), 2)
    listing = asyncio.ensure_future(
        store.find_jobs(JobQuery(), limit=PAGE, page_token="", count=True)
    )
    await asyncio.sleep(0.001)  # the listing's read is under way
    figures["create_ms_beside_a_listing"] = round(await timed(create, 1), 2)
    await listing
    return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": args.jobs}
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteStore(Path(tmp) / "listing.db", num_shards=NUM_SHARDS)
        await sqlite.open()
        try:
            out["sqlite"] = await measure(sqlite, args.jobs)
        finally:
            await sqlite.close()
    if args.cassandra:
        from timeshard.store.cassandra import CassandraStore
        from timeshard.testing.services import drop_keyspace

        keyspace = f"listing_{uuid.uuid4().hex[:12]}"
        cassandra = CassandraStore.from_url(
            f"cassandra://{args.cassandra}/{keyspace}", num_shards=NUM_SHARDS
        )
        await cassandra.open()
        try:
            out["cassandra"] = await measure(cassandra, args.jobs)
        finally:
            await cassandra.close()
            drop_keyspace(args.cassandra, keyspace)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--cassandra", default="", help="host:port of a running Cassandra")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures = asyncio.run(run(args))
    for store in ("sqlite", "cassandra"):
        for name, value in figures.get(store, {}).items():
            print(f"{store:<10} {name:<30} {value}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
