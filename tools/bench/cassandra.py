"""Cassandra side of the benchmarks: the raw ceiling (plain single-row lightweight transactions
through the driver alone, ``UPDATE ... IF v = 0`` on distinct rows), store URLs, and a
keyspace's bytes on disk after a flush."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from timeshard.testing.services import cassandra_cluster

from .progress import Progress


def split_store_url(url: str) -> tuple[str, str]:
    """``cassandra://host:port/ks`` -> (``host:port``, ``ks`` or "")."""
    parts = urlsplit(url)
    return parts.netloc, parts.path.strip("/")


def fresh_keyspace(prefix: str = "loadtest") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def raw_lwt(
    address: str,
    keyspace: str,
    *,
    n: int | None = None,
    seconds: float | None = None,
    concurrency: int = 256,
) -> dict[str, Any]:
    """Single-row conditional updates, ``concurrency`` in flight, until ``n`` are done or
    ``seconds`` of them have run; rows are inserted (untimed) a chunk at a time. The keyspace must
    exist; the table ``bench_lwt`` is made in it."""
    from cassandra.concurrent import execute_concurrent_with_args

    if n is None and seconds is None:
        raise ValueError("give n or seconds")
    cluster = cassandra_cluster(address, request_timeout=30)
    session = cluster.connect()
    try:
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {keyspace}.bench_lwt (k text PRIMARY KEY, v bigint)"
        )
        insert = session.prepare(f"INSERT INTO {keyspace}.bench_lwt (k, v) VALUES (?, 0)")
        update = session.prepare(f"UPDATE {keyspace}.bench_lwt SET v = 1 WHERE k = ? IF v = 0")
        run = uuid.uuid4().hex[:8]
        progress = Progress("raw LWT", n or 0)
        done, timed = 0, 0.0
        chunk_size = concurrency  # small chunks: the time bound is kept at ~150 LWT/s too
        while (n is None or done < n) and (seconds is None or timed < seconds):
            size = chunk_size if n is None else min(chunk_size, n - done)
            keys = [(f"{run}-{done + i}",) for i in range(size)]
            execute_concurrent_with_args(session, insert, keys, concurrency=concurrency)
            t0 = time.monotonic()
            results = execute_concurrent_with_args(session, update, keys, concurrency=concurrency)
            timed += time.monotonic() - t0
            failed = [r for ok, r in results if not ok or not r.was_applied]
            if failed:
                raise SystemExit(f"raw LWT: {len(failed)} writes failed or did not apply")
            done += size
            if n is None:
                progress.total = done
            progress.update(done)
        progress.close()
        return {
            "operation": "raw LWT (UPDATE ... IF)",
            "count": done,
            "seconds": round(timed, 3),
            "per_second": round(done / timed, 1) if timed else 0.0,
        }
    finally:
        cluster.shutdown()


def raw_writes(address: str, keyspace: str, *, n: int = 1000) -> dict[str, Any]:
    """The driver's own floor for one request: ``n`` plain single-row INSERTs one at a time
    (as one synchronous caller makes them), with this process's CPU per write (the driver's I/O
    thread included). The keyspace must exist; the table ``bench_plain`` is made in it."""
    cluster = cassandra_cluster(address, request_timeout=30)
    session = cluster.connect()
    try:
        session.execute(
            f"CREATE TABLE IF NOT EXISTS {keyspace}.bench_plain (k text PRIMARY KEY, v bigint)"
        )
        insert = session.prepare(f"INSERT INTO {keyspace}.bench_plain (k, v) VALUES (?, 0)")
        run = uuid.uuid4().hex[:8]
        for i in range(100):  # warm: connections, the prepared statement
            session.execute(insert, (f"{run}-warm-{i}",))
        cpu0, t0 = time.process_time(), time.monotonic()
        for i in range(n):
            session.execute(insert, (f"{run}-{i}",))
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        return {
            "operation": "plain INSERT, one at a time",
            "writes_per_s": round(n / wall, 1),
            "client_cpu_ms_per_write": round(cpu / n * 1000, 4),
        }
    finally:
        cluster.shutdown()


