"""One chaos run: a fresh keyspace and ZooKeeper path, 3 scheduler nodes and 4 chaos workers
(``Fleet``), two cron schedules (every second, every minute), the workload and the fault plan
side by side for ``duration_s``, then the drain: faults over, every process up, schedules
paused, and every job terminal (or the drain's time up). The store as the API shows it then is
written down, the processes stopped, and the checker reads it all.

    report = ChaosRun(config, services, run_dir).run()

``Services`` says what runs the store and the coordinator, and whether this run may restart
their servers (an ensemble or a Cassandra cluster it was handed as objects) or only use them
(addresses only: those faults are left out of the plan).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from timeshard.node.dispatchconfig import DEFAULT_CLAIM_AHEAD_MS
from timeshard.stack import CassandraCluster, ZooKeeperEnsemble
from timeshard.testing.attempts import STATE_NAMES, TERMINAL, job_summary
from timeshard.testing.chaos.check import Report, check_dir
from timeshard.testing.chaos.faults import Injector
from timeshard.testing.chaos.ledger import (
    JOB_TYPE,
    JOURNAL,
    LEDGER_DIR,
    RATED_TYPE,
    STORE,
    JsonLines,
    now_wall_ms,
    read_lines,
)
from timeshard.testing.chaos.load import Api, GaveUp, LoadShape, Workload
from timeshard.testing.chaos.occurrences import ledger_entry
from timeshard.testing.chaos.plan import FaultKind, PlanShape, fault_plan
from timeshard.testing.fleet import Fleet
from timeshard.testing.services import create_keyspace, drop_keyspace
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, ts, ts_ms

NODES = ("a", "b", "c")
WORKER_TARGET = "timeshard.testing.chaos.worker:worker"
CRONS = (("sec", "* * * * * *", 1000), ("min", "* * * * *", 60_000))
RATED_RATE = 1.5
LEDGER_PAGE = 200
"""Ledger entries read back a call (``ExplainOccurrence``'s most)."""
"""Jobs of ``RATED_TYPE`` started per second across the cluster: above what the load offers of
it on average (so the backlog of its pause drains), below its bursts."""
PAUSED_SPAN = (1 / 3, 2 / 3)
"""The part of the load during which ``RATED_TYPE`` is paused."""
"""(name, expression, period ms): every second and every minute, in UTC."""


def say(message: str) -> None:
    sys.stderr.write(f"chaos: {message}\n")
    sys.stderr.flush()


@dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    duration_s: float = 300.0
    rate: float = 10.0
    seed: int = 1
    shards: int = 32
    workers: int = 4
    lease_s: float = 4.0
    session_s: float = 4.0
    lookahead_s: float = 2.0
    claim_ahead_ms: int = DEFAULT_CLAIM_AHEAD_MS
    """The nodes' ``--claim-ahead-ms`` (as the server's default; 0: off): jobs claimed ahead
    and pushed before they are due start on their workers' clocks."""
    drain_s: float = 300.0
    """How long the drain may take before what is not terminal counts as lost."""
    fault_gap_s: tuple[float, float] = (6.0, 16.0)
    faults: bool = True
    fault_kinds: tuple[FaultKind, ...] = ()
    """Only these kinds in the plan (each must be one the run can inject); empty: all it can."""
    keep_keyspace: bool = False


@dataclass(kw_only=True)
class Services:
    zookeeper: str
    cassandra: str
    ensemble: ZooKeeperEnsemble | None = None
    cluster: CassandraCluster | None = None

    @property
    def cassandra_nodes(self) -> int:
        return len(self.cassandra.split(","))

    def store_url(self, keyspace: str) -> str:
        if self.cassandra_nodes >= 3:
            return f"cassandra://{self.cassandra}/{keyspace}?rf=3&consistency=quorum&serial=serial"
        return f"cassandra://{self.cassandra}/{keyspace}"

    def fault_kinds(self) -> tuple[FaultKind, ...]:
        return injectable_kinds(
            zookeepers=len(self.ensemble.servers) if self.ensemble is not None else 0,
            cassandras=self.cluster.size if self.cluster is not None else 0,
        )


def injectable_kinds(*, zookeepers: int, cassandras: int) -> tuple[FaultKind, ...]:
    """The fault kinds a run can inject with this many ZooKeeper servers and Cassandra nodes
    of its own (0: none, or only addresses to use). One server of three may restart and one
    Cassandra node of three may be killed without taking the service away; a store outage
    takes every Cassandra node away, so one node of its own is enough."""
    kinds = [FaultKind.WORKER_KILL, FaultKind.WORKER_STOP]
    kinds += [FaultKind.NODE_KILL, FaultKind.NODE_STOP]
    if zookeepers >= 3:
        kinds.append(FaultKind.ZK_RESTART)
    if cassandras >= 3:
        kinds.append(FaultKind.CASSANDRA_KILL)
    if cassandras >= 1:
        kinds.append(FaultKind.STORE_OUTAGE)
    return tuple(kinds)


def chosen_kinds(
    available: tuple[FaultKind, ...], only: tuple[FaultKind, ...]
) -> tuple[FaultKind, ...]:
    """``available`` narrowed to ``only`` (empty: all of them); a kind asked for that this run
    cannot inject is an error, not a quietly shorter plan."""
    if not only:
        return available
    missing = [str(k) for k in only if k not in available]
    if missing:
        raise ValueError(
            f"fault kinds {', '.join(missing)} cannot be injected here "
            f"(this run can: {', '.join(map(str, available))})"
        )
    return tuple(k for k in available if k in only)


@dataclass(kw_only=True)
class _Progress:
    """Counts the runs started so far, reading only what the ledger files gained."""

    ledger: Path
    offsets: dict[Path, int] = field(default_factory=dict)
    runs: int = 0

    def count(self) -> int:
        for path in self.ledger.glob("*.jsonl"):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + cut
            self.runs += chunk[:cut].count(b'"ev":"start"')
        return self.runs


class ChaosRun:
    def __init__(
        self,
        config: ChaosConfig,
        services: Services,
        run_dir: Path,
        progress: Callable[[str], None] = say,
    ) -> None:
        self.config = config
        self.services = services
        self.run_dir = run_dir
        self.progress = progress
        self.run_id = f"c{config.seed}-{uuid.uuid4().hex[:6]}"
        self.keyspace = f"chaos_{self.run_id.replace('-', '_')}"
        self.journal = JsonLines(run_dir / JOURNAL)
        self.fleet = Fleet(
            run_dir / "fleet",
            zookeeper=(
                f"zookeeper://{services.zookeeper}/timeshard-chaos/{self.run_id}"
                f"?session_timeout={config.session_s:g}"
            ),
            store=services.store_url(self.keyspace),
            shards=config.shards,
            lookahead_s=config.lookahead_s,
            lease_s=config.lease_s,
            progress=progress,
            server_flags=["--claim-ahead-ms", str(config.claim_ahead_ms)],
        )
        self.api = Api(lambda: [p.address for p in self.fleet.servers.values()])
        self.facts: dict[str, Any] = {}
        self._plan_shape()  # fault kinds this run cannot inject fail here, before anything starts

    def run(self) -> Report:
        """The whole run; the checker's report, with the driver's own facts added."""
        create_keyspace(self.fleet.store, self.config.shards)
        try:
            self._start()
            self._load_and_faults()
            self._drain()
        finally:
            self.api.close()
            self.fleet.stop_all()
            if not self.config.keep_keyspace:
                drop_keyspace(self.services.cassandra.split(",")[0], self.keyspace)
            self.journal.close()
        report = check_dir(self.run_dir)
        report.counts.update(self.facts)
        (self.run_dir / "report.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
        return report

    # -- start ------------------------------------------------------------------------------

    def _start(self) -> None:
        cfg = self.config
        self.progress(
            f"run {self.run_id} in {self.run_dir}: store {self.fleet.store}, "
            f"ZooKeeper {self.services.zookeeper}"
        )
        for name in NODES:
            self.fleet.start_server(name)
        self.fleet.wait_serving(timeout=120)
        self.fleet.wait_spread(NODES, timeout=120)
        env = {"TIMESHARD_CHAOS_DIR": str(self.run_dir)}
        self.fleet.start_workers(cfg.workers, target=WORKER_TARGET, env=env)
        (self.run_dir / LEDGER_DIR).mkdir(parents=True, exist_ok=True)
        self.progress(f"nodes {', '.join(NODES)} serve {cfg.shards} shards; {cfg.workers} workers")
        for name, cron, period in CRONS:
            self._create_schedule(f"{self.run_id}-{name}", cron, period)
        self._set_flow(rate=RATED_RATE)

    def _set_flow(self, *, rate: float | None = None, paused: bool | None = None) -> None:
        """A change of ``RATED_TYPE``'s flow, journaled with when it was sent and acknowledged
        (by one node; the others apply it within their refresh)."""
        flow = pb.TypeFlow(type=RATED_TYPE)
        if rate is not None:
            flow.rate = rate
        if paused is not None:
            flow.paused = paused
        sent = now_wall_ms()
        reply = self.api.call(
            "SetTypeFlows", pb.SetTypeFlowsRequest(flows=[flow]), admin=True, give_up_s=120
        )
        (info,) = reply.types
        self.journal.write(
            {
                "ev": "flow",
                "type": RATED_TYPE,
                "rate": info.rate,
                "burst": info.burst,
                "paused": info.paused,
                "sent": sent,
                "acked": now_wall_ms(),
            }
        )

    def _try_set_paused(self, paused: bool) -> bool:
        try:
            self._set_flow(paused=paused)
        except GaveUp as exc:
            self.progress(f"{RATED_TYPE}: {'pause' if paused else 'resume'} gave up ({exc})")
            return False
        return True

    def _create_schedule(self, sid: str, cron: str, period_ms: int) -> None:
        schedule = pb.Schedule(
            schedule_id=sid,
            cron=cron,
            timezone="UTC",
            type=JOB_TYPE,
            payload=json.dumps({"seconds": 0.05}).encode(),
            misfire="all",  # every slot runs, late or not: a missing one is a finding
            misfire_grace=dur(60_000),
            max_catchup=1000,
            overlap="allow",  # up to the most a schedule may: no slot skipped for overlap
            max_concurrent=1000,
            max_attempts=10,
        )
        reply = self.api.call("CreateSchedule", pb.CreateScheduleRequest(schedule=schedule))
        self.journal.write(
            {
                "ev": "schedule",
                "id": sid,
                "cron": cron,
                "period_ms": period_ms,
                "first_fire": ts_ms(reply.next_fire),
                "created": now_wall_ms(),
            }
        )

    # -- load and faults --------------------------------------------------------------------

    def _plan_shape(self) -> PlanShape:
        cfg, services = self.config, self.services
        return PlanShape(
            duration_s=cfg.duration_s,
            kinds=chosen_kinds(services.fault_kinds(), cfg.fault_kinds) if cfg.faults else (),
            workers=cfg.workers,
            nodes=len(NODES),
            zookeepers=len(services.ensemble.servers) if services.ensemble else 0,
            cassandras=services.cluster.size if services.cluster else 0,
            lease_s=cfg.lease_s,
            session_s=cfg.session_s,
            gap_s=cfg.fault_gap_s,
        )

    def _load_and_faults(self) -> None:
        cfg = self.config
        plan = fault_plan(cfg.seed, self._plan_shape())
        self.journal.write(
            {
                "ev": "run",
                "run_id": self.run_id,
                "config": asdict(cfg),
                "store": self.fleet.store,
                "plan": [{**asdict(f), "kind": str(f.kind)} for f in plan],
            }
        )
        kinds = ", ".join(sorted({str(f.kind) for f in plan})) or "none"
        self.progress(
            f"{cfg.duration_s:g} s of load at {cfg.rate:g} jobs/s; {len(plan)} faults ({kinds})"
        )
        workload = Workload(
            self.api,
            self.journal,
            LoadShape(rate=cfg.rate, duration_s=cfg.duration_s, seed=cfg.seed, run_id=self.run_id),
        )
        injector = Injector(
            self.fleet,
            self.journal,
            plan,
            zookeeper=self.services.ensemble,
            cassandra=self.services.cluster,
            progress=self.progress,
        )
        stop = threading.Event()
        started = time.monotonic()
        threads = [
            threading.Thread(target=workload.run, args=(stop,), name="chaos-load"),
            threading.Thread(target=injector.run, args=(started, stop), name="chaos-faults"),
        ]
        for t in threads:
            t.start()
        try:
            self._watch(started, workload, injector)
        finally:
            stop.set()
            for t in threads:
                t.join()
            injector.finish()
        self.facts |= {
            "load": asdict(workload.stats),
            "fault_errors": injector.errors,
            "faults_planned": len(plan),
        }

    def _watch(self, started: float, workload: Workload, injector: Injector) -> None:
        """Progress every 10 s until the load's end; a process that exited on its own (not by
        a fault) is recorded and started again."""
        runs = _Progress(ledger=self.run_dir / LEDGER_DIR)
        next_note = started + 10.0
        pause_at, resume_at = (self.config.duration_s * f for f in PAUSED_SPAN)
        paused: bool | None = None
        while (elapsed := time.monotonic() - started) < self.config.duration_s:
            time.sleep(1.0)
            self._restart_crashed(busy=injector.current)
            # The type's flow changes between faults: during one (a whole-store outage may
            # outlast any give-up) the change waits, and one that gives up is tried again.
            want = None
            if paused is None and elapsed >= pause_at:
                want = True
            elif paused and elapsed >= resume_at:
                want = False
            if want is not None and not injector.current and self._try_set_paused(want):
                paused = want
                self.progress(f"{elapsed:.0f} s: {RATED_TYPE} {'paused' if want else 'resumed'}")
            if time.monotonic() >= next_note:
                s = workload.stats
                doing = f"; now {injector.current}" if injector.current else ""
                self.progress(
                    f"{elapsed:.0f}/{self.config.duration_s:g} s: {s.acked} jobs acknowledged "
                    f"({s.unacked} not), cancels {s.cancels}, reschedules {s.reschedules}, "
                    f"runs {runs.count()}, faults {len(injector.done)}{doing}"
                )
                next_note += 10.0

    def _restart_crashed(self, busy: str) -> None:
        """``busy``: the fault under way (its target may be down on purpose)."""
        procs = [*self.fleet.servers.values(), *self.fleet.workers.values()]
        for proc in procs:
            if proc.alive() or proc.name in busy.split():
                continue
            assert proc.popen is not None
            code = proc.popen.poll()
            self.journal.write({"ev": "crash", "name": proc.name, "pid": proc.pid, "code": code})
            self.progress(
                f"{proc.name} (pid {proc.pid}) exited by itself (code {code}): restarting"
            )
            if proc.name in self.fleet.servers:
                self.fleet.restart_server(proc.name)
            else:
                self.fleet.restart_worker(proc.name)

    # -- drain -------------------------------------------------------------------------------

    def _drain(self) -> None:
        load_end = time.monotonic()
        self._restart_crashed(busy="")
        self.fleet.wait_serving(timeout=120)
        for name, _, _ in CRONS:
            sid = f"{self.run_id}-{name}"
            self.api.call("PauseSchedule", pb.ScheduleIdRequest(schedule_id=sid), give_up_s=120)
            self.journal.write({"ev": "schedule_pause", "id": sid, "acked": now_wall_ms()})
        self.progress(f"load over; draining (up to {self.config.drain_s:g} s)")
        deadline = load_end + self.config.drain_s
        drained = False
        while True:
            open_jobs = self._open_jobs()
            if not open_jobs:
                drained = True
                break
            if time.monotonic() > deadline:
                break
            self.progress(f"drain: {len(open_jobs)} jobs not finished, e.g. {open_jobs[:3]}")
            time.sleep(3.0)
        drain_s = time.monotonic() - load_end
        self.progress(f"drain {'done' if drained else 'TIMED OUT'} after {drain_s:.0f} s")
        self.facts |= {"drained": drained, "drain_s": round(drain_s, 1)}
        self.journal.write({"ev": "drain", "drained": drained, "drain_s": drain_s})
        self._snapshot()

    def _list(self, state: pb.JobState = pb.JOB_STATE_UNSPECIFIED) -> list[pb.Job]:
        jobs: list[pb.Job] = []
        token = ""
        while True:
            request = pb.ListJobsRequest(state=state, page_size=1000, page_token=token)
            reply = self.api.call("ListJobs", request, give_up_s=120)
            jobs += list(reply.jobs)
            token = reply.next_page_token
            if not token:
                return jobs

    def _open_jobs(self) -> list[str]:
        """The jobs not terminal, from one listing of every job: one listing per state missed
        a job that moved between them (running, listed as scheduled, then back to scheduled
        for a retry, listed as running), and the drain ended with it still to run."""
        try:
            found = self._list()
        except (GaveUp, grpc.RpcError) as exc:
            self.progress(f"drain: listing failed ({exc}); trying again")
            return ["?"]
        return sorted(j.job_id for j in found if STATE_NAMES.get(j.state) not in TERMINAL)

    def _snapshot(self) -> None:
        """The store as the API shows it: every job listed, every acknowledged job the listing
        missed read one by one, and the schedules."""
        jobs = {j.job_id: job_summary(j) for j in self._list()}
        acked = [r["job"] for r in _journal_records(self.run_dir, "job")]
        for job_id in sorted(set(acked) - set(jobs)):
            try:
                jobs[job_id] = job_summary(self.api.call("GetJob", pb.GetJobRequest(job_id=job_id)))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
        schedules = {}
        for name, _, _ in CRONS:
            sid = f"{self.run_id}-{name}"
            s = self.api.call("GetSchedule", pb.GetScheduleRequest(schedule_id=sid))
            schedules[sid] = {
                "next_fire": ts_ms(s.next_fire),
                "skipped": s.skipped,
                "paused": s.paused,
                "last_fire_at": ts_ms(s.last_fire_at),
                "ledger": self._ledger_of(sid),
            }
        snapshot = {"jobs": jobs, "schedules": schedules, "taken": now_wall_ms()}
        (self.run_dir / STORE).write_text(json.dumps(snapshot))
        self.progress(f"store: {len(jobs)} jobs read back")

    def _ledger_of(self, schedule_id: str) -> list[dict[str, Any]]:
        """Every occurrence ledger entry of the schedule, read back through the API a page
        (``LEDGER_PAGE``, newest first) at a time."""
        rows: list[dict[str, Any]] = []
        at = round(now_wall_ms()) + 86_400_000
        while True:
            request = pb.ExplainOccurrenceRequest(
                schedule_id=schedule_id, at=ts(at), recent=LEDGER_PAGE
            )
            reply = self.api.call("ExplainOccurrence", request, give_up_s=120)
            rows += [ledger_entry(e) for e in reply.recent]
            if len(reply.recent) < LEDGER_PAGE:
                return rows
            at = ts_ms(reply.recent[-1].nominal) - 1


def _journal_records(run_dir: Path, ev: str) -> Iterable[dict[str, Any]]:
    return (r for r in read_lines(run_dir / JOURNAL) if r.get("ev") == ev)
