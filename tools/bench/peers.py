"""``loadtest peers``: the fire workload (or, with ``--steady``, the steady one) on timeshard and
on the peers a user would pick instead, one after another on this machine, with ratios to
timeshard.

The steady workload is ``loadtest steady``'s: ``--rate`` jobs/s for ``--duration`` s, each sent
``--lead`` (2 s) before it is due; lateness is the handler's start minus the due time on the
wall clock of this one machine, for timeshard and the peer alike, and the CPU per fired job is
read from /proc over the run for each side's processes (timeshard: its server and, on
Cassandra, the Cassandra process; the workers. Celery: redis-server; its worker).

The peer scripts in tools/peers/ run under their own virtualenv (their packages pin versions
timeshard's environment must not take); servers come from Debian packages and are started by
the scripts on free loopback ports.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from . import scenarios
from .progress import note
from .steady import LEAD_S, steady

PEERS_DIR = Path(__file__).resolve().parent.parent / "peers"
DEFAULT_VENV = Path("/opt/timeshard-peers")
PEERS: dict[str, list[str]] = {
    "celery": ["celery_redis.py"],
    "procrastinate": ["procrastinate_pg.py", "--poll-s", "0.5"],
    "aps-sqlite": ["apscheduler4.py", "--store", "sqlite"],
    "aps-postgres": ["apscheduler4.py", "--store", "postgres"],
}
STEADY_PEERS = ("celery",)
"""The peers whose script has the steady workload (``--rate``)."""
HOWTO = f"""the peers' virtualenv is missing; create it with:
  python3.11 -m venv {DEFAULT_VENV}
  {DEFAULT_VENV}/bin/pip install -r tools/peers/requirements.txt
  apt-get install redis-server postgresql
(or point --peers-python / TIMESHARD_PEERS_PYTHON at a Python that has those packages)"""
COLUMNS = [
    ("ingest_per_s", "ingest/s"),
    ("fire_per_s", "fire/s"),
    ("lateness_p50_s", "p50 s"),
    ("lateness_p99_s", "p99 s"),
    ("lateness_max_s", "max s"),
    ("lost", "lost"),
    ("duplicates", "dup"),
    ("early", "early"),
]


def peers_python(args: argparse.Namespace) -> str | None:
    given = args.peers_python or os.environ.get("TIMESHARD_PEERS_PYTHON")
    if given:
        return given
    default = DEFAULT_VENV / "bin" / "python"
    return str(default) if default.exists() else None


def missing(name: str) -> str | None:
    """What a peer needs from Debian that is not here (None: nothing)."""
    if name == "celery" and shutil.which("redis-server") is None:
        return "redis-server not found (apt-get install redis-server)"
    if name in ("procrastinate", "aps-postgres") and not glob.glob("/usr/lib/postgresql/*/bin"):
        return "PostgreSQL not found (apt-get install postgresql)"
    return None


def peer_names(args: argparse.Namespace) -> list[str]:
    """The peers to run (``--peers``, by default every one that has the workload), after
    checking the workload's options: a clear error for a wrong one, before anything starts."""
    default = STEADY_PEERS if args.steady else tuple(PEERS)
    names = [p.strip() for p in (args.peers or ",".join(default)).split(",") if p.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}: pick from {list(PEERS)}")
    if not args.steady:
        if args.rate:
            raise SystemExit("--rate is the steady workload's: give --steady too")
        return names
    no_steady = [n for n in names if n not in STEADY_PEERS]
    if no_steady:
        pick = list(STEADY_PEERS)
        raise SystemExit(f"--steady: {no_steady} have no steady mode; pick from {pick}")
    if args.rate <= 0 or args.duration <= 0:
        raise SystemExit("--steady needs --rate JOBS_PER_S and --duration SECONDS above 0")
    if args.lead is not None and args.lead <= 0:
        raise SystemExit(f"--lead {args.lead:g}: give the seconds before due, above 0")
    return names


def lead_s(args: argparse.Namespace) -> float:
    return float(args.lead) if args.lead is not None else LEAD_S


