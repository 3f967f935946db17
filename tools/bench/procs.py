"""The system under test as real processes: ``timeshard server`` nodes (one on the local
coordinator, or N on ZooKeeper sharing the store) with their metrics endpoints and W processes
of the no-op load worker (or of ``--worker-command``), started and ended by pid through
``timeshard.testing.fleet``; their CPU time read from /proc."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from timeshard.testing.fleet import Fleet, Proc
from timeshard.testing.services import free_port

from .external import ExternalWorker, parse_command, tree_cpu_seconds

LOADWORKER = "timeshard.testing.loadworker:worker"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (from /proc; psutil where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            import psutil  # type: ignore[import-untyped]
        except ImportError:
            return None
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return None
        return float(t.user + t.system)
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 (state) is [0]
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15


def own_cpu_seconds() -> float:
    return time.process_time()


class Timeshard:
    """Servers on ``store_url`` plus ``workers`` load-worker processes, logs in ``run_dir``.
    One server on the local coordinator by default; with ``zookeeper`` (a
    ``zookeeper://...`` URL), ``nodes`` servers that share the shards through it. The workers
    run ``worker_target`` (the no-op load worker by default) with ``worker_env`` and
    ``lease_s`` (their ``--lease``)."""

    def __init__(
        self,
        run_dir: Path,
        store_url: str,
        *,
        shards: int,
        workers: int,
        concurrency: int,
        lookahead_s: float,
        worker_command: str | None = None,
        nodes: int = 1,
        zookeeper: str = "",
        lease_s: float = 60.0,
        worker_target: str = LOADWORKER,
        worker_env: dict[str, str] | None = None,
        server_flags: Sequence[str] = (),
    ) -> None:
        self.run_dir = run_dir
        self.server_flags = list(server_flags)
        self.worker_argv = parse_command(worker_command) if worker_command else None
        self.external: list[ExternalWorker] = []
        self.fleet = Fleet(
            run_dir,
            zookeeper=zookeeper or "local",
            store=store_url,
            shards=shards,
            lookahead_s=lookahead_s,
            lease_s=lease_s,
        )
        self.names = ["server"] if not zookeeper else [f"node{i + 1}" for i in range(nodes)]
        self.worker_count = workers
        self.concurrency = concurrency
        self.worker_target = worker_target
        self.worker_env = worker_env or {}
        self.metrics_ports: dict[str, int] = {}
        self.killed: set[str] = set()
        self.cassandra_pid: int | None = None
        """A Cassandra on this machine: its CPU is read too (``cassandra``; it may serve others'
        work as well)."""

    @property
    def server(self) -> Proc:
        return self.fleet.servers[self.names[0]]

    @property
    def servers(self) -> list[Proc]:
        return [self.fleet.servers[n] for n in self.names if n not in self.killed]

    def pids(self) -> dict[str, int]:
        """Each live server's pid, by name."""
        return {p.name: p.pid for p in self.servers}

    @property
    def address(self) -> str:
        """Every live node's gRPC address, comma-separated (clients take turns)."""
        return ",".join(p.address for p in self.servers)

    @property
    def metrics_port(self) -> int:
        return self.metrics_ports.get(self.names[0], 0)

    def start(self) -> None:
        for name in self.names:
            self.metrics_ports[name] = port = free_port()
            self.fleet.start_server(name, extra=["--metrics-port", str(port), *self.server_flags])
        self.fleet.wait_serving(timeout=180)
        if len(self.names) > 1 or self.fleet.zookeeper != "local":
            self.fleet.wait_spread(self.names, timeout=180)
        if self.worker_argv is None:
            self.fleet.start_workers(
                self.worker_count,
                target=self.worker_target,
                env={"TIMESHARD_LOADTEST_CONCURRENCY": str(self.concurrency), **self.worker_env},
            )
            return
        for i in range(self.worker_count):
            name = f"worker{i}"
            worker = ExternalWorker(
                name=name,
                argv=self.worker_argv,
                log=self.run_dir / f"{name}.log",
                env={
                    "TIMESHARD_SERVER": self.address,
                    "TIMESHARD_RECORD": str(self.run_dir / f"{name}.runs"),
                    "TIMESHARD_CONCURRENCY": str(self.concurrency),
                },
            )
            worker.start()
            self.external.append(worker)

    def kill(self, name: str) -> None:
        """kill -9 one node (it stays dead; the figures leave it out from then on)."""
        self.fleet.signal(name, signal.SIGKILL)
        self.killed.add(name)

    def _workers(self) -> list[Proc | ExternalWorker]:
        return [*self.fleet.workers.values(), *self.external]

    def record_paths(self) -> list[Path]:
        return [self.run_dir / f"{w.name}.runs" for w in self._workers()]

    def check_alive(self) -> None:
        for proc in [*self.servers, *self._workers()]:
            if not proc.alive():
                raise SystemExit(f"{proc.name} exited; its log ends:\n{proc.text()[-3000:]}")

    def cpu(self) -> dict[str, float | None]:
        """CPU seconds so far: ``server`` summed over the live nodes (and ``server:<name>``
        for each when there are several), ``workers``, ``client`` (this process)."""
        if self.external:
            workers: float | None = tree_cpu_seconds([w.pid for w in self.external])
        else:
            each = [cpu_seconds(p.pid) for p in self.fleet.workers.values()]
            workers = None if None in each else sum(w or 0.0 for w in each)
        nodes = {p.name: cpu_seconds(p.pid) for p in self.servers}
        out: dict[str, float | None] = {
            "server": None if None in nodes.values() else sum(v or 0.0 for v in nodes.values()),
            "workers": workers,
            "client": own_cpu_seconds(),
        }
        if len(self.names) > 1:
            out.update({f"server:{n}": v for n, v in nodes.items()})
        if self.cassandra_pid is not None:
            out["cassandra"] = cpu_seconds(self.cassandra_pid)
        return out

    def scrape(self, name: str) -> dict[str, float]:
        """One node's ``timeshard_*`` samples now: ``_total`` counters summed over their
        labels, and by ``kind`` or ``op`` too where they have one (``...{kind=claim}``,
        ``timeshard_store_operations_total{op=read_bucket}``); gauges as they are (summed over
        their labels); ``generation`` (the GC time) is kept as well. Empty when the endpoint
        does not answer."""
        url = f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not s.name.startswith("timeshard_"):
                    continue
                out[s.name] = out.get(s.name, 0.0) + s.value
                for label in ("kind", "op", "grpc_method", "generation", "direction", "outcome"):
                    if label in s.labels and s.name.endswith(_SUMMED):
                        key = f"{s.name}{{{label}={s.labels[label]}}}"
                        out[key] = out.get(key, 0.0) + s.value
        return out

    def counters(self) -> dict[str, float]:
        """The counters (and histograms' sums and counts) of every live node, summed (see
        ``scrape``), and each node's own as ``<name>/<counter>`` when there are several."""
        out: dict[str, float] = {}
        for proc in self.servers:
            for key, value in self.scrape(proc.name).items():
                if not key.split("{", 1)[0].endswith(_SUMMED):
                    continue
                out[key] = out.get(key, 0.0) + value
                if len(self.names) > 1:
                    out[f"{proc.name}/{key}"] = value
        return out

    def stop_workers(self) -> None:
        """End the workers (SIGTERM, then SIGKILL after 15 s): they write their records out
        as they exit."""
        for proc in self.fleet.workers.values():
            if proc.alive():
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.fleet.workers.values():
            assert proc.popen is not None
            try:
                proc.popen.wait(15)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)
        for worker in self.external:
            worker.stop()

    def stop(self) -> None:
        for worker in self.external:
            worker.stop()
        self.fleet.stop_all()


_SUMMED = ("_total", "_sum", "_count")
"""Counters, and histograms' sums and counts (for means over a span)."""


def cpu_delta(
    before: dict[str, float | None], after: dict[str, float | None]
) -> dict[str, float | None]:
    return {
        k: (after[k] - b) if (b := before.get(k)) is not None and after.get(k) is not None else None
        for k in after
    }


def listening_pid(host: str, port: int) -> int | None:
    """The pid of the process listening on ``host:port`` (IPv4, or all addresses) on this
    machine (from /proc), or None (not here, or /proc unreadable): the local Cassandra, whose
    CPU per fired job the capacity model needs."""
    try:
        wanted_ip = socket.gethostbyname(host)
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    inodes: set[str] = set()
    for line in lines:
        fields = line.split()
        ip_hex, port_hex = fields[1].split(":")
        ip = socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16)))
        if fields[3] == "0A" and int(port_hex, 16) == port and ip in (wanted_ip, "0.0.0.0"):
            inodes.add(fields[9])  # LISTEN on that address
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(proc.name)
        except OSError:
            continue
    return None
