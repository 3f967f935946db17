"""Carrying out the fault plan on real processes: kill -9 and restart, SIGSTOP and SIGCONT of
workers and scheduler nodes; kill -9 and restart of a ZooKeeper server, of a Cassandra node,
and of every Cassandra node at once (a store outage).

Each fault goes into the journal with the pid it hit and its start and end on the monotonic
clock (for a pause: when it was stopped and when it was continued), once it is over. A
Cassandra node starts again in the background (a minute or so) while other faults go on; the
next Cassandra fault waits for it. A store outage is carried out in the foreground: its end is
when the store answers again, and no other fault starts while the store is away.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from timeshard.stack import CassandraCluster, ZooKeeperEnsemble
from timeshard.testing.chaos.ledger import JsonLines, now_mono, now_wall_ms
from timeshard.testing.chaos.plan import Fault, FaultKind
from timeshard.testing.fleet import Fleet


class Injector:
    def __init__(
        self,
        fleet: Fleet,
        journal: JsonLines,
        plan: list[Fault],
        *,
        zookeeper: ZooKeeperEnsemble | None,
        cassandra: CassandraCluster | None,
        progress: Callable[[str], None],
    ) -> None:
        self.fleet = fleet
        self.journal = journal
        self.plan = plan
        self.zookeeper = zookeeper
        self.cassandra = cassandra
        self.progress = progress
        self.done: list[str] = []
        self.current = ""
        self.errors: list[str] = []
        self._restarting: threading.Thread | None = None

    @property
    def workers(self) -> list[str]:
        return sorted(self.fleet.workers)

    @property
    def nodes(self) -> list[str]:
        return sorted(self.fleet.servers)

    def run(self, started: float, stop: threading.Event) -> None:
        """Carry out the plan from ``started`` (monotonic) until it ends or ``stop`` is set;
        a fault under way is always finished (the process continued or started again)."""
        for fault in self.plan:
            if stop.wait(max(0.0, started + fault.at_s - time.monotonic())):
                return
            self.current = f"{fault.kind} {self._name(fault)}"
            try:
                self._carry_out(fault)
            except Exception as exc:  # a fault that could not be carried out is reported
                self.errors.append(f"{self.current}: {type(exc).__name__}: {exc}")
                self.progress(f"fault {self.current} failed: {exc}")
            self.current = ""

    def finish(self, timeout: float = 600.0) -> None:
        """Wait for a Cassandra node still starting again."""
        if self._restarting is not None:
            self._restarting.join(timeout)

    def _name(self, fault: Fault) -> str:
        if fault.kind in (FaultKind.WORKER_KILL, FaultKind.WORKER_STOP):
            return self.workers[fault.target % len(self.workers)]
        if fault.kind in (FaultKind.NODE_KILL, FaultKind.NODE_STOP):
            return self.nodes[fault.target % len(self.nodes)]
        if fault.kind is FaultKind.ZK_RESTART and self.zookeeper is not None:
            return self.zookeeper.servers[fault.target % len(self.zookeeper.servers)].address
        if fault.kind is FaultKind.CASSANDRA_KILL and self.cassandra is not None:
            return self.cassandra.nodes[fault.target % self.cassandra.size].address
        if fault.kind is FaultKind.STORE_OUTAGE and self.cassandra is not None:
            return self.cassandra.address
        return "?"

    def _record(
        self,
        fault: Fault,
        name: str,
        pid: int | None,
        start: tuple[float, float],
        end: tuple[float, float] | None = None,
        **extra: Any,
    ) -> None:
        """Journal a fault that is over: ``start`` and ``end`` as (monotonic, wall ms)."""
        end_mono, end_wall = end or (now_mono(), now_wall_ms())
        self.journal.write(
            {
                "ev": "fault",
                "kind": str(fault.kind),
                "target": name,
                "pid": pid,
                "start_mono": start[0],
                "start_wall": start[1],
                "end_mono": end_mono,
                "end_wall": end_wall,
                "hold_s": fault.hold_s,
                **extra,
            }
        )
        self.done.append(str(fault.kind))
        who = f"pid {pid}" if pid is not None else f"pids {extra.get('pids')}"
        self.progress(f"fault {fault.kind} {name} ({who}) over after {end_mono - start[0]:.1f} s")

    def _carry_out(self, fault: Fault) -> None:
        name = self._name(fault)
        self.progress(f"fault {fault.kind} {name} for {fault.hold_s:.1f} s")
        if fault.kind in (FaultKind.WORKER_STOP, FaultKind.NODE_STOP):
            self._pause(fault, name)
        elif fault.kind is FaultKind.WORKER_KILL:
            self._kill_worker(fault, name)
        elif fault.kind is FaultKind.NODE_KILL:
            self._kill_node(fault, name)
        elif fault.kind is FaultKind.ZK_RESTART:
            self._restart_zookeeper(fault, name)
        elif fault.kind is FaultKind.CASSANDRA_KILL:
            self._kill_cassandra(fault, name)
        elif fault.kind is FaultKind.STORE_OUTAGE:
            self._store_outage(fault, name)

    def _pause(self, fault: Fault, name: str) -> None:
        proc = self.fleet.servers.get(name) or self.fleet.workers[name]
        pid = proc.pid
        os.kill(pid, signal.SIGSTOP)
        start = (now_mono(), now_wall_ms())
        try:
            time.sleep(fault.hold_s)
        finally:
            # The end is taken before SIGCONT: a step after it is a step after resuming.
            end = (now_mono(), now_wall_ms())
            os.kill(pid, signal.SIGCONT)
        self._record(fault, name, pid, start, end)

    def _kill_worker(self, fault: Fault, name: str) -> None:
        pid = self.fleet.workers[name].pid
        self.fleet.signal(name, signal.SIGKILL)  # returns once the process is gone
        start = (now_mono(), now_wall_ms())
        time.sleep(fault.hold_s)
        new = self.fleet.restart_worker(name)
        self._record(fault, name, pid, start, new_pid=new.pid)

    def _kill_node(self, fault: Fault, name: str) -> None:
        pid = self.fleet.servers[name].pid
        self.fleet.signal(name, signal.SIGKILL)
        start = (now_mono(), now_wall_ms())
        time.sleep(fault.hold_s)
        new = self.fleet.restart_server(name)
        self.fleet.wait_serving([name], timeout=120)
        self._record(fault, name, pid, start, new_pid=new.pid)

    def _restart_zookeeper(self, fault: Fault, name: str) -> None:
        assert self.zookeeper is not None
        index = fault.target % len(self.zookeeper.servers)
        server = self.zookeeper.servers[index]
        pid = server.pid
        self.zookeeper.kill(index)
        start = (now_mono(), now_wall_ms())
        time.sleep(fault.hold_s)
        self.zookeeper.restart(index, timeout=120)
        self._record(fault, name, pid, start, new_pid=server.pid)

    def _wait_cassandra_restart(self) -> None:
        if self._restarting is not None and self._restarting.is_alive():
            self.progress("waiting for the Cassandra node killed before to be up again")
            self._restarting.join()

    def _kill_cassandra(self, fault: Fault, name: str) -> None:
        assert self.cassandra is not None
        self._wait_cassandra_restart()
        node = self.cassandra.nodes[fault.target % self.cassandra.size]
        pid = node.pid
        node.kill()
        start = (now_mono(), now_wall_ms())
        time.sleep(fault.hold_s)

        def restart() -> None:
            try:
                node.start(timeout=600)
            except Exception as exc:
                self.errors.append(f"cassandra {name} did not start again: {exc}")
                self.progress(f"Cassandra {name} did not start again: {exc}")
                return
            self._record(fault, name, pid, start, new_pid=node.pid)

        self._restarting = threading.Thread(target=restart, name="cassandra-restart")
        self._restarting.start()

    def _store_outage(self, fault: Fault, name: str) -> None:
        """Every node killed at once, held down, then the cluster started again; the fault is
        over (and journaled) when the store answers again. A start that fails is an error of
        the run: the store stays away, and the drain shows what that did."""
        assert self.cassandra is not None
        self._wait_cassandra_restart()
        pids = [node.pid for node in self.cassandra.nodes]
        self.cassandra.kill()  # SIGKILL to each node; returns once they are gone
        start = (now_mono(), now_wall_ms())
        time.sleep(fault.hold_s)
        self.cassandra.start(timeout=600)
        up_s = now_mono() - start[0] - fault.hold_s
        self._record(
            fault,
            name,
            None,  # several processes: see pids
            start,
            pids=pids,
            new_pids=[node.pid for node in self.cassandra.nodes],
            restart_s=round(up_s, 1),
        )
