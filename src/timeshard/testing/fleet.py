"""A cluster of real processes on this machine: ``timeshard server`` nodes sharing one store and
one ZooKeeper, and ``timeshard worker`` processes running ``timeshard.testing.recorder:worker``.

Used by the chaos and integration tests and by ``tools/failover.py``. Every process is started
here with our own ``Popen`` and ended by its pid.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from timeshard.testing.services import free_port
from timeshard.testing.waits import eventually
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import ts

CLI = [sys.executable, "-m", "timeshard.cli.main"]
JOB_TYPE = "chaos.run"
RECORDER = "timeshard.testing.recorder:worker"


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    address: str = ""
    popen: subprocess.Popen[bytes] | None = None
    files: list[Any] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass(frozen=True, kw_only=True)
class Run:
    """One run of a job's handler, as the recorder wrote it."""

    job_id: str
    attempt: int
    fence: int
    worker: str
    run_at: int
    started_at_ms: int
    start: float
    end: float
    cancelled: bool


class Fleet:
    def __init__(
        self,
        run_dir: Path,
        *,
        zookeeper: str,
        store: str,
        shards: int = 16,
        lookahead_s: float = 2.0,
        lease_s: float = 4.0,
        progress: Callable[[str], None] | None = None,
        server_flags: Sequence[str] = (),
    ) -> None:
        self.run_dir = run_dir
        self.server_flags = tuple(server_flags)
        """More flags for every ``timeshard server`` of the fleet (restarts too)."""
        self.zookeeper = zookeeper
        self.store = store
        self.shards = shards
        self.lookahead_s = lookahead_s
        self.lease_s = lease_s
        self.progress = progress or (lambda _: None)
        self.servers: dict[str, Proc] = {}
        self.workers: dict[str, Proc] = {}
        self._channels: dict[str, grpc.Channel] = {}
        run_dir.mkdir(parents=True, exist_ok=True)

    # -- processes ------------------------------------------------------------------------

    def _spawn(self, proc: Proc) -> Proc:
        out = proc.log.open("ab")
        proc.files.append(out)
        proc.popen = subprocess.Popen(
            proc.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **proc.env},
        )
        return proc

    def start_server(self, name: str, port: int | None = None, extra: Sequence[str] = ()) -> Proc:
        """``timeshard server`` on ``port`` (a free one by default); ``extra``: more flags."""
        port = port or free_port()
        argv = [
            *CLI,
            "server",
            "--coordinator",
            self.zookeeper,
            "--store",
            self.store,
            "--port",
            str(port),
            "--node-id",
            name,
            "--shards",
            str(self.shards),
            "--lookahead",
            str(self.lookahead_s),
            *self.server_flags,
            *extra,
        ]
        proc = Proc(name=name, argv=argv, log=self.run_dir / f"{name}.log", env={})
        proc.address = f"127.0.0.1:{port}"
        self.servers[name] = self._spawn(proc)
        return proc

    def restart_server(self, name: str) -> Proc:
        old = self.servers[name]
        if old.alive():
            raise RuntimeError(f"{name} is still running")
        for f in old.files:
            f.close()
        return self.start_server(name, port=int(old.address.rsplit(":", 1)[1]))

    def start_workers(
        self, count: int, target: str = RECORDER, env: dict[str, str] | None = None
    ) -> None:
        """``count`` worker processes running ``target`` (MODULE:OBJECT); each gets
        ``TIMESHARD_RECORD=<run_dir>/<name>.runs``, plus ``env``."""
        servers = ",".join(p.address for p in self.servers.values())
        first = len(self.workers)
        for i in range(first, first + count):
            name = f"worker{i}"
            argv = [
                *CLI,
                "--server",
                servers,
                "worker",
                target,
                "--lease",
                str(self.lease_s),
                "--id",
                name,
                "--quiet",
            ]
            record = {"TIMESHARD_RECORD": str(self.run_dir / f"{name}.runs")}
            proc = Proc(
                name=name,
                argv=argv,
                log=self.run_dir / f"{name}.log",
                env={**record, **(env or {})},
            )
            self.workers[name] = self._spawn(proc)

    def restart_worker(self, name: str) -> Proc:
        """Start worker ``name`` again (same command line and environment, a new pid)."""
        old = self.workers[name]
        if old.alive():
            raise RuntimeError(f"{name} is still running")
        for f in old.files:
            f.close()
        proc = Proc(name=name, argv=old.argv, log=old.log, env=old.env)
        self.workers[name] = self._spawn(proc)
        return proc

    def wait_serving(self, names: Iterable[str] | None = None, timeout: float = 60) -> None:
        for name in names or list(self.servers):
            proc = self.servers[name]

            def up(proc: Proc = proc) -> bool:
                if not proc.alive():
                    raise AssertionError(f"{proc.name} exited:\n{proc.text()[-3000:]}")
                try:
                    self.admin(proc.address).ClusterInfo(pb.ClusterInfoRequest(), timeout=2)
                except grpc.RpcError:
                    return False
                return True

            eventually(up, timeout, f"{name} to serve")

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.servers.get(name) or self.workers[name]
        os.kill(proc.pid, sig)
        if sig == signal.SIGKILL:
            assert proc.popen is not None
            proc.popen.wait(10)

    def stop_all(self) -> None:
        procs = [*self.workers.values(), *self.servers.values()]
        for proc in procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            assert proc.popen is not None
            try:
                proc.popen.wait(15)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)
            for f in proc.files:
                f.close()
        for ch in self._channels.values():
            ch.close()

    def live(self) -> list[Proc]:
        return [p for p in self.servers.values() if p.alive()]

    # -- RPCs -----------------------------------------------------------------------------

    def _channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return self._channels[address]

    def admin(self, address: str) -> pb_grpc.AdminServiceStub:
        return pb_grpc.AdminServiceStub(self._channel(address))

    def jobs(self, address: str) -> pb_grpc.JobServiceStub:
        return pb_grpc.JobServiceStub(self._channel(address))

    def _any(self, call: Callable[[str], Any], avoid: Iterable[str] = ()) -> Any:
        """``call(address)`` on the first live server that answers."""
        error: Exception | None = None
        for proc in self.live():
            if proc.name in avoid:
                continue
            try:
                return call(proc.address)
            except grpc.RpcError as exc:
                error = exc
        raise AssertionError(f"no server answered: {error}")

    def owners(self, avoid: Iterable[str] = ()) -> dict[int, pb.ShardInfo]:
        """shard -> its ShardInfo, as a live server outside ``avoid`` reports it."""
        resp = self._any(
            lambda a: self.admin(a).ShardOwners(pb.ShardOwnersRequest(), timeout=10), avoid
        )
        return {s.shard: s for s in resp.shards}

    def owned_by(self, node: str, avoid: Iterable[str] = ()) -> set[int]:
        return {s for s, info in self.owners(avoid).items() if info.owner == node}

    def wait_spread(self, nodes: Iterable[str], timeout: float = 30) -> dict[int, pb.ShardInfo]:
        """Wait until every shard is owned by one of ``nodes`` and each has its share."""
        nodes = set(nodes)

        def spread(owners: dict[int, pb.ShardInfo]) -> bool:
            counts = [sum(1 for i in owners.values() if i.owner == n) for n in nodes]
            return (
                len(owners) == self.shards
                and all(i.owner in nodes for i in owners.values())
                and max(counts) - min(counts) <= 1
            )

        return eventually(self.owners, timeout, f"shards spread on {nodes}", until=spread)

    def schedule(
        self,
        run_ats_ms: list[int],
        *,
        seconds: float = 0.05,
        tag: str = "",
        avoid: Iterable[str] = (),
    ) -> list[str]:
        """Schedule one ``chaos.run`` job per time (through a server not in ``avoid``); returns
        the job ids in the same order."""
        ids: list[str] = []
        for chunk_start in range(0, len(run_ats_ms), 200):
            chunk = run_ats_ms[chunk_start : chunk_start + 200]
            request = pb.ScheduleJobsRequest(
                jobs=[
                    pb.ScheduleJobRequest(
                        type=JOB_TYPE,
                        payload=json.dumps({"seconds": seconds}).encode(),
                        run_at=ts(run_at),
                        idempotency_key=f"{tag}-{chunk_start + i}",
                    )
                    for i, run_at in enumerate(chunk)
                ]
            )
            resp = self._any(partial(self._schedule_jobs, request=request), avoid)
            ids += [r.job.job_id for r in resp.results]
        return ids

    def get_jobs(self, job_ids: Iterable[str]) -> dict[str, pb.Job]:
        out: dict[str, pb.Job] = {}
        for job_id in job_ids:
            out[job_id] = self._any(partial(self._get_job, job_id=job_id))
        return out

    def _schedule_jobs(self, address: str, request: pb.ScheduleJobsRequest) -> Any:
        return self.jobs(address).ScheduleJobs(request, timeout=30)

    def _get_job(self, address: str, job_id: str) -> pb.Job:
        job: pb.Job = self.jobs(address).GetJob(pb.GetJobRequest(job_id=job_id), timeout=10)
        return job

    def wait_succeeded(self, job_ids: list[str], timeout: float) -> dict[str, pb.Job]:
        """Wait until every job succeeded (checking the ones not done yet each round)."""
        done: dict[str, pb.Job] = {}

        def not_succeeded() -> dict[str, str]:
            """The state of each job not seen succeeded yet."""
            todo = [j for j in job_ids if j not in done]
            left: dict[str, str] = {}
            for job_id, job in self.get_jobs(todo).items():
                if job.state == pb.JOB_STATE_SUCCEEDED:
                    done[job_id] = job
                else:
                    left[job_id] = pb.JobState.Name(job.state)
            return left

        what = f"{len(job_ids)} jobs to succeed"
        eventually(not_succeeded, timeout, what, until=lambda left: not left, every=0.5)
        return done

    # -- what the workers saw -------------------------------------------------------------

    def runs(self) -> list[Run]:
        out: list[Run] = []
        for path in self.run_dir.glob("*.runs"):
            for line in path.read_text().splitlines():
                if line.strip():
                    out.append(Run(**json.loads(line)))
        return out

    def logs(self) -> Iterator[tuple[str, str]]:
        for proc in [*self.servers.values(), *self.workers.values()]:
            yield proc.name, proc.text()


def overlapping(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """Jobs whose handler ran twice at the same time (by the wall clock of this machine)."""
    by_job: dict[str, list[Run]] = {}
    for r in runs:
        by_job.setdefault(r.job_id, []).append(r)
    bad: dict[str, list[Run]] = {}
    for job_id, rs in by_job.items():
        rs.sort(key=lambda r: r.start)
        if any(b.start < a.end for a, b in itertools.pairwise(rs)):
            bad[job_id] = rs
    return bad


def first_runs(runs: Iterable[Run]) -> dict[str, Run]:
    """Each job's earliest run."""
    out: dict[str, Run] = {}
    for r in sorted(runs, key=lambda r: r.start):
        out.setdefault(r.job_id, r)
    return out
