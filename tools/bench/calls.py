"""``schedule``: the cost of one ScheduleJob call, against a floor measured in the same run.

For each client count C, C synchronous clients (separate processes, so that they do not share
one interpreter lock; they share the machine's cores with the server) call ScheduleJob one at a
time for ``--seconds``: first on a do-nothing ``grpc.aio`` server (``nullserver.py``: the same
server options, a pass-through interceptor, a reply of the same shape), then on timeshard. The
figures: calls per second and the server's CPU per call (from /proc, over the window), for each,
and timeshard's CPU per call over the floor's. The jobs are due a week ahead, of a type no
worker runs, so nothing fires meanwhile."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from timeshard.cli.grpcruntime import prefer_poller_io
from timeshard.testing.services import create_keyspace, drop_keyspace, free_port
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import ts

from . import cassandra as cass
from . import profiling
from .procs import cpu_seconds
from .progress import note
from .scenarios import Store, machine, running
from .submit import WARMUP_TYPE, now_ms

WARM_CALLS = 300
WEEK_MS = 7 * 86_400_000


def _client(address: str, start: Any, stop: Any, counts: Any, k: int) -> None:
    """One synchronous client: warm up, then call until ``stop``; counts the calls that were
    answered while the window was open."""
    far = int(now_ms()) + WEEK_MS
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.JobServiceStub(channel)

        def call(i: int) -> None:
            req = pb.ScheduleJobRequest(type=WARMUP_TYPE, payload=b"{}", run_at=ts(far + i))
            stub.ScheduleJob(req, timeout=60)

        for i in range(WARM_CALLS):
            call(i)
        counts[k] = -1  # ready
        start.wait()
        done = 0
        while not stop.is_set():
            call(done)
            done += 1
        counts[k] = done


def idle_cpu_ms_per_s(pid: int, seconds: float = 2.0) -> float | None:
    """The server's CPU with no calls (its own loops: a dispatcher reading its buckets)."""
    cpu0 = cpu_seconds(pid)
    time.sleep(seconds)
    cpu1 = cpu_seconds(pid)
    return round((cpu1 - cpu0) / seconds * 1000, 2) if cpu0 is not None and cpu1 else None


def measure(
    address: str,
    pid: int,
    clients: int,
    seconds: float,
    counters: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # grpc's channels do not survive a fork
    start, stop = ctx.Event(), ctx.Event()
    counts = ctx.Array("q", clients)
    procs = [
        ctx.Process(target=_client, args=(address, start, stop, counts, k), daemon=True)
        for k in range(clients)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    while any(counts[k] != -1 for k in range(clients)):
        if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
            for p in procs:
                p.kill()
            raise SystemExit("loadtest: a ScheduleJob client did not get ready (see above)")
        time.sleep(0.05)
    ctr0 = counters() if counters else {}
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    start.set()
    time.sleep(seconds)
    stop.set()
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    ctr1 = counters() if counters else {}
    for p in procs:
        p.join(60)
    calls = sum(counts[k] for k in range(clients))
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    out: dict[str, Any] = {
        "calls_per_s": round(calls / (t1 - t0), 1),
        "server_cpu_ms_per_call": round(cpu / calls * 1000, 4)
        if cpu is not None and calls
        else None,
    }
    for name, key in WRITES.items():
        if name in ctr1 and ctr0 and calls:
            out[key] = round((ctr1[name] - ctr0.get(name, 0.0)) / calls, 3)
    return out


WRITES = {
    # the embedded store counts each transaction as one round (its "Paxos round")
    "timeshard_store_paxos_rounds_total": "store_rounds_per_call",
    "timeshard_store_operations_total": "store_requests_per_call",
}
"""Store counters shown per call: how far the group commit shares writes among callers."""


class NullServer:
    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._log = log.open("ab")
        script = Path(__file__).with_name("nullserver.py")
        env = dict(os.environ)
        prefer_poller_io(env)  # on the gRPC I/O path of timeshard's server
        self.popen = subprocess.Popen(
            [sys.executable, str(script), str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def wait_serving(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                raise SystemExit("loadtest: the null server did not start") from None
        if self.popen.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("loadtest: the null server exited")

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()


def schedule_cost(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    counts = sorted({int(c) for c in str(args.clients).split(",") if c})
    if not counts or counts[0] < 1:
        raise SystemExit(f"--clients {args.clients!r}: give client counts >= 1, e.g. 1,8")
    args.workers = 0
    rows: list[dict[str, Any]] = []
    with running(args) as (ts_, store, _records):
        null = NullServer(ts_.run_dir / "nullserver.log")
        try:
            null.wait_serving()
            idle = idle_cpu_ms_per_s(ts_.server.pid)
            for c in counts:
                note(f"{c} synchronous client(s): the null server for {args.seconds:g} s")
                floor = measure(null.address, null.popen.pid, c, args.seconds)
                note(f"{c} synchronous client(s): timeshard ({store.kind}) for {args.seconds:g} s")
                with profiling.sampled(f"schedule{c}", {"server": ts_.server.pid}):
                    ours = measure(ts_.address, ts_.server.pid, c, args.seconds, ts_.counters)
                a, b = ours["server_cpu_ms_per_call"], floor["server_cpu_ms_per_call"]
                rows.append(
                    {
                        "clients": c,
                        "timeshard": ours,
                        "null_servicer": floor,
                        "cpu_over_floor_ms": round(a - b, 4) if a and b else None,
                        "cpu_ratio": round(a / b, 2) if a and b else None,
                        "calls_ratio": round(ours["calls_per_s"] / floor["calls_per_s"], 2)
                        if floor["calls_per_s"]
                        else None,
                    }
                )
        finally:
            null.stop()
    floor = driver_floor(args, store) if store.kind == "cassandra" else None
    result = {
        "scenario": "schedule",
        "store": store.kind,
        "seconds": args.seconds,
        "server_idle_cpu_ms_per_s": idle,
        "results": rows,
        **({"cassandra_driver_floor": floor} if floor else {}),
        "machine": machine(),
    }
    return result, []


def driver_floor(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """What one request costs the Cassandra driver alone, on a fresh keyspace (dropped)."""
    keyspace = cass.fresh_keyspace("loadtest_plain")
    note(f"the driver alone: 1,000 plain single-row writes one at a time ({keyspace})")
    create_keyspace(f"cassandra://{store.cassandra}/{keyspace}", args.shards)
    try:
        return cass.raw_writes(store.cassandra, keyspace)
    finally:
        drop_keyspace(store.cassandra, keyspace)
