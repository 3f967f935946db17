"""The load-test scenarios against real timeshard processes: ``fire`` (a pre-loaded burst or
window), ``steady`` (streamed at an offered rate) and ``backlog`` (bursts with millions of
future jobs stored)."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from timeshard.node.dispatchconfig import DEFAULT_CLAIM_AHEAD_MS
from timeshard.testing.services import create_keyspace, drop_keyspace

from . import cassandra as cass
from .procs import LOADWORKER, Timeshard, cpu_delta, listening_pid
from .profiling import sampled
from .progress import Progress, note
from .records import RunRecords, figures, timeline
from .submit import now_ms, schedule, warmup_rate

DAY_MS = 86_400_000


@dataclass
class Store:
    url: str
    kind: str
    sqlite_path: Path | None = None
    cassandra: str = ""
    keyspace: str = ""
    drop: bool = False

    def size_bytes(self) -> int | None:
        """Bytes on disk (SQLite: the file and its WAL); None where it can not be read here."""
        if self.sqlite_path is None:
            return None
        files = [Path(f"{self.sqlite_path}{suffix}") for suffix in ("", "-wal", "-shm")]
        return sum(f.stat().st_size for f in files if f.exists())


def prepare_store(spec: str, run_dir: Path, shards: int) -> Store:
    if spec in ("", "sqlite", "embedded"):
        path = run_dir / "loadtest.db"
        return Store(url=f"sqlite://{path}", kind="sqlite", sqlite_path=path)
    if spec.startswith("sqlite://"):
        return Store(url=spec, kind="sqlite", sqlite_path=Path(spec.removeprefix("sqlite://")))
    if spec.startswith("cassandra://"):
        address, keyspace = cass.split_store_url(spec)
        fresh = not keyspace
        keyspace = keyspace or cass.fresh_keyspace()
        url = f"cassandra://{address}/{keyspace}"
        note(f"Cassandra {address}, keyspace {keyspace}" + (" (dropped at the end)" * fresh))
        create_keyspace(url, shards)
        return Store(url=url, kind="cassandra", cassandra=address, keyspace=keyspace, drop=fresh)
    raise SystemExit(f"--store {spec!r}: give sqlite, sqlite:///PATH or cassandra://HOST:PORT[/KS]")


def zookeeper_url(args: argparse.Namespace) -> str:
    """A fresh cluster root on ``--zookeeper`` (needed for more than one node), or "" for
    the local coordinator."""
    nodes = getattr(args, "nodes", 1)
    hosts = getattr(args, "zookeeper", "") or ""
    if nodes > 1 and not hosts:
        hosts = os.environ.get("TIMESHARD_ZOOKEEPER", "")
    if nodes < 1:
        raise SystemExit(f"--nodes {nodes}: give at least 1")
    if nodes > 1 and not hosts:
        raise SystemExit(
            f"--nodes {nodes} needs a ZooKeeper: give --zookeeper HOST:PORT "
            "(or set TIMESHARD_ZOOKEEPER)"
        )
    if nodes > 1 and not args.store.startswith("cassandra://"):
        raise SystemExit(f"--nodes {nodes} needs a shared store: give --store cassandra://...")
    if not hosts:
        return ""
    root = f"timeshard-loadtest/{uuid.uuid4().hex[:12]}"
    return f"zookeeper://{hosts}/{root}?session_timeout={args.session_timeout:g}"


@contextlib.contextmanager
def running(
    args: argparse.Namespace,
    *,
    lease_s: float = 60.0,
    worker_target: str = LOADWORKER,
    worker_env: dict[str, str] | None = None,
) -> Iterator[tuple[Timeshard, Store, RunRecords]]:
    """A fresh store, a server and the workers (the no-op load worker with a 60 s lease unless
    told otherwise); everything ended and removed afterwards (unless --keep)."""
    run_dir = Path(tempfile.mkdtemp(prefix="loadtest-"))
    store = prepare_store(args.store, run_dir, args.shards)
    nodes = getattr(args, "nodes", 1)
    zookeeper = zookeeper_url(args)
    ts = Timeshard(
        run_dir,
        store.url,
        shards=args.shards,
        workers=args.workers,
        concurrency=args.concurrency,
        lookahead_s=args.lookahead,
        worker_command=getattr(args, "worker_command", None),
        nodes=nodes,
        zookeeper=zookeeper,
        lease_s=lease_s,
        worker_target=worker_target,
        worker_env=worker_env,
        server_flags=[
            "--claim-ahead-ms",
            str(getattr(args, "claim_ahead_ms", DEFAULT_CLAIM_AHEAD_MS)),
        ],
    )
    if store.kind == "cassandra" and "," not in store.cassandra:
        host, _, port = store.cassandra.rpartition(":")
        ts.cassandra_pid = listening_pid(host, int(port))
    keep = args.keep
    try:
        servers = f"{nodes} timeshard servers on ZooKeeper" if zookeeper else "timeshard server"
        note(
            f"starting {servers} ({store.kind}, {args.shards} shards) and "
            f"{args.workers} worker processes; logs in {run_dir}"
        )
        ts.start()
        yield ts, store, RunRecords(ts.record_paths())
    except BaseException:
        keep = True  # the logs say what went wrong
        raise
    finally:
        ts.stop()
        if store.drop and not args.keep:
            drop_keyspace(store.cassandra, store.keyspace)
        if keep:
            note(f"kept {run_dir} (server and worker logs, run records)")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


def wait_fired(
    ts: Timeshard,
    records: RunRecords,
    n: int,
    due_ms: tuple[float, float],
    drain_s: float,
    label: str = "fire",
) -> None:
    """Follow the workers' records until ``n`` jobs ran, or nothing new ran for ``drain_s``
    once the last one is due (``due_ms``: the first and the last due time)."""
    first_due_ms, last_due_ms = due_ms
    progress = Progress(label, n)
    waiting = True
    last_change = time.monotonic()
    while True:
        if records.poll():
            last_change = time.monotonic()
        fired = len(records.first)
        if waiting and (now_ms() >= first_due_ms or fired):
            waiting = False
            progress.started = time.monotonic()  # rates from the first due time on
        wait_s = (first_due_ms - now_ms()) / 1000
        progress.update(fired, extra=f"first due in {wait_s:.1f} s" if waiting else "")
        if fired >= n:
            break
        idle = time.monotonic() - last_change
        if now_ms() > last_due_ms and idle > drain_s:
            note(f"nothing ran for {drain_s:g} s after the last due time: {n - fired} lost")
            break
        ts.check_alive()
        time.sleep(0.1)
    progress.close()


def per_1k(seconds: float | None, jobs: int) -> float | None:
    return round(seconds / jobs * 1000, 4) if seconds is not None and jobs else None


def per_job(delta: float | None, jobs: int) -> float | None:
    return round(delta / jobs, 4) if delta is not None and jobs else None


def counter_delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """How much a counter grew; a labelled counter has no sample before its first count."""
    if not before or name not in after:
        return None
    return after[name] - before.get(name, 0.0)


ROUNDS = "timeshard_store_paxos_rounds_total"
ROWS = "timeshard_store_conditional_rows_total"
CLAIMED = "timeshard_jobs_claimed_total"
CLAIM_MESSAGES = "timeshard_worker_messages_total{kind=claim}"
RESULT_MESSAGES = "timeshard_worker_messages_total{kind=result}"
RESULTS = "timeshard_results_received_total"
STREAM_IN = "timeshard_worker_stream_messages_total{direction=in}"
STREAM_OUT = "timeshard_worker_stream_messages_total{direction=out}"
PARTITIONS_READ = "timeshard_store_bucket_partitions_read_total"
BUCKET_READS = (
    "timeshard_store_operations_total{op=read_bucket}",
    "timeshard_store_operations_total{op=read_bucket_after}",
    "timeshard_store_operations_total{op=read_buckets}",
)


def bucket_reads(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Bucket partitions read between two scrapes (a multi-partition read counts each it
    names; first pages and further pages); from the requests where a node does not count
    partitions (an older one)."""
    if PARTITIONS_READ in after:
        return counter_delta(before, after, PARTITIONS_READ)
    grown = [counter_delta(before, after, name) for name in BUCKET_READS]
    return sum(g for g in grown if g is not None) if any(g is not None for g in grown) else None


