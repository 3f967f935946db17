"""The ``steady`` scenario: jobs streamed at an offered rate below capacity, each sent ``--lead``
before it is due, with ingest and fire reported apart.

Creating and firing overlap in a steady run (a job is created 2 s before another fires), so the
server's CPU over the run pays for both. A create-only phase at the same rate comes first
(``--ingest-s`` seconds of jobs of a type no worker takes, due an hour after the run, so none
fires): its CPU per created job (the server's, and Cassandra's) is then taken off the steady
run's, per job created in it, to give the CPU per fired job of firing alone (``*_fire_only``).
The Paxos rounds of the steady run are counted by what each round carried
(``timeshard_store_paxos_rounds_by_kind_total``), per fired job."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .procs import Timeshard, cpu_delta
from .profiling import sampled
from .progress import Progress, note
from .records import RunRecords, figures, timeline
from .scenarios import (
    ROUNDS,
    Store,
    cassandra_side,
    counter_delta,
    fired_costs,
    machine,
    node_figures,
    per_1k,
    per_job,
    running,
    time_breakdown,
)
from .submit import WARMUP_TYPE, stream

IDLE_S = 3.0
"""Seconds measured with nothing offered before the create-only phase (``--idle-s``)."""
INGEST_S = 5.0
"""Seconds of the create-only phase before a steady run (``--ingest-s``)."""
LEAD_S = 2.0
"""Seconds each job is sent before it is due, unless ``--lead`` says otherwise."""
INGEST_DUE_S = 3600.0
"""The create-only phase's jobs are due this long after they are sent: none fires in a run."""
ROUNDS_BY_KIND = "timeshard_store_paxos_rounds_by_kind_total{kind="
CPUS = ("server", "cassandra")


def add_options(p: argparse.ArgumentParser, *, rate_required: bool = True) -> None:
    """The steady workload's options (``steady``, and ``peers --steady``)."""
    p.add_argument(
        "--rate", type=float, required=rate_required, default=0.0, help="jobs per second offered"
    )
    p.add_argument("--duration", type=float, default=30.0, help="seconds of offered load (30)")
    p.add_argument(
        "--idle-s",
        type=float,
        default=IDLE_S,
        help="seconds measured with nothing offered first: the idle CPU each phase pays (3)",
    )
    p.add_argument(
        "--ingest-s",
        type=float,
        default=INGEST_S,
        help="seconds of create-only load at --rate before the run, due in an hour: the CPU "
        "per created job, taken off the run's for the fire-only figures (5; 0: none)",
    )


