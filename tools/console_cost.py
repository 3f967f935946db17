"""What the operator console costs: the store reads of an open console, and its search time.

    python tools/console_cost.py reads [--seconds 60] [--consoles 3] [--nodes 3]
    python tools/console_cost.py search [--jobs 1000000] [--cassandra HOST:PORT] [--runs 20]

``reads``: ``--nodes`` nodes (each with its gRPC server) on one embedded store file, the console
on the first one's HTTP port, every store operation of every node counted; the operations of
``--seconds`` with no console open, then of as long with ``--consoles`` overview pages open and
following their live stream (server-sent events), which sums every node's live numbers (one
``PeerService.Live`` call per other node a second, counted too). The difference, per console
and per minute, is what an open console costs the store.

``search``: ``--jobs`` jobs stored (ten types, due over a day, half with an idempotency key)
in a fresh keyspace of ``--cassandra`` (dropped at the end; without it, the embedded store),
then the console's jobs page fetched over HTTP ``--runs`` times for each of five searches (a
type; a type in a state; a key prefix; a due-time range; one job id), with p50 and p95 in ms.
Figures on stdout; ``--json`` prints them as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from timeshard.clock import SystemClock
from timeshard.coordinator.base import Coordinator, Member, ShardsChanged
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import Job
from timeshard.node import Node
from timeshard.server import Server
from timeshard.sharding import shard_of
from timeshard.store.base import Store, entry_for
from timeshard.store.sqlite import SqliteStore
from timeshard.views.console.app import ConsoleSettings
from timeshard.views.http import serve_node

NUM_SHARDS = 64
TYPES = [f"bench.t{i}" for i in range(10)]


class Counted:
    """``store`` with every coroutine operation counted by name."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not asyncio.iscoroutinefunction(value):
            return value

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await value(*args, **kwargs)

        return counted


async def _node(store: Any) -> Node:
    node = Node(store=store, coordinator=LocalCoordinator(), clock=SystemClock())
    await node.start()
    return node


class StaticCluster(Coordinator):
    """``nodes`` nodes in one process: node i owns the shards s with s % nodes == i, every
    node is a member (with its gRPC address), so each console asks the others (``Live``)."""

    def __init__(self, index: int, members: list[Member]) -> None:
        self._index, self._members = index, members
        self._owned: frozenset[int] = frozenset()

    async def start(self, me: Member, num_shards: int, on_change: ShardsChanged) -> None:
        n = len(self._members)
        self._owned = frozenset(s for s in range(num_shards) if s % n == self._index)
        await on_change(self._owned, frozenset())

    async def stop(self) -> None:
        pass

    def owned(self) -> frozenset[int]:
        return self._owned

    async def members(self) -> list[Member]:
        return list(self._members)

    async def owners(self) -> dict[int, str]:
        n = len(self._members)
        return {s: self._members[s % n].node_id for s in range(NUM_SHARDS)}


async def _cluster(db: Path, n: int) -> tuple[list[Server], list[Counted]]:
    """``n`` nodes on one embedded store file, each with its gRPC server (for ``Live``)."""
    members: list[Member] = []
    servers, stores = [], []
    for i in range(n):
        store: Any = Counted(SqliteStore(db, num_shards=NUM_SHARDS))
        coordinator = StaticCluster(i, members) if n > 1 else LocalCoordinator()
        node = Node(store=store, coordinator=coordinator, clock=SystemClock(), node_id=f"n{i}")
        server = Server(node, port=0)
        members.append(Member(node_id=node.node_id, address=server.address))
        servers.append(server)
        stores.append(store)
    for server in servers:
        await server.start()
    return servers, stores


