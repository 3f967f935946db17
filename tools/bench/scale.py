"""Scenarios of a cluster meant to grow: ``shards`` (what a node owning many shards costs when
they are idle, and the steady lateness spread over them) and ``failover`` (kill -9 the node
owning most shards during a steady run on several nodes)."""

from __future__ import annotations

import argparse
import copy
import itertools
import time
from typing import Any

from .procs import Timeshard, cpu_delta
from .progress import note
from .records import RunRecords
from .scenarios import (
    Store,
    bucket_reads,
    bucket_requests,
    machine,
    running,
)
from .steady import steady_phase

OWNED = "timeshard_node_shards_owned"
LEASE_S = 60.0  # the load workers' lease (``Timeshard``)


def wait_owned(ts: Timeshard, shards: int, timeout_s: float = 600.0) -> float:
    """Wait until the live nodes own every shard between them; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        owned = sum(ts.scrape(p.name).get(OWNED, 0.0) for p in ts.servers)
        if owned >= shards:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"after {timeout_s:g} s the nodes own {owned:g} of {shards} shards")
        ts.check_alive()
        time.sleep(0.5)


def idle_cost(ts: Timeshard, seconds: float) -> dict[str, Any]:
    """The nodes' CPU (share of one core) and bucket partitions read per second over
    ``seconds`` with no job due."""
    cpu0, ctr0, t0 = ts.cpu(), ts.counters(), time.monotonic()
    time.sleep(seconds)
    cpu1, ctr1, t1 = ts.cpu(), ts.counters(), time.monotonic()
    used, wall = cpu_delta(cpu0, cpu1), t1 - t0
    reads, requests = bucket_reads(ctr0, ctr1), bucket_requests(ctr0, ctr1)
    server, workers = used.get("server"), used.get("workers")
    return {
        "seconds": round(wall, 1),
        "server_core_share": round(server / wall, 4) if server is not None else None,
        "workers_core_share": round(workers / wall, 4) if workers is not None else None,
        "bucket_reads_per_s": round(reads / wall, 1) if reads is not None else None,
        "bucket_read_requests_per_s": round(requests / wall, 1) if requests is not None else None,
    }


def shards(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    """For each shard count: a fresh store with that many shards, the node(s) owning them
    all, their idle cost, then ``steady --rate R`` spread over them."""
    counts = sorted({int(c) for c in str(args.counts).replace("_", "").split(",") if c})
    rows: list[dict[str, Any]] = []
    series: list[Any] = []
    for count in counts:
        run = copy.copy(args)
        run.shards = count
        with running(run) as (ts, store, records):
            took = wait_owned(ts, count)
            note(f"{count} shards owned after {took:.1f} s; {args.settle:g} s to settle")
            time.sleep(args.settle)
            note(f"idle for {args.idle:g} s")
            idle = idle_cost(ts, args.idle)
            steady = None
            if args.rate:
                steady, rows_t = steady_phase(ts, store, records, run)
                series.append((f"{count} shards", rows_t))
        rows.append({"shards": count, "take_all_s": round(took, 1), "idle": idle, "steady": steady})
    base = next((r for r in rows if r["steady"] and r["steady"].get("lateness_p50_s")), None)
    for r in rows:
        s, b = r["steady"], base["steady"] if base else None
        if s and b and s.get("lateness_p99_s") and b.get("lateness_p99_s"):
            r["p99_over_fewest"] = round(s["lateness_p99_s"] / b["lateness_p99_s"], 2)
    result = {
        "scenario": "shards",
        "store": store.kind,
        "nodes": args.nodes,
        "rate": args.rate,
        "results": rows,
        "machine": machine(),
    }
    return result, series


def failover(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    """``steady`` on several nodes; ``--kill-after`` s into it, kill -9 the node owning the
    most shards, and measure from the workers' records: when each of its shards fired again,
    the lateness of its jobs due meanwhile against the others', lost and overlapping runs."""
    if args.nodes < 2:
        raise SystemExit("failover needs --nodes 2 or more (and --store cassandra://...)")
    args = copy.copy(args)
    args.drain = max(args.drain, LEASE_S + 30)  # a claim cut off by the kill runs after its lease
    with running(args) as (ts, store, records):
        killed: dict[str, Any] = {}

        def maybe_kill() -> None:
            if killed or time.monotonic() < started + args.kill_after:
                return
            owners = shard_owners(ts)
            victim = max(ts.names, key=lambda n: sum(1 for o in owners.values() if o == n))
            killed.update(
                name=victim, shards={s for s, o in owners.items() if o == victim}, at=time.time()
            )
            note(f"kill -9 {victim}, owner of {len(killed['shards'])} of {args.shards} shards")
            ts.kill(victim)

        started = time.monotonic()
        out, rows = steady_phase(ts, store, records, args, during=maybe_kill)
        out["scenario"] = "failover"
        out["failover"] = after_kill(ts, store, records, killed, args)
    return {**out, "machine": machine()}, [("timeshard " + store.kind, rows)]


def shard_owners(ts: Timeshard) -> dict[int, str]:
    return {s: info.owner for s, info in ts.fleet.owners(avoid=ts.killed).items()}


def after_kill(
    ts: Timeshard,
    store: Store,
    records: RunRecords,
    killed: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The figures of the kill, from the workers' records (each job's shard from its id)."""
    from timeshard.sharding import shard_of

    if not killed:
        return {"killed": None, "note": "the run ended before --kill-after"}
    at_ms = killed["at"] * 1000
    lost_shards: set[int] = killed["shards"]
    first_after: dict[int, float] = {}  # shard -> first start after the kill
    late_theirs: list[float] = []
    late_others: list[float] = []
    for job_id, (due, start) in records.first.items():
        shard = shard_of(job_id, args.shards)
        # Fired again: claimed after the kill, so by a successor (a job the killed node had
        # claimed and pushed just before may start after the kill: it does not count).
        if shard in lost_shards and records.claimed.get(job_id, start) > at_ms:
            first_after[shard] = min(first_after.get(shard, start), start)
        if due >= at_ms - 1000:  # due from a second before the kill on
            (late_theirs if shard in lost_shards else late_others).append((start - due) / 1000)
    took = sorted((t - at_ms) / 1000 for t in first_after.values())
    overlapping = overlapping_runs(records, LEASE_S)
    return {
        "killed": killed["name"],
        "shards_of_killed": len(lost_shards),
        "shards_fired_again": len(first_after),
        "first_shard_fired_again_s": round(took[0], 3) if took else None,
        "every_shard_fired_again_s": round(took[-1], 3)
        if took and len(took) == len(lost_shards)
        else None,
        "lateness_of_its_jobs_s": spread(late_theirs),
        "lateness_of_other_jobs_s": spread(late_others),
        "overlapping": overlapping,
        "session_timeout_s": args.session_timeout,
    }


def overlapping_runs(records: RunRecords, lease_s: float) -> int:
    """Jobs that may have run twice at once. The load worker's handler does nothing and its
    records hold only starts, so a job counts here when it started again within one lease of
    an earlier start (the earlier holder's lease could still have been valid): an upper
    bound on runs that overlapped."""
    count = 0
    for job_id, starts in records.again.items():
        times = sorted([records.first[job_id][1], *starts])
        if any(b - a < lease_s * 1000 for a, b in itertools.pairwise(times)):
            count += 1
    return count


def spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None, "count": 0}
    values = sorted(values)

    def at(p: float) -> float:
        return round(values[min(len(values) - 1, round(p * (len(values) - 1)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(values[-1], 3), "count": len(values)}