def steady(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    idle_s = getattr(args, "idle_s", IDLE_S)
    with running(args) as (ts, store, records):
        idle = idle_phase(ts, idle_s)
        ingest = ingest_phase(ts, store, args)
        out, rows = steady_phase(ts, store, records, args)
        note(f"after the run: {idle_s:g} s with nothing offered")
        after = idle_phase(ts, idle_s)
    out["idle"] = idle
    out["after_run"] = after
    created = created_costs(ingest, idle) if ingest is not None else None
    if created is not None:
        out["per_created_job"] = created
        out["per_fired_job"].update(
            fire_only(
                out["per_fired_job"],
                idle,
                created,
                out["jobs_created"],
                out["fired"],
                out["span_s"],
            )
        )
    return {**out, "machine": machine()}, [("timeshard " + store.kind, rows)]


def idle_phase(ts: Timeshard, seconds: float) -> dict[str, Any]:
    """The CPU the server (and Cassandra) use per second with nothing offered: before a run,
    their timers, refresh reads and Cassandra's own background work, which every span of a
    run pays (``idle``, taken off); right after it, also what the run left behind, such as
    Cassandra's flushes and compactions (``after_run``, reported, not taken off: it is the
    run's own cost, 30-80 ms/s more than before on one Cassandra node)."""
    cpu0, t0 = ts.cpu(), time.monotonic()
    time.sleep(seconds)
    used, span = cpu_delta(cpu0, ts.cpu()), time.monotonic() - t0
    out: dict[str, Any] = {"seconds": round(span, 2)}
    for name in CPUS:
        seconds_used = used.get(name)
        if seconds_used is not None:
            out[f"{name}_cpu_ms_per_s"] = round(seconds_used * 1000 / span, 3)
    return out


@dataclass(frozen=True, slots=True)
class Ingest:
    """The create-only phase as measured: the CPU each process used, the store's counters
    around it, the jobs created and the seconds it took."""

    store_kind: str
    cpu: dict[str, float | None]
    before: dict[str, float]
    after: dict[str, float]
    created: int
    seconds: float


def ingest_phase(ts: Timeshard, store: Store, args: argparse.Namespace) -> Ingest | None:
    """Create only, at the steady rate for ``--ingest-s`` seconds (None when the phase is off):
    what it used, priced per job once the idle use is known (``created_costs``)."""
    count = round(args.rate * getattr(args, "ingest_s", INGEST_S))
    if count <= 0:
        return None
    note(f"create only: {count:,} jobs at {args.rate:g}/s, due in an hour (none fires)")
    run_ats: list[int] = []
    ids: list[str] = []
    cpu0, ctr0, t0 = ts.cpu(), ts.counters(), time.monotonic()
    stream(
        ts.address, args.rate, count, INGEST_DUE_S, args.mode, run_ats, ids, job_type=WARMUP_TYPE
    )
    span = time.monotonic() - t0
    return Ingest(store.kind, cpu_delta(cpu0, ts.cpu()), ctr0, ts.counters(), len(ids), span)


def created_costs(ingest: Ingest, idle: dict[str, Any]) -> dict[str, Any]:
    """What creating ``ingest.created`` jobs cost, nothing firing meanwhile: the CPU per job
    (ms) of the server (and of Cassandra) less their ``idle`` use over the span, and on
    Cassandra the Paxos rounds per job; and the workers' CPU per second meanwhile, when none
    of them has a job: their idle use (``workers_idle_cpu_ms_per_s``: heartbeats, timers)."""
    created, seconds = ingest.created, ingest.seconds
    out: dict[str, Any] = {"jobs": created, "seconds": round(seconds, 2)}
    for name in CPUS:
        used, per_s = ingest.cpu.get(name), idle.get(f"{name}_cpu_ms_per_s")
        if used is None or per_s is None or not created:
            continue
        out[f"{name}_cpu_ms"] = round((used * 1000 - per_s * seconds) / created, 4)
    if ingest.store_kind == "cassandra":
        out["paxos_rounds"] = per_job(counter_delta(ingest.before, ingest.after, ROUNDS), created)
    workers = ingest.cpu.get("workers")
    if workers is not None and seconds:  # started before the idle phase: settled by now
        out["workers_idle_cpu_ms_per_s"] = round(workers * 1000 / seconds, 3)
    return out


def fire_only(
    fired: dict[str, Any],
    idle: dict[str, Any],
    created: dict[str, Any],
    jobs_created: int,
    jobs_fired: int,
    span_s: float,
) -> dict[str, Any]:
    """The CPU per fired job of firing alone: a steady run's CPU (``fired``'s per fired job,
    over ``span_s``) less the idle use over the span and the ``jobs_created`` jobs created
    during it at ``created``'s price per job. The workers create nothing: theirs is their CPU
    less their idle use over the span."""
    out: dict[str, Any] = {}
    for name in CPUS:
        total, each = fired.get(f"{name}_cpu_ms"), created.get(f"{name}_cpu_ms")
        per_s = idle.get(f"{name}_cpu_ms_per_s")
        if total is None or each is None or per_s is None or not jobs_fired:
            continue
        rest = total * jobs_fired - per_s * span_s - each * jobs_created
        out[f"{name}_cpu_ms_fire_only"] = round(rest / jobs_fired, 4)
    total, per_s = fired.get("worker_cpu_ms"), created.get("workers_idle_cpu_ms_per_s")
    if total is not None and per_s is not None and jobs_fired:
        rest = total * jobs_fired - per_s * span_s
        out["worker_cpu_ms_fire_only"] = round(rest / jobs_fired, 4)
    return out


def rounds_by_kind(before: dict[str, float], after: dict[str, float], fired: int) -> dict[str, Any]:
    """Paxos rounds per fired job by what each round carried, most first."""
    grown = {
        key[len(ROUNDS_BY_KIND) : -1]: counter_delta(before, after, key) or 0.0
        for key in after
        if key.startswith(ROUNDS_BY_KIND)
    }
    return {k: per_job(v, fired) for k, v in sorted(grown.items(), key=lambda kv: -kv[1]) if v}


def steady_phase(
    ts: Timeshard,
    store: Store,
    records: RunRecords,
    args: argparse.Namespace,
    during: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], list[tuple[float, float, float]]]:
    """Offer ``args.rate`` jobs/s for ``args.duration`` s (each sent ``--lead`` before it is
    due, 2 s by default) and follow them until they ran; ``during()`` is called every 0.1 s
    meanwhile (the failover run kills a node from there)."""
    lead = args.lead if args.lead is not None else LEAD_S
    cpu0, ctr0, t0 = ts.cpu(), ts.counters(), time.monotonic()
    run_ats, ids, offer_s = _offer_and_follow(ts, records, args, lead, during)
    cpu1, ctr1, span = ts.cpu(), ts.counters(), time.monotonic() - t0
    result = figures(records, ids, run_ats[0])
    used = cpu_delta(cpu0, cpu1)
    fired = result["fired"]
    out = {
        "scenario": "steady",
        "store": store.kind,
        "nodes": len(ts.names),
        "shards": args.shards,
        "workers": args.workers,
        "mode": args.mode,
        "offered_per_s": args.rate,
        "duration_s": args.duration,
        "jobs": len(run_ats),
        "jobs_created": len(ids),
        "lead_s": lead,
        "span_s": round(span, 2),
        "ingest_per_s": round(len(ids) / offer_s, 1) if offer_s else None,
        **result,
        "cpu_s_per_1k": {
            "server": per_1k(used["server"], fired),
            "workers": per_1k(used["workers"], fired),
            "client": per_1k(used["client"], fired),
        },
        "per_fired_job": fired_costs(store.kind, used, ctr0, ctr1, fired),
        "per_node": node_figures(ts, used, ctr0, ctr1, fired),
        "server_time": time_breakdown(ctr0, ctr1),
    }
    if store.kind == "cassandra":
        out["per_fired_job"]["paxos_rounds_by_kind"] = rounds_by_kind(ctr0, ctr1, fired)
    out["server_time"]["cassandra_side"] = cassandra_side(store)
    return out, timeline(records, ids)


