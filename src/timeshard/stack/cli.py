"""``timeshard stack up|down|status``: run Cassandra and ZooKeeper locally in the background.

``up`` records what it started in ``stack.json`` (see ``state.py``) so that ``status`` and
``down`` work from a later process. Progress goes to stderr; ``up --json`` prints the addresses
as its last stdout line, e.g. ``{"cassandra": "127.0.0.1:9042", "zookeeper": "127.0.0.1:2181"}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Any

from timeshard.stack.cassandra import CassandraProcess, cql_ready
from timeshard.stack.process import StackError, pid_matches, port_open, stop_pid
from timeshard.stack.state import load_state, save_state, state_file, state_root
from timeshard.stack.zookeeper import ZooKeeperEnsemble, four_letter

SERVICES = ("cassandra", "zookeeper")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stack`` command to the main CLI."""
    parser = subparsers.add_parser(
        "stack",
        help="run Cassandra and ZooKeeper locally (up, down, status)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="stack_action", required=True, metavar="up|down|status")

    up = actions.add_parser("up", help="start the services (those already running are kept)")
    _add_common(up)
    up.add_argument("--cassandra-port", type=int, default=9042, help="CQL port (9042)")
    up.add_argument("--storage-port", type=int, default=7000, help="Cassandra internode (7000)")
    up.add_argument("--zookeeper-port", type=int, default=2181, help="first client port (2181)")
    up.add_argument(
        "--zookeeper-size", type=int, default=1, choices=(1, 3), help="1 standalone, 3 ensemble"
    )
    up.add_argument("--heap", default="1G", help="Cassandra heap (1G)")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for each")
    up.set_defaults(func=_up)

    down = actions.add_parser("down", help="stop what `stack up` started")
    _add_common(down)
    down.add_argument("--timeout", type=float, default=60.0, help="SIGTERM grace period (60)")
    down.set_defaults(func=_down)

    status = actions.add_parser("status", help="show what runs")
    _add_common(status)
    status.set_defaults(func=_status)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", choices=SERVICES, help="just this service")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m timeshard.stack", description=__doc__)
    configure(parser)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _progress(message: str) -> None:
    sys.stderr.write(f"stack: {message}\n")
    sys.stderr.flush()


def _selected(args: argparse.Namespace) -> tuple[str, ...]:
    return (args.only,) if args.only else SERVICES


# -- up ---------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    state = load_state()
    try:
        for service in _selected(args):
            if _alive(service, state.get(service)):
                _progress(f"{service} already runs on {state[service]['address']}")
                continue
            state[service] = _start_cassandra(args) if service == "cassandra" else _start_zk(args)
            save_state(state)
    except StackError as exc:
        _progress(f"error: {exc}")
        return 1
    addresses = {s: state[s]["address"] for s in _selected(args)}
    if args.json:
        sys.stdout.write(json.dumps(addresses) + "\n")
    else:
        for service, address in addresses.items():
            sys.stdout.write(f"{service} {address}\n")
    _progress(f"state in {state_file()}")
    return 0


def _start_cassandra(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = state_root() / f"cassandra-{args.cassandra_port}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh node each time
    node = CassandraProcess(
        port=args.cassandra_port,
        storage_port=args.storage_port,
        run_dir=run_dir,
        heap=args.heap,
        progress=_progress,
    )
    node.start(timeout=args.timeout)
    return {
        "address": node.address,
        "pid": node.pid,
        "run_dir": str(run_dir),
        "version": node.version,
        "start_seconds": round(node.start_seconds or 0.0, 1),
    }


def _start_zk(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = state_root() / f"zookeeper-{args.zookeeper_port}"
    shutil.rmtree(run_dir, ignore_errors=True)
    ensemble = ZooKeeperEnsemble(
        args.zookeeper_size,
        client_port=args.zookeeper_port,
        run_dir=run_dir,
        progress=_progress,
    )
    ensemble.start(timeout=args.timeout)
    return {
        "address": ensemble.hosts,
        "run_dir": str(run_dir),
        "servers": [
            {"address": s.address, "pid": s.pid, "run_dir": str(s.run_dir)}
            for s in ensemble.servers
        ],
    }


# -- status and down --------------------------------------------------------------------------


def _processes(service: str, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The (pid, address, run_dir) records of a service's processes."""
    return list(record["servers"]) if service == "zookeeper" else [record]


def _alive(service: str, record: dict[str, Any] | None) -> bool:
    if not record:
        return False
    return all(pid_matches(p["pid"], p["run_dir"]) for p in _processes(service, record))


def _answers(service: str, address: str) -> bool:
    host, port = address.rsplit(":", 1)
    if service == "cassandra":
        return port_open(host, int(port)) and cql_ready(host, int(port))
    return four_letter(host, int(port), "ruok") == "imok"


def _status(args: argparse.Namespace) -> int:
    state = load_state()
    report: dict[str, Any] = {}
    for service in _selected(args):
        record = state.get(service)
        if not record:
            report[service] = {"running": False}
            continue
        procs = [
            {
                "address": p["address"],
                "pid": p["pid"],
                "running": pid_matches(p["pid"], p["run_dir"]),
                "answers": _answers(service, p["address"]),
            }
            for p in _processes(service, record)
        ]
        report[service] = {
            "address": record["address"],
            "running": all(p["running"] and p["answers"] for p in procs),
            "processes": procs,
        }
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        for service, info in report.items():
            if "address" not in info:
                sys.stdout.write(f"{service}: not started\n")
                continue
            for p in info["processes"]:
                what = "up" if p["running"] and p["answers"] else "running, not answering"
                what = what if p["running"] else "gone"
                sys.stdout.write(f"{service} {p['address']} pid {p['pid']}: {what}\n")
    return 0 if all(info["running"] for info in report.values()) else 3


def _down(args: argparse.Namespace) -> int:
    state = load_state()
    for service in _selected(args):
        record = state.pop(service, None)
        if not record:
            _progress(f"{service}: nothing recorded")
            continue
        for p in _processes(service, record):
            if pid_matches(p["pid"], p["run_dir"]):
                _progress(f"stopping {service} {p['address']} (pid {p['pid']})")
                started = time.monotonic()
                stop_pid(p["pid"], timeout=args.timeout, name=service)
                _progress(f"stopped in {time.monotonic() - started:.1f} s")
            else:
                _progress(f"{service} {p['address']} (pid {p['pid']}) was not running")
        save_state(state)
    if args.json:
        sys.stdout.write(json.dumps({"stopped": list(_selected(args))}) + "\n")
    return 0
