"""``loadtest peers``: the fire workload on timeshard and on the peers a user would pick instead,
one after another on this machine, with ratios to timeshard.

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

PEERS_DIR = Path(__file__).resolve().parent.parent / "peers"
DEFAULT_VENV = Path("/opt/timeshard-peers")
PEERS: dict[str, list[str]] = {
    "celery": ["celery_redis.py"],
    "procrastinate": ["procrastinate_pg.py", "--poll-s", "0.5"],
    "aps-sqlite": ["apscheduler4.py", "--store", "sqlite"],
    "aps-postgres": ["apscheduler4.py", "--store", "postgres"],
}
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


def run_peer(python: str, name: str, jobs: int, window: float) -> dict[str, Any]:
    script, *extra = PEERS[name]
    cmd = [python, str(PEERS_DIR / script), *extra, "--jobs", str(jobs), "--window", str(window)]
    note(f"== {name}: {' '.join(cmd)}")
    proc = subprocess.run([*cmd, "--json"], stdout=subprocess.PIPE, text=True, cwd=PEERS_DIR)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"system": name, "error": f"exit code {proc.returncode} (its stderr is above)"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def compare(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    names = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}: pick from {list(PEERS)}")
    args.rate, args.lwt_seconds = 0, 4.0
    ts, series = scenarios.fire(args)
    ts = {"system": f"timeshard+{ts['store']}", **ts}
    results: list[dict[str, Any]] = [ts]
    python = peers_python(args)
    if python is None:
        note(HOWTO)
    for name in names:
        why = "no peers virtualenv (see above)" if python is None else missing(name)
        if why:
            note(f"skipping {name}: {why}")
            results.append({"system": name, "skipped": why})
            continue
        assert python is not None
        results.append(run_peer(python, name, args.jobs, args.window))
    ratios = {
        r["system"]: {
            "fire_per_s_timeshard_over_peer": ratio(ts.get("fire_per_s"), r.get("fire_per_s")),
            "ingest_per_s_timeshard_over_peer": ratio(
                ts.get("ingest_per_s"), r.get("ingest_per_s")
            ),
            "p99_lateness_peer_over_timeshard": ratio(
                r.get("lateness_p99_s"), ts.get("lateness_p99_s")
            ),
        }
        for r in results[1:]
        if "fire_per_s" in r
    }
    out = {
        "scenario": "peers",
        "jobs": args.jobs,
        "window_s": args.window,
        "timeshard_mode": args.mode,
        "results": results,
        "ratios": ratios,
        "machine": scenarios.machine(),
    }
    return out, series


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['jobs']} jobs due over {result['window_s']:g} s; lateness = start - due; "
        f"timeshard scheduled with {result['timeshard_mode']}",
        "",
        f"{'system':<26}" + "".join(f"{title:>11}" for _, title in COLUMNS),
    ]
    for r in result["results"]:
        if "skipped" in r or "error" in r:
            lines.append(f"{r['system']:<26}  ({r.get('skipped') or r.get('error')})")
            continue
        cells = [r.get(key) for key, _ in COLUMNS]
        lines.append(
            f"{r['system']:<26}" + "".join(f"{'-' if c is None else c:>11}" for c in cells)
        )
    lines += ["", "ratios (timeshard vs peer): fire/s ts/peer, ingest/s ts/peer, p99 peer/ts"]
    for system, rr in result["ratios"].items():
        fire, ingest, p99 = (rr[k] if rr[k] is not None else "n/a" for k in rr)
        lines.append(f"  {system:<24} fire x{fire}   ingest x{ingest}   p99 lateness x{p99}")
    notes = [(r["system"], n) for r in result["results"] for n in r.get("notes", [])]
    if notes:
        lines += ["", "notes:"] + [f"  {system}: {n}" for system, n in notes]
    return "\n".join(lines)