def workload(args: argparse.Namespace) -> list[str]:
    """The peer script's options for the same workload as timeshard's."""
    if args.steady:
        rate, duration, lead = f"{args.rate:g}", f"{args.duration:g}", f"{lead_s(args):g}"
        return ["--rate", rate, "--duration", duration, "--lead-s", lead]
    return ["--jobs", str(args.jobs), "--window", str(args.window)]


def run_peer(python: str, name: str, options: list[str]) -> dict[str, Any]:
    script, *extra = PEERS[name]
    cmd = [python, str(PEERS_DIR / script), *extra, *options]
    note(f"== {name}: {' '.join(cmd)}")
    proc = subprocess.run([*cmd, "--json"], stdout=subprocess.PIPE, text=True, cwd=PEERS_DIR)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"system": name, "error": f"exit code {proc.returncode} (its stderr is above)"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def run_peers(args: argparse.Namespace, names: list[str]) -> list[dict[str, Any]]:
    python = peers_python(args)
    if python is None:
        note(HOWTO)
    results: list[dict[str, Any]] = []
    for name in names:
        why = "no peers virtualenv (see above)" if python is None else missing(name)
        if why:
            note(f"skipping {name}: {why}")
            results.append({"system": name, "skipped": why})
            continue
        assert python is not None
        results.append(run_peer(python, name, workload(args)))
    return results