def table_bytes(address: str, keyspace: str, *, flush_wait_s: float = 4.0) -> dict[str, Any]:
    """Bytes on disk of each table of ``keyspace``, after a flush.

    There is no flush in CQL and no nodetool here, so each table's memtable is made to flush by
    setting ``memtable_flush_period_in_ms`` to one second for a few seconds (then back to 0).
    The sizes then come from the SSTable files when the node's data directory (the
    ``data_file_directories`` setting, from ``system_views.settings``) is on this machine,
    else from ``system_views.disk_usage`` (whole MiB)."""
    cluster = cassandra_cluster(address, request_timeout=60)
    session = cluster.connect()
    try:
        tables = [
            r.table_name
            for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
                (keyspace,),
            )
        ]
        for t in tables:
            session.execute(f"ALTER TABLE {keyspace}.{t} WITH memtable_flush_period_in_ms = 1000")
        time.sleep(flush_wait_s)
        for t in tables:
            session.execute(f"ALTER TABLE {keyspace}.{t} WITH memtable_flush_period_in_ms = 0")
        dirs = _setting(session, "data_file_directories")
        by_table = _files_by_table(dirs, keyspace, tables)
        how = "sstable files"
        if by_table is None:
            how = "system_views.disk_usage (MiB)"
            rows = session.execute(
                "SELECT table_name, mebibytes FROM system_views.disk_usage "
                "WHERE keyspace_name = %s",
                (keyspace,),
            )
            by_table = {r.table_name: int(r.mebibytes) * 1024 * 1024 for r in rows}
        return {"tables": by_table, "total": sum(by_table.values()), "measured_from": how}
    finally:
        cluster.shutdown()


def _setting(session: Any, name: str) -> str:
    rows = list(session.execute("SELECT name, value FROM system_views.settings"))
    return next((r.value for r in rows if r.name == name), "") or ""


def _files_by_table(dirs: str, keyspace: str, tables: list[str]) -> dict[str, int] | None:
    """SSTable bytes per table under the data directories (``[a, b]`` or ``a``), without
    snapshots and backups; None when none of them is on this machine."""
    roots = [Path(d.strip(" []'\"")) / keyspace for d in dirs.split(",") if d.strip(" []")]
    roots = [r for r in roots if r.is_dir()]
    if not roots:
        return None
    out = dict.fromkeys(tables, 0)
    for root in roots:
        for table_dir in root.iterdir():
            name = table_dir.name.rsplit("-", 1)[0]  # <table>-<id>
            if name not in out:
                continue
            out[name] += sum(f.stat().st_size for f in table_dir.iterdir() if f.is_file())
    return out


def server_latencies(address: str, keyspace: str) -> dict[str, Any]:
    """Cassandra's own view of the run just ended: the coordinator's recent write and read
    latency per table of ``keyspace`` (p50 / p99 / max in ms, from the node's decaying
    histograms, so taken right after a run they describe it) and the thread pools that have
    tasks waiting. Beside the store's latency as the node saw it (``store_ms_per_call``), it
    tells a slow Cassandra from a queue on the client's side (the driver, the event loop).
    Conditional writes are not in these tables (Cassandra counts them apart)."""
    cluster = cassandra_cluster(address, request_timeout=30)
    session = cluster.connect()
    try:
        out: dict[str, Any] = {}
        for kind in ("write", "read"):
            rows = session.execute(
                f"SELECT table_name, count, p50th_ms, p99th_ms, max_ms "
                f"FROM system_views.coordinator_{kind}_latency WHERE keyspace_name = %s",
                (keyspace,),
            )
            for r in rows:
                if r.count:
                    out.setdefault(r.table_name, {})[kind] = {
                        "p50": round(r.p50th_ms, 2),
                        "p99": round(r.p99th_ms, 2),
                        "max": round(r.max_ms, 2),
                    }
        pools = session.execute(
            "SELECT name, active_tasks, pending_tasks FROM system_views.thread_pools"
        )
        waiting = {p.name: p.pending_tasks for p in pools if p.pending_tasks}
        return {"by_table_ms": out, "pools_with_pending_tasks": waiting}
    finally:
        cluster.shutdown()