async def reads(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        servers, stores = await _cluster(Path(tmp) / "c.db", args.nodes)
        asked = Counter[str]()

        def peers() -> Any:
            ask = servers[0].live_asker()
            if ask is None:
                return None

            async def counted(member: Member) -> Any:
                asked[member.node_id] += 1
                return await ask(member)

            return counted

        node = servers[0].node
        http = await serve_node(
            node, host="127.0.0.1", port=0, console=ConsoleSettings(peers=peers)
        )

        def total() -> Counter[str]:
            return sum((s.calls for s in stores), Counter[str]())

        try:
            await asyncio.sleep(5)  # the nodes' start-up reads are not counted
            start_counts = total()
            await asyncio.sleep(args.seconds)
            counted = total()
            idle = sum((counted - start_counts).values())
            async with httpx.AsyncClient(base_url=http.url(""), timeout=None) as client:
                events = [0] * args.consoles

                async def follow(i: int) -> None:
                    await client.get("/console/")
                    async with client.stream("GET", "/console/live") as r:
                        async for line in r.aiter_lines():
                            if line.startswith("event: live"):
                                events[i] += 1

                tasks = [asyncio.create_task(follow(i)) for i in range(args.consoles)]
                await asyncio.sleep(args.seconds)
                by_console = total() - counted
                opened = sum(by_console.values())
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await http.stop()
            for server in servers:
                await server.stop(0)
    per_min = 60 / args.seconds
    return {
        "seconds": args.seconds,
        "nodes": args.nodes,
        "consoles": args.consoles,
        "store_ops_per_min_no_console": round(idle * per_min, 1),
        "store_ops_per_min_consoles_open": round(opened * per_min, 1),
        "extra_store_ops_per_min_per_console": round((opened - idle) * per_min / args.consoles, 1),
        "live_events_per_console_per_min": round(sum(events) / args.consoles * per_min, 1),
        "peer_live_calls_per_min": round(sum(asked.values()) * per_min, 1),
        "ops_no_console": dict(counted - start_counts),
        "ops_consoles_open": dict(by_console),
    }


def _jobs(n: int, now: int) -> list[Job]:
    out = []
    for i in range(n):
        job_id = uuid.uuid4().hex
        out.append(
            Job(
                job_id=job_id,
                shard=shard_of(job_id, NUM_SHARDS),
                job_type=TYPES[i % len(TYPES)],
                payload=b'{"n":1}',
                run_at=now + 3_600_000 + (i * 7919) % 86_400_000,
                created_at=now,
                idempotency_key=f"order-{i}" if i % 2 else "",
            )
        )
    return out


async def search(args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        keyspace = f"console_cost_{uuid.uuid4().hex[:10]}"
        if args.cassandra:
            from timeshard.store.cassandra import CassandraStore

            raw: Store = CassandraStore.from_url(
                f"cassandra://{args.cassandra}/{keyspace}", num_shards=NUM_SHARDS
            )
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            raw = SqliteStore(Path(tmp) / "s.db", num_shards=NUM_SHARDS)
        node = await _node(raw)
        try:
            now = node.clock.now_ms()
            started = time.perf_counter()
            some_id = ""
            for lo in range(0, args.jobs, 20_000):
                jobs = _jobs(min(20_000, args.jobs - lo), now)
                some_id = some_id or jobs[0].job_id
                for i in range(0, len(jobs), 500):
                    batch = jobs[i : i + 500]
                    await raw.create_jobs([(j, entry_for(j, j.run_at, now)) for j in batch])
                print(f"stored {lo + len(jobs):,} jobs", file=sys.stderr, flush=True)
            load_s = time.perf_counter() - started
            http = await serve_node(node, host="127.0.0.1", port=0, console=ConsoleSettings())
            searches = {
                "type": "type=bench.t3",
                "type_state": "type=bench.t3&state=scheduled",
                "key_prefix": "key_prefix=order-12345",
                "due_range": "from=now%2B2h&to=now%2B3h",
                "job_id": f"id={some_id}",
            }
            figures: dict[str, Any] = {"jobs": args.jobs, "load_s": round(load_s, 1)}
            async with httpx.AsyncClient(base_url=http.url(""), timeout=600) as client:
                for name, query in searches.items():
                    times = []
                    for _ in range(args.runs):
                        t0 = time.perf_counter()
                        r = await client.get(f"/console/jobs?{query}")
                        times.append((time.perf_counter() - t0) * 1000)
                        assert r.status_code in (200, 303), (name, r.status_code, r.text[:300])
                    times.sort()
                    figures[name] = {
                        "p50_ms": round(statistics.median(times), 1),
                        "p95_ms": round(times[max(0, round(0.95 * len(times)) - 1)], 1),
                    }
            await http.stop()
        finally:
            await node.stop()
            if args.cassandra:
                from timeshard.testing.services import drop_keyspace

                await asyncio.to_thread(drop_keyspace, args.cassandra, keyspace)
    figures["store"] = "cassandra" if args.cassandra else "sqlite"
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("reads", help="store operations of an open console, per minute")
    r.add_argument("--seconds", type=float, default=60.0)
    r.add_argument("--consoles", type=int, default=3)
    r.add_argument("--nodes", type=int, default=1, help="nodes in the cluster (gRPC each)")
    s = sub.add_parser("search", help="the jobs page's p50/p95 with many jobs stored")
    s.add_argument("--jobs", type=int, default=1_000_000)
    s.add_argument("--cassandra", default="", help="host:port of a running Cassandra")
    s.add_argument("--runs", type=int, default=20)
    for p in (r, s):
        p.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures = asyncio.run(reads(args) if args.what == "reads" else search(args))
    for name, value in figures.items():
        print(f"{name:<40} {value}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
