"""The system under test as real processes: one ``timeshard server`` (local coordinator) with
its metrics endpoint and W processes of the no-op load worker (or of ``--worker-command``),
started and ended by pid through ``timeshard.testing.fleet``; their CPU time read from /proc."""

from __future__ import annotations

import os
import time
import urllib.request
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
    """A server on ``store_url`` plus ``workers`` load-worker processes, logs in ``run_dir``."""

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
    ) -> None:
        self.run_dir = run_dir
        self.worker_argv = parse_command(worker_command) if worker_command else None
        self.external: list[ExternalWorker] = []
        self.fleet = Fleet(
            run_dir,
            zookeeper="local",
            store=store_url,
            shards=shards,
            lookahead_s=lookahead_s,
            lease_s=60,
        )
        self.worker_count = workers
        self.concurrency = concurrency
        self.metrics_port = 0

    @property
    def server(self) -> Proc:
        return self.fleet.servers["server"]

    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> None:
        self.metrics_port = free_port()
        self.fleet.start_server("server", extra=["--metrics-port", str(self.metrics_port)])
        self.fleet.wait_serving(timeout=180)
        if self.worker_argv is None:
            self.fleet.start_workers(
                self.worker_count,
                target=LOADWORKER,
                env={"TIMESHARD_LOADTEST_CONCURRENCY": str(self.concurrency)},
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

    def _workers(self) -> list[Proc | ExternalWorker]:
        return [*self.fleet.workers.values(), *self.external]

    def record_paths(self) -> list[Path]:
        return [self.run_dir / f"{w.name}.runs" for w in self._workers()]

    def check_alive(self) -> None:
        for proc in [self.server, *self._workers()]:
            if not proc.alive():
                raise SystemExit(f"{proc.name} exited; its log ends:\n{proc.text()[-3000:]}")

    def cpu(self) -> dict[str, float | None]:
        if self.external:
            workers: float | None = tree_cpu_seconds([w.pid for w in self.external])
        else:
            each = [cpu_seconds(p.pid) for p in self.fleet.workers.values()]
            workers = None if None in each else sum(w or 0.0 for w in each)
        return {
            "server": cpu_seconds(self.server.pid),
            "workers": workers,
            "client": own_cpu_seconds(),
        }

    def counters(self) -> dict[str, float]:
        """The server's counters, scraped now: each ``timeshard_*`` sample summed over its
        labels, and ``timeshard_worker_messages_total`` by kind too (``...{kind=claim}``).
        Empty when the endpoint does not answer."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not s.name.startswith("timeshard_") or not s.name.endswith(_SUMMED):
                    continue
                out[s.name] = out.get(s.name, 0.0) + s.value
                for label in ("kind", "op", "grpc_method"):
                    if label in s.labels:
                        key = f"{s.name}{{{label}={s.labels[label]}}}"
                        out[key] = out.get(key, 0.0) + s.value
        return out

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