def compare(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    names = peer_names(args)
    if args.steady:
        ts, series = steady(args)
    else:
        args.rate, args.lwt_seconds = 0, 4.0
        ts, series = scenarios.fire(args)
    ts = {"system": f"timeshard+{ts['store']}", **ts}
    results = [ts, *run_peers(args, names)]
    out: dict[str, Any] = {
        "scenario": "peers",
        "workload": "steady" if args.steady else "fire",
        "timeshard_mode": args.mode,
        "results": results,
    }
    if args.steady:
        out.update(offered_per_s=args.rate, duration_s=args.duration, lead_s=lead_s(args))
        out["ratios"] = {r["system"]: steady_ratios(ts, r) for r in results[1:] if fired(r)}
    else:
        out.update(jobs=args.jobs, window_s=args.window)
        out["ratios"] = {r["system"]: fire_ratios(ts, r) for r in results[1:] if fired(r)}
    return {**out, "machine": scenarios.machine()}, series


def fired(r: dict[str, Any]) -> bool:
    return "fire_per_s" in r


def fire_ratios(ts: dict[str, Any], r: dict[str, Any]) -> dict[str, float | None]:
    return {
        "fire_per_s_timeshard_over_peer": ratio(ts.get("fire_per_s"), r.get("fire_per_s")),
        "ingest_per_s_timeshard_over_peer": ratio(ts.get("ingest_per_s"), r.get("ingest_per_s")),
        "p99_lateness_peer_over_timeshard": ratio(
            r.get("lateness_p99_s"), ts.get("lateness_p99_s")
        ),
    }


def cpu_sides(r: dict[str, Any]) -> tuple[float | None, float | None]:
    """CPU ms per fired job of the serving side (timeshard's server(s) and Cassandra, or the
    peer's broker) and of the workers; None where not measured."""
    each = r.get("per_fired_job") or {}
    parts = [each.get(k) for k in ("server_cpu_ms", "cassandra_cpu_ms", "broker_cpu_ms")]
    known = [p for p in parts if p is not None]
    return (round(sum(known), 4) if known else None), each.get("worker_cpu_ms")


def total_cpu(r: dict[str, Any]) -> float | None:
    server, workers = cpu_sides(r)
    return round(server + workers, 4) if server is not None and workers is not None else None


def _fraction(a: float | None, b: float | None) -> float | None:
    """a / b to 3 decimals (lateness ratios span orders of magnitude); None without both."""
    return round(a / b, 3) if a is not None and b else None


def steady_ratios(ts: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    """timeshard against one peer on the steady workload, with issue 36's target: timeshard's
    p50 within 2x the peer's, its p99 below the peer's."""
    ts50, ts99 = ts.get("lateness_p50_s"), ts.get("lateness_p99_s")
    p50, p99 = r.get("lateness_p50_s"), r.get("lateness_p99_s")
    return {
        "p50_timeshard_over_peer": _fraction(ts50, p50),
        "p99_timeshard_over_peer": _fraction(ts99, p99),
        "cpu_per_fired_job_timeshard_over_peer": _fraction(total_cpu(ts), total_cpu(r)),
        "p50_within_2x": None if ts50 is None or p50 is None else ts50 <= 2 * p50,
        "p99_below": None if ts99 is None or p99 is None else ts99 < p99,
    }


def table(result: dict[str, Any]) -> str:
    """The side-by-side table of a ``peers`` run, ratios and the peers' notes."""
    if result.get("workload") == "steady":
        return steady_table(result)
    lines = [
        f"{result['jobs']} jobs due over {result['window_s']:g} s; lateness = start - due; "
        f"timeshard scheduled with {result['timeshard_mode']}",
        "",
        f"{'system':<26}" + "".join(f"{title:>11}" for _, title in COLUMNS),
    ]
    for r in result["results"]:
        lines.append(_row(r, [r.get(key) for key, _ in COLUMNS]))
    lines += ["", "ratios (timeshard vs peer): fire/s ts/peer, ingest/s ts/peer, p99 peer/ts"]
    for system, rr in result["ratios"].items():
        fire, ingest, p99 = (rr[k] if rr[k] is not None else "n/a" for k in rr)
        lines.append(f"  {system:<24} fire x{fire}   ingest x{ingest}   p99 lateness x{p99}")
    return "\n".join(lines + _notes(result))


STEADY_COLUMNS = [
    "offered/s",
    "fired/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "server ms",
    "workers ms",
    "total ms",
    "lost",
    "dup",
    "early",
]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def steady_cells(r: dict[str, Any]) -> list[Any]:
    """A steady row's cells, as STEADY_COLUMNS names them (lateness in ms)."""
    server, workers = cpu_sides(r)
    return [
        r.get("offered_per_s"),
        r.get("fire_per_s"),
        _ms(r.get("lateness_p50_s")),
        _ms(r.get("lateness_p99_s")),
        _ms(r.get("lateness_max_s")),
        server,
        workers,
        total_cpu(r),
        r.get("lost"),
        r.get("duplicates"),
        r.get("early"),
    ]


def steady_table(result: dict[str, Any]) -> str:
    lines = [
        f"steady: {result['offered_per_s']:g} jobs/s offered for {result['duration_s']:g} s, "
        f"each sent {result['lead_s']:g} s before due; lateness = handler start - due",
        "CPU ms per fired job: server = timeshard's node(s) and Cassandra, or the peer's broker; "
        "workers = the worker processes",
        "",
        f"{'system':<26}" + "".join(f"{title:>11}" for title in STEADY_COLUMNS),
    ]
    lines += [_row(r, steady_cells(r)) for r in result["results"]]
    lines += ["", "timeshard vs peer (target: p50 within 2x the peer's, p99 below it):"]
    ts = result["results"][0]
    for system, rr in result["ratios"].items():
        peer = next(r for r in result["results"] if r["system"] == system)
        lines.append(
            f"  {system:<24} p50 {_ms(ts.get('lateness_p50_s'))} vs "
            f"{_ms(peer.get('lateness_p50_s'))} ms (x{_cell(rr['p50_timeshard_over_peer'])}, "
            f"{_verdict(rr['p50_within_2x'])}), p99 {_ms(ts.get('lateness_p99_s'))} vs "
            f"{_ms(peer.get('lateness_p99_s'))} ms ({_verdict(rr['p99_below'])}), "
            f"CPU per fired job x{_cell(rr['cpu_per_fired_job_timeshard_over_peer'])}"
        )
    return "\n".join(lines + _notes(result))


def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "not met")


def _row(r: dict[str, Any], cells: list[Any]) -> str:
    if "skipped" in r or "error" in r:
        return f"{r['system']:<26}  ({r.get('skipped') or r.get('error')})"
    return f"{r['system']:<26}" + "".join(f"{'-' if c is None else c:>11}" for c in cells)


def _notes(result: dict[str, Any]) -> list[str]:
    notes = [(r["system"], n) for r in result["results"] for n in r.get("notes", [])]
    return ["", "notes:"] + [f"  {system}: {n}" for system, n in notes] if notes else []