def bucket_requests(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Bucket read requests sent to the store between two scrapes (Cassandra)."""
    grown = [counter_delta(before, after, name) for name in BUCKET_READS]
    return sum(g for g in grown if g is not None) if any(g is not None for g in grown) else None


def ratio_of(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def ms_per_job(seconds: float | None, jobs: int) -> float | None:
    return round(seconds / jobs * 1000, 4) if seconds is not None and jobs else None


def fired_costs(
    store_kind: str,
    cpu: dict[str, float | None],
    before: dict[str, float],
    after: dict[str, float],
    fired: int,
) -> dict[str, Any]:
    """What firing ``fired`` jobs cost, from the CPU used and the server's counters over the
    same span: CPU per job, jobs per worker message, worker stream messages per job read
    and written, and on Cassandra Paxos rounds per job (the embedded store has none)."""
    out: dict[str, Any] = {
        "server_cpu_ms": ms_per_job(cpu.get("server"), fired),
        "worker_cpu_ms": ms_per_job(cpu.get("workers"), fired),
        "claims_per_claim_message": ratio_of(
            counter_delta(before, after, CLAIMED), counter_delta(before, after, CLAIM_MESSAGES)
        ),
        "results_per_result_message": ratio_of(
            counter_delta(before, after, RESULTS), counter_delta(before, after, RESULT_MESSAGES)
        ),
        # each message costs the node about as much as the jobs it carries at a trickle
        "stream_messages_in": per_job(counter_delta(before, after, STREAM_IN), fired),
        "stream_messages_out": per_job(counter_delta(before, after, STREAM_OUT), fired),
    }
    if store_kind == "cassandra":
        out["cassandra_cpu_ms"] = ms_per_job(cpu.get("cassandra"), fired)
        out["paxos_rounds"] = per_job(counter_delta(before, after, ROUNDS), fired)
        out["conditional_rows"] = per_job(counter_delta(before, after, ROWS), fired)
        out["bucket_reads"] = per_job(bucket_reads(before, after), fired)
    return out


SCHEDULED = "timeshard_jobs_scheduled_total"
HINTS = "timeshard_peer_hint_entries_total"


def node_figures(
    ts: Timeshard,
    cpu: dict[str, float | None],
    before: dict[str, float],
    after: dict[str, float],
    fired: int,
) -> dict[str, Any] | None:
    """With several nodes, each node's share of firing ``fired`` jobs: its CPU per fired job
    (ms), the jobs it claimed, the results it took and how many of those were for jobs another
    node claimed (a worker reports to the node it claimed from, so these are results answered
    by a node that is not the job's owner), the jobs it created (its clients' ScheduleJobs:
    with N nodes about (N-1)/N of them land in shards another node owns), the entries of those
    it hinted to their owner (``PeerService.Land``, for the jobs due before the owner's next
    read) and the hints that failed, and its Paxos rounds per fired job."""
    if len(ts.names) < 2:
        return None
    out: dict[str, Any] = {}
    for name in ts.names:

        def grown(counter: str, name: str = name) -> float | None:
            return counter_delta(before, after, f"{name}/{counter}")

        claimed, results = grown(CLAIMED) or 0.0, grown(RESULTS) or 0.0
        out[name] = {
            "killed": name in ts.killed or None,
            "server_cpu_ms": ms_per_job(cpu.get(f"server:{name}"), fired),
            "claimed": int(claimed),
            "results": int(results),
            "results_for_jobs_claimed_elsewhere": int(max(0.0, results - claimed)),
            "scheduled": int(grown(SCHEDULED) or 0),
            "hinted_to_owner": int(grown(HINTS + "{direction=sent}") or 0),
            "hints_failed": int(grown(HINTS + "{outcome=failed}") or 0),
            "paxos_rounds": per_job(grown(ROUNDS), fired),
        }
    return out


def mean_ms(
    before: dict[str, float], after: dict[str, float], name: str, label: str = ""
) -> float | None:
    """A histogram's mean over the span, in ms."""
    total = counter_delta(before, after, f"{name}_sum{label}")
    count = counter_delta(before, after, f"{name}_count{label}")
    return round(total * 1000 / count, 2) if total is not None and count else None


def time_breakdown(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Where a fired job's time went on the server, from its counters over the run: the mean
    from due time to the claim that took the job (``due_to_claimed``), of a Claim and of a
    Finish call (a long poll's wait included), and each store operation's mean time per call
    (ms) with its calls, busiest first (a queue wait in the store's group commit is not in
    it; the driver's is)."""
    return {
        "due_to_claimed_ms": mean_ms(before, after, "timeshard_fire_lateness_seconds"),
        "claim_rpc_ms": mean_ms(before, after, RPC_SECONDS, "{grpc_method=Claim}"),
        "finish_rpc_ms": mean_ms(before, after, RPC_SECONDS, "{grpc_method=Finish}"),
        "store_ms_per_call": store_latencies(before, after),
        "gc_s": {
            g: counter_delta(before, after, f"timeshard_gc_seconds_total{{generation={g}}}")
            for g in ("0", "1", "2")
        },
    }


RPC_SECONDS = "timeshard_rpc_duration_seconds"


def cassandra_side(store: Store) -> dict[str, Any] | None:
    """Cassandra's own latencies of the run just ended (``cass.server_latencies``); None on
    the embedded store, or when the node cannot say (a Cassandra without these tables)."""
    if store.kind != "cassandra":
        return None
    try:
        return cass.server_latencies(store.cassandra.split(",")[0], store.keyspace)
    except Exception as exc:  # a figure we could not take must not cost the run's others
        note(f"Cassandra's own latencies not read: {type(exc).__name__}: {exc}")
        return None


def store_latencies(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Each store operation's mean time per call over the span (ms) and its calls, busiest
    first: where a job's time in the store goes."""
    out: dict[str, Any] = {}
    prefix = "timeshard_store_operations_total{op="
    rows = []
    for key in after:
        if not key.startswith(prefix):
            continue
        op = key[len(prefix) : -1]
        calls = counter_delta(before, after, key) or 0
        secs = counter_delta(before, after, f"timeshard_store_operation_seconds_total{{op={op}}}")
        if calls and secs is not None:
            rows.append((calls, op, secs))
    for calls, op, secs in sorted(rows, reverse=True):
        out[op] = {"calls": int(calls), "ms": round(secs * 1000 / calls, 2)}
    return out


def fire_phase(
    ts: Timeshard,
    records: RunRecords,
    *,
    jobs: int,
    window_s: float,
    mode: str,
    lead_s: float | None,
    drain_s: float,
    store_kind: str,
    clients: int = 1,
) -> tuple[dict[str, Any], list[tuple[float, float, float]]]:
    """Schedule ``jobs`` due uniformly over ``window_s`` from ``lead_s`` ahead (from a warm-up
    by default: ingest ends before the first is due), then follow them until they ran."""
    if lead_s is None:
        rate = warmup_rate(ts.address, mode, clients=clients)
        lead_s = max(3.0, 1.3 * jobs / rate + 1.0)
        note(f"warm-up: {rate:,.0f} jobs/s ({mode}); first due in {lead_s:.1f} s")
    first_due = int(now_ms() + lead_s * 1000)
    run_ats = [first_due + round(i * window_s * 1000 / jobs) for i in range(jobs)]
    cpu0, ctr0 = ts.cpu(), ts.counters()
    progress = Progress("ingest", jobs)
    ids = schedule(ts.address, run_ats, mode, progress, clients=clients)
    ingest = progress.close()
    ran_past_due = now_ms() > first_due
    if ran_past_due:
        note("warning: ingest ran past the first due time (raise --lead)")
    cpu1, ctr1, t1 = ts.cpu(), ts.counters(), time.monotonic()
    with sampled("fire", ts.pids()):
        wait_fired(ts, records, jobs, (run_ats[0], run_ats[-1]), drain_s)
    cpu2, ctr2, t2 = ts.cpu(), ts.counters(), time.monotonic()
    result = figures(records, ids, first_due)
    fired = result["fired"]
    ingest_cpu, fire_cpu = cpu_delta(cpu0, cpu1), cpu_delta(cpu1, cpu2)
    out: dict[str, Any] = {
        "jobs": jobs,
        "window_s": window_s,
        "offered_per_s": round(jobs / window_s, 1) if window_s else None,
        "mode": mode,
        "clients": clients if mode == "single" else None,
        "lead_s": round(lead_s, 2),
        "ingest_per_s": ingest["per_second"],
        "ingest_s": ingest["seconds"],
        "ingest_ran_past_due": ran_past_due,
        **result,
        "cpu_s_per_1k": {
            "server_ingest": per_1k(ingest_cpu["server"], jobs),
            "client_ingest": per_1k(ingest_cpu["client"], jobs),
            "server_fire": per_1k(fire_cpu["server"], fired),
            "workers_fire": per_1k(fire_cpu["workers"], fired),
        },
        "per_fired_job": fired_costs(store_kind, fire_cpu, ctr1, ctr2, fired),
        "per_node": node_figures(ts, fire_cpu, ctr1, ctr2, fired),
        "server_time": time_breakdown(ctr1, ctr2),
    }
    for name, node in (out["per_node"] or {}).items():  # created during the ingest
        node["scheduled"] = int(counter_delta(ctr0, ctr1, f"{name}/{SCHEDULED}") or 0)
    if store_kind == "cassandra":
        out["paxos_rounds_per_ingested_job"] = per_job(counter_delta(ctr0, ctr1, ROUNDS), jobs)
        reads = bucket_reads(ctr1, ctr2)
        out["bucket_reads_per_s"] = round(reads / (t2 - t1), 1) if reads is not None else None
    return out, timeline(records, ids)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def fire(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    window = args.jobs / args.rate if args.rate else args.window
    with running(args) as (ts, store, records):
        result, rows = fire_phase(
            ts,
            records,
            jobs=args.jobs,
            window_s=window,
            mode=args.mode,
            lead_s=args.lead,
            drain_s=args.drain,
            store_kind=store.kind,
            clients=getattr(args, "clients", 1),
        )
    result = {
        "scenario": "fire",
        "store": store.kind,
        "nodes": args.nodes,
        "workers": args.workers,
        **result,
    }
    if store.kind == "cassandra":
        result.update(lwt_ceiling(args, store, result.get("fire_per_s")))
    result["machine"] = machine()
    return result, [("timeshard " + store.kind, rows)]


def lwt_ceiling(args: argparse.Namespace, store: Store, fire_per_s: float | None) -> dict[str, Any]:
    """The single-row LWT rate of the same Cassandra, measured now (after the run)."""
    note(f"raw single-row LWTs on the same Cassandra for {args.lwt_seconds:g} s")
    keyspace = store.keyspace
    try:
        if store.drop and not args.keep:  # the run's keyspace is gone: use another, fresh one
            keyspace = cass.fresh_keyspace("loadtest_lwt")
            create_keyspace(f"cassandra://{store.cassandra}/{keyspace}", args.shards)
        raw = cass.raw_lwt(store.cassandra, keyspace, seconds=args.lwt_seconds)
    finally:
        if keyspace != store.keyspace:
            drop_keyspace(store.cassandra, keyspace)
    lwt = raw["per_second"]
    return {
        "single_row_lwt_per_s": lwt,
        "fire_over_single_row_lwt": round(fire_per_s / lwt, 2) if fire_per_s and lwt else None,
    }


def disk_figures(store: Store, jobs: int) -> dict[str, Any]:
    """Bytes on disk now (Cassandra: every table of the keyspace, after a flush) and per job
    stored (``jobs``: the future ones plus the bursts fired so far, finished but kept for
    their retention)."""
    if store.kind == "cassandra":
        note("flushing the keyspace's memtables to measure its tables on disk")
        sizes = cass.table_bytes(store.cassandra, store.keyspace)
        total, tables = sizes["total"], sizes["tables"]
    else:
        total, tables = store.size_bytes(), None
    return {
        "store_bytes": total,
        "store_bytes_by_table": {t: b for t, b in (tables or {}).items() if b} or None,
        "bytes_per_stored_job": round(total / jobs, 1) if total and jobs else None,
    }


def backlog(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    sizes = sorted({int(s) for s in str(args.stored).replace("_", "").split(",") if s})
    rows: list[dict[str, Any]] = []
    series: list[Any] = []
    with running(args) as (ts, store, records):
        loaded, load_total_s, load_rate = 0, 0.0, 0.0
        for size in sizes:
            todo = size - loaded
            start = int(now_ms()) + DAY_MS
            step = max(1, 30 * DAY_MS // max(1, todo))  # spread over 30 days of buckets
            progress = Progress("load", todo)
            schedule(
                ts.address,
                range(start, start + todo * step, step),
                "batch",
                progress,
                keep_ids=False,
            )
            load = progress.close()
            loaded, load_total_s = size, load_total_s + load["seconds"]
            load_rate = load["per_second"] or load_rate
            records.forget()
            lead = args.lead if args.lead is not None else max(3.0, 1.3 * args.jobs / load_rate + 1)
            burst, rows_t = fire_phase(
                ts,
                records,
                jobs=args.jobs,
                window_s=args.window,
                mode="batch",
                lead_s=lead,
                drain_s=args.drain,
                store_kind=store.kind,
            )
            rows.append(
                {
                    "stored": size,
                    "load_s": load["seconds"],
                    "load_per_s": load["per_second"],
                    "load_total_s": round(load_total_s, 3),
                    **burst,
                }
            )
            series.append((f"{size:,} stored", rows_t))
            rows[-1].update(disk_figures(store, size + len(rows) * args.jobs))
    flat = [r["cpu_s_per_1k"]["server_fire"] for r in rows]
    growth = round(flat[-1] / flat[0], 3) if len(flat) > 1 and flat[0] and flat[-1] else None
    result = {
        "scenario": "backlog",
        "store": store.kind,
        "workers": args.workers,
        "burst_jobs": args.jobs,
        "results": rows,
        "server_cpu_per_fired_job_largest_over_smallest": growth,
        "machine": machine(),
    }
    return result, series
