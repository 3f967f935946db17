"""What a cron occurrence costs to fire: CPU and store time per fire, and the store's calls.

    python tools/bench_ledger.py [--store sqlite|CASSANDRA_ADDRESS] [--schedules 200]
                                 [--rounds 10] [--json]

Creates ``--schedules`` per-second schedules on a fresh store (a temporary SQLite file, or a
fresh keyspace on a running Cassandra, dropped at the end) and fires each of them once per
round through ``ScheduleFirer`` on a fake clock advanced a second a round: every fire reads the
schedule, creates one occurrence job and updates the schedule row (since the occurrence ledger,
with its ledger row). Fires run ``--concurrency`` at a time. Prints per fire: CPU ms of this
process (the node's work: planning, encoding, the driver), wall ms, and on Cassandra the store
calls, their summed latency (``store_ms_per_fire``: concurrent calls overlap) and Paxos rounds.

Before and after a change, side by side: run it on each source tree,

    PYTHONPATH=/work/main/src python3 tools/bench_ledger.py --store sqlite
    PYTHONPATH=src python3 tools/bench_ledger.py --store sqlite

(the tool uses only what both have: ``ScheduleFirer.fire(schedule_id, due_at)``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from timeshard.clock import FakeClock
from timeshard.model import BucketEntry, Schedule
from timeshard.node.scheduleops import ScheduleOps
from timeshard.node.schedules import ScheduleFirer
from timeshard.store.base import Store

NUM_SHARDS = 16
START_MS = 1_800_000_000_000


async def _land(entries: Sequence[BucketEntry], /, *, again: Sequence[BucketEntry] = ()) -> None:
    return None


def _open(target: str, tmp: Path, clock: FakeClock) -> tuple[Store, str]:
    if target == "sqlite":
        from timeshard.store.sqlite import SqliteStore

        return SqliteStore(tmp / "bench.db", num_shards=NUM_SHARDS, clock=clock), ""
    from timeshard.store.cassandra import CassandraStore

    keyspace = f"bench_ledger_{uuid.uuid4().hex[:10]}"
    url = f"cassandra://{target}/{keyspace}"
    return CassandraStore.from_url(url, num_shards=NUM_SHARDS, clock=clock), keyspace


async def bench(target: str, schedules: int, rounds: int, concurrency: int) -> dict[str, Any]:
    clock = FakeClock(START_MS)
    with tempfile.TemporaryDirectory() as tmp:
        store, keyspace = _open(target, Path(tmp), clock)
        await store.open()
        try:
            ops = ScheduleOps(store, clock, land=_land)
            ids = [f"bench-{i}" for i in range(schedules)]
            for sid in ids:
                await ops.create(
                    Schedule(
                        schedule_id=sid,
                        shard=0,
                        cron="* * * * * *",
                        timezone="Europe/Berlin",
                        job_type="bench.noop",
                        next_fire=0,
                        created_at=0,
                    )
                )
            firer = ScheduleFirer(store, clock, 3, land=_land)
            limit = asyncio.Semaphore(concurrency)

            async def fire(sid: str, due: int) -> None:
                async with limit:
                    await firer.fire(sid, due)

            calls_before = sum(store.stats.operations.values())
            seconds_before = sum(store.stats.seconds.values())
            rounds_before = store.stats.paxos_rounds
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(rounds):
                clock.advance(1.0)
                now = clock.now_ms()
                await asyncio.gather(*(fire(sid, now) for sid in ids))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            fires = schedules * rounds
            calls = sum(store.stats.operations.values()) - calls_before
            store_s = sum(store.stats.seconds.values()) - seconds_before
            paxos = store.stats.paxos_rounds - rounds_before
        finally:
            await store.close()
            if keyspace:
                from timeshard.testing.services import drop_keyspace

                drop_keyspace(target, keyspace)
    return {
        "store": target,
        "fires": fires,
        "cpu_ms_per_fire": round(cpu * 1000 / fires, 3),
        "wall_ms_per_fire": round(wall * 1000 / fires, 3),
        "store_calls_per_fire": round(calls / fires, 2),
        "store_ms_per_fire": round(store_s * 1000 / fires, 3) if store_s else None,
        "paxos_rounds_per_fire": round(paxos / fires, 2),
        "fires_per_s": round(fires / wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default="sqlite", help="sqlite, or a Cassandra HOST:PORT")
    p.add_argument("--schedules", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--json", action="store_true", help="the figures as one JSON line")
    args = p.parse_args(argv)
    got = asyncio.run(bench(args.store, args.schedules, args.rounds, args.concurrency))
    if args.json:
        print(json.dumps(got))
    else:
        for key, value in got.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
