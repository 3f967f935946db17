"""Timeshard against the peers a user would pick instead, on this machine, one after another.

    python tools/bench_compare.py --jobs 20000 [--peers celery,aps-postgres,...] [--json]

Runs `tools/bench_fire.py --json` (timeshard, embedded SQLite store) and then each peer script in
tools/peers/ with the same N (jobs all due at one instant a few seconds ahead), and prints a
side-by-side table plus ratios: timeshard's fire_per_s over the peer's (higher = timeshard
faster), and the peer's p99 lateness over timeshard's (higher = timeshard less late).

The peers' packages (celery, redis, apscheduler 4, ...) need not be in timeshard's environment:
the peer scripts run under --peers-python (default: $TIMESHARD_PEERS_PYTHON, else this Python).
Progress of every run goes to stderr; the table (or one JSON line with --json) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
PEERS = {
    "celery": [str(TOOLS / "peers" / "celery_redis.py")],
    "aps-sqlite": [str(TOOLS / "peers" / "apscheduler4.py"), "--store", "sqlite"],
    "aps-postgres": [str(TOOLS / "peers" / "apscheduler4.py"), "--store", "postgres"],
    "procrastinate": [str(TOOLS / "peers" / "procrastinate_pg.py")],
}
COLUMNS = ["schedule_per_s", "fire_per_s", "lateness_ms_p50", "lateness_ms_p99", "lateness_ms_max"]


def run(name: str, cmd: list[str]) -> dict:
    sys.stderr.write(f"== {name}: {' '.join(cmd)}\n")
    sys.stderr.flush()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        result = {"system": name, "error": f"exit code {proc.returncode}", "notes": []}
    else:
        result = json.loads(lines[-1])
    sys.stderr.write(f"== {name} result: {json.dumps(result)}\n")
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if a and b else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--peers", default=",".join(PEERS), help=f"comma list from {list(PEERS)}")
    ap.add_argument(
        "--peers-python", default=os.environ.get("TIMESHARD_PEERS_PYTHON", sys.executable)
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = ["--jobs", str(args.jobs), "--json"]

    # a free port, not bench_fire's fixed default: another bench_fire running on this machine
    # would otherwise receive this run's jobs (its server answers when ours fails to bind)
    port = ["--port", str(free_port())]
    ts = run("timeshard", [sys.executable, str(TOOLS / "bench_fire.py"), *n, *port])
    ts = {"system": f"timeshard+{ts.pop('store', 'sqlite')}", **ts}
    results = [ts]
    for name in [p.strip() for p in args.peers.split(",") if p.strip()]:
        if name not in PEERS:
            raise SystemExit(f"unknown peer {name!r}: pick from {list(PEERS)}")
        results.append(run(name, [args.peers_python, *PEERS[name], *n]))

    ratios = {
        r["system"]: {
            "fire_per_s_timeshard_over_peer": ratio(ts.get("fire_per_s", 0), r["fire_per_s"]),
            "p99_lateness_peer_over_timeshard": ratio(
                r["lateness_ms_p99"], ts.get("lateness_ms_p99", 0)
            ),
        }
        for r in results[1:]
        if "error" not in r
    }
    if args.json:
        print(json.dumps({"jobs": args.jobs, "results": results, "ratios": ratios}))
        return 0

    print(f"jobs: {args.jobs}, all due at one instant; lateness = job start - due time\n")
    print(f"{'system':<24}" + "".join(f"{c:>17}" for c in COLUMNS))
    for r in results:
        cells = [f"{r[c]:>17}" if c in r else f"{'-':>17}" for c in COLUMNS]
        print(f"{r['system']:<24}" + "".join(cells) + (f"  ({r['error']})" if "error" in r else ""))
    print("\nratios (timeshard vs peer): fire_per_s timeshard/peer, p99 lateness peer/timeshard")
    for system, rr in ratios.items():
        fire, p99 = (rr[k] or "n/a" for k in rr)
        print(f"  {system:<22} fire x{fire}   p99 lateness x{p99}")
    print("\nnotes:")
    for r in results:
        for note in r.get("notes", []):
            print(f"  {r['system']}: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
