"""Benchmark the Cassandra store against a running Cassandra, side by side with its raw ceiling.

    python tools/bench_store.py [--cassandra 127.0.0.1:9042] [--jobs 5000] [--concurrency 256]
                                [--json]

Three phases on one fresh keyspace (dropped at the end), each with the same number of
operations in flight:

1. raw ceiling: plain lightweight transactions (``UPDATE ... IF v = 0`` on distinct rows)
   through the driver alone;
2. ingest: jobs scheduled per second through ``store.create_jobs`` (one ``INSERT ... IF NOT
   EXISTS`` and one bucket entry each);
3. firing: jobs claimed and completed per second through the store API (each job: a read and a
   conditional write to claim plus its lease-check entry, a read and a conditional write to
   complete; so two LWTs per job).

Start a node with `python -m timeshard.stack up --only cassandra` (or set TIMESHARD_CASSANDRA).
Progress goes to stderr; `--json` prints the figures as the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bench.cassandra import raw_lwt
from bench.progress import Progress, note

from timeshard.model import Job
from timeshard.sharding import shard_of
from timeshard.store.base import JobClaim, entry_for
from timeshard.store.cassandra import CassandraStore
from timeshard.testing.services import drop_keyspace

NUM_SHARDS = 128


def make_jobs(n: int, now: int) -> list[Job]:
    prefix = uuid.uuid4().hex[:8]
    return [
        Job(
            job_id=f"bench-{prefix}-{i}",
            shard=shard_of(f"bench-{prefix}-{i}", NUM_SHARDS),
            job_type="bench.noop",
            payload=b'{"n":1}',
            run_at=now + 60_000 + i,
            created_at=now,
        )
        for i in range(n)
    ]


BATCH = 32
"""Jobs per store call; ``concurrency / BATCH`` calls run at once, so as many operations are
in flight as in the raw phase."""


async def in_batches(
    name: str,
    items: Sequence[Any],
    concurrency: int,
    run: Callable[[Sequence[Any]], Awaitable[None]],
) -> dict[str, Any]:
    meter = Progress(name, len(items))
    starts = iter(range(0, len(items), BATCH))

    async def worker() -> None:
        for start in starts:  # one iterator shared by the workers: each batch runs once
            batch = items[start : start + BATCH]
            await run(batch)
            meter.add(len(batch))

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency // BATCH))))
    return {"operation": name, **meter.close()}


async def run_phases(address: str, keyspace: str, n: int, concurrency: int) -> list[dict[str, Any]]:
    store = CassandraStore.from_url(f"cassandra://{address}/{keyspace}", num_shards=NUM_SHARDS)
    await store.open()  # creates the keyspace
    try:
        raw = await asyncio.to_thread(raw_lwt, address, keyspace, n=n, concurrency=concurrency)
        now = time.time_ns() // 1_000_000
        jobs = make_jobs(n, now)

        async def schedule(batch: Sequence[Job]) -> None:
            results = await store.create_jobs([(j, entry_for(j, j.run_at, now)) for j in batch])
            if not all(r.created for r in results):
                raise SystemExit("create_jobs: a job was not created")

        async def fire(batch: Sequence[Job]) -> None:
            claims = [
                JobClaim(
                    job_id=j.job_id,
                    expect_fence=0,
                    worker="bench",
                    now=now,
                    lease_until=now + 60_000,
                )
                for j in batch
            ]
            outs = await store.claim_jobs(claims)
            done = await asyncio.gather(
                *(store.complete_job(o.job.job_id, o.job.fence, now) for o in outs if o.job)
            )
            if not all(o.applied for o in outs) or not all(d.applied for d in done):
                raise SystemExit("claim/complete: a write did not apply")

        note(f"store: scheduling {n} jobs, {concurrency} in flight ...")
        ingest = await in_batches("store.create_jobs", jobs, concurrency, schedule)
        note(f"store: claiming and completing {n} jobs, {concurrency} in flight ...")
        firing = await in_batches("store claim+complete", jobs, concurrency, fire)
        return [raw, ingest, firing]
    finally:
        await store.close()


def report(rows: list[dict[str, Any]]) -> str:
    ceiling = rows[0]["per_second"] or 1.0
    lines = [f"{'operation':<28} {'count':>7} {'seconds':>8} {'per second':>11} {'vs raw LWT':>11}"]
    for r in rows:
        ratio = r["per_second"] / ceiling
        lines.append(
            f"{r['operation']:<28} {r['count']:>7} {r['seconds']:>8.2f} "
            f"{r['per_second']:>11,.0f} {ratio:>10.2f}x"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cassandra",
        default=os.environ.get("TIMESHARD_CASSANDRA", "127.0.0.1:9042"),
        help="host:port of a running Cassandra (env TIMESHARD_CASSANDRA; %(default)s)",
    )
    ap.add_argument("--jobs", type=int, default=5000, help="operations per phase (5000)")
    ap.add_argument("--concurrency", type=int, default=256, help="operations in flight (256)")
    ap.add_argument("--keep", action="store_true", help="keep the benchmark keyspace")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    keyspace = f"bench_{uuid.uuid4().hex[:12]}"
    note(f"Cassandra {args.cassandra}, keyspace {keyspace}")
    try:
        rows = asyncio.run(run_phases(args.cassandra, keyspace, args.jobs, args.concurrency))
    finally:
        if not args.keep:
            drop_keyspace(args.cassandra, keyspace)
    raw = rows[0]
    print(report(rows))
    if args.json:
        summary = {
            "cassandra": args.cassandra,
            "jobs": args.jobs,
            "concurrency": args.concurrency,
            "results": rows,
            "ratios_vs_raw_lwt": {
                r["operation"]: round(r["per_second"] / raw["per_second"], 3) for r in rows
            },
        }
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