def _offer_and_follow(
    ts: Timeshard,
    records: RunRecords,
    args: argparse.Namespace,
    lead: float,
    during: Callable[[], None] | None,
) -> tuple[list[int], list[str], float | None]:
    """Offer the jobs from a thread and follow the runs until every job offered and
    acknowledged ran (or nothing ran for ``--drain`` s once the offer ended). Returns the due
    times, the ids acknowledged, and the seconds the offer took."""
    count = round(args.rate * args.duration)
    run_ats: list[int] = []
    ids: list[str] = []
    offer_s: list[float] = []

    def offer() -> None:
        t0 = time.monotonic()
        stream(ts.address, args.rate, count, lead, args.mode, run_ats, ids)
        offer_s.append(time.monotonic() - t0)

    sender = threading.Thread(target=offer, name="loadtest-offer", daemon=True)
    sender.start()
    progress = Progress("fire", count)
    last_change = time.monotonic()
    with sampled("steady", ts.pids()):
        while True:
            if records.poll():
                last_change = time.monotonic()
            progress.update(len(records.first), extra=f"offered {len(ids):,}")
            # Done once every job offered and acknowledged ran: not once as many runs as jobs
            # offered were seen, as a job written but not acknowledged (a node killed during
            # its call: ``submit._schedule_on_one``) runs too.
            if len(records.first) >= count and not sender.is_alive() and ran_all(records, ids):
                break
            if not sender.is_alive() and time.monotonic() - last_change > args.drain:
                break
            if during is not None:
                during()
            ts.check_alive()
            time.sleep(0.1)
        progress.close()
        sender.join()
    return run_ats, ids, offer_s[0] if offer_s else None


def ran_all(records: RunRecords, ids: Sequence[str]) -> bool:
    first = records.first
    return all(i in first for i in ids)
