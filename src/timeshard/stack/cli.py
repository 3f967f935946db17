"""``timeshard stack up|down|status``: run Cassandra and ZooKeeper locally in the background.

``up`` records what it started in ``stack.json`` (see ``state.py``) so that ``status`` and
``down`` work from a later process. Progress goes to stderr; ``up --json`` prints the addresses
as its last stdout line (one line unless stdout is a terminal), e.g.
``{"cassandra": "127.0.0.1:9042", "zookeeper": "127.0.0.1:2181"}``.

``up --cassandra-nodes 3`` starts a cluster of three Cassandra nodes on 127.0.0.1, .2 and .3
(``--cassandra-host`` moves the first address), all on the same ports; ``"cassandra"`` is then
the list of contact points, ``127.0.0.1:9042,127.0.0.2:9042,127.0.0.3:9042``. Use it with a
keyspace replicated on all three, e.g.
``cassandra://127.0.0.1:9042,127.0.0.2:9042,127.0.0.3:9042/ks?rf=3&consistency=quorum&serial=serial``.
``up --cassandra-auth`` turns on password authentication; the superuser's credentials are
printed (``cassandra_username`` and ``cassandra_password`` in the JSON line) and recorded.

Both servers run from jars that Maven fetches from Maven Central on first use (cached in
``$TIMESHARD_CACHE``, default ``~/.cache/timeshard``): ``up`` needs Java 17 and Maven, nothing
else. ``--zookeeper-jars debian`` (or ``TIMESHARD_ZOOKEEPER_JARS=debian``) runs Debian's
``zookeeper`` package instead. ``TIMESHARD_STATE`` (default ``~/.local/state/timeshard``) holds
the run directories and the record of what runs: a second stack beside the first needs its own
state directory and ports, e.g.
``TIMESHARD_STATE=/tmp/s2 timeshard stack up --cassandra-port 19042 --storage-port 17000
--zookeeper-port 12181``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from timeshard.argtypes import MAX_PORT, number, whole
from timeshard.console import Exit, print_json
from timeshard.stack.cassandra import TIMER_SLACK_US, cql_ready
from timeshard.stack.cassandra_cluster import CassandraCluster, ring_problem
from timeshard.stack.process import StackError, pid_matches, port_open, stop_pid
from timeshard.stack.state import load_state, save_state, state_file, state_root
from timeshard.stack.zookeeper import (
    JAR_SOURCES,
    ZooKeeperEnsemble,
    describe_jars,
    four_letter,
)

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
    up.add_argument(
        "--cassandra-port", type=whole(1, MAX_PORT), help="CQL port of every node (9042)"
    )
    up.add_argument(
        "--cassandra-nodes",
        type=whole(1, 250),
        help="Cassandra nodes, one per loopback address (1)",
    )
    up.add_argument(
        "--cassandra-host", help="address of the first node; the others take the next (127.0.0.1)"
    )
    up.add_argument(
        "--cassandra-auth",
        action="store_true",
        default=None,
        help="password authentication (superuser cassandra/cassandra)",
    )
    up.add_argument(
        "--unsafe-system",
        action="store_true",
        help="tests only: faster schema changes, but a killed node forgets its recent ones",
    )
    up.add_argument(
        "--storage-port", type=whole(1, MAX_PORT), default=7000, help="Cassandra internode (7000)"
    )
    up.add_argument(
        "--zookeeper-port",
        type=whole(1, MAX_PORT - 2),
        default=2181,
        help="first client port (2181)",
    )
    up.add_argument(
        "--zookeeper-size", type=int, default=1, choices=(1, 3), help="1 standalone, 3 ensemble"
    )
    up.add_argument(
        "--zookeeper-jars",
        choices=JAR_SOURCES,
        help="ZooKeeper's jars: fetched from Maven Central (cached), or Debian's zookeeper "
        "package (env TIMESHARD_ZOOKEEPER_JARS; default maven)",
    )
    up.add_argument("--heap", help="heap of each Cassandra node (1G; 512M with several nodes)")
    up.add_argument(
        "--cassandra-timer-slack-us",
        type=whole(0, 1_000_000),
        default=TIMER_SLACK_US,
        help=f"timer slack of Cassandra's threads, us ({TIMER_SLACK_US}; 0: the kernel's 50)",
    )
    up.add_argument(
        "--timeout", type=number(above=0), default=180.0, help="seconds to wait for each"
    )
    up.set_defaults(func=_up)

    down = actions.add_parser("down", help="stop what `stack up` started")
    _add_common(down)
    down.add_argument(
        "--timeout", type=number(lo=0), default=60.0, help="SIGTERM grace period (60)"
    )
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


def _quiet_driver() -> None:
    """The driver logs every host it discovers: noise for a command that checks a cluster."""
    logging.getLogger("cassandra").setLevel(logging.WARNING)


def _progress(message: str) -> None:
    sys.stderr.write(f"stack: {message}\n")
    sys.stderr.flush()


def _selected(args: argparse.Namespace) -> tuple[str, ...]:
    return (args.only,) if args.only else SERVICES


# -- up ---------------------------------------------------------------------------------------

CASSANDRA_DEFAULTS: dict[str, Any] = {"nodes": 1, "host": "127.0.0.1", "port": 9042, "auth": False}


def _cassandra_shape(args: argparse.Namespace) -> dict[str, Any]:
    """The Cassandra asked for: only the options given (None for the rest)."""
    return {
        "nodes": args.cassandra_nodes,
        "host": args.cassandra_host,
        "port": args.cassandra_port,
        "auth": args.cassandra_auth,
    }


def _recorded_shape(record: dict[str, Any]) -> dict[str, Any]:
    first = _processes("cassandra", record)[0]["address"]
    host, port = first.rsplit(":", 1)
    nodes = len(_processes("cassandra", record))
    return {"nodes": nodes, "host": host, "port": int(port), "auth": bool(record.get("auth"))}


def _up(args: argparse.Namespace) -> int:
    _quiet_driver()
    state = load_state()
    started: list[str] = []
    try:
        for service in _selected(args):
            record = state.get(service)
            if _alive(service, record):
                assert record is not None
                if service == "cassandra":
                    _check_same_cassandra(args, record)
                _progress(f"{service} already runs on {record['address']}")
                continue
            state[service] = _start_cassandra(args) if service == "cassandra" else _start_zk(args)
            save_state(state)
            started.append(service)
    except StackError as exc:
        _progress(f"error: {exc}")
        return Exit.ERROR
    addresses: dict[str, str] = {s: state[s]["address"] for s in _selected(args)}
    cassandra = state.get("cassandra", {}) if "cassandra" in addresses else {}
    if cassandra.get("auth"):
        addresses["cassandra_username"] = cassandra["username"]
        addresses["cassandra_password"] = cassandra["password"]
    if args.json:  # "started": what this call started (a script stops only those)
        print_json({**addresses, "started": started})
    else:
        for service in _selected(args):
            sys.stdout.write(f"{service} {addresses[service]}\n")
        if cassandra.get("auth"):
            sys.stdout.write(
                f"cassandra user {cassandra['username']} password {cassandra['password']}\n"
            )
    _progress(f"state in {state_file()}")
    return 0


def _check_same_cassandra(args: argparse.Namespace, record: dict[str, Any]) -> None:
    """A running Cassandra is kept only if it is what was asked for (a test run against one
    node when it asked for three would prove nothing)."""
    have = _recorded_shape(record)
    differs = {k: v for k, v in _cassandra_shape(args).items() if v is not None and v != have[k]}
    if differs:
        asked = ", ".join(f"{k}={v}" for k, v in differs.items())
        running = ", ".join(f"{k}={v}" for k, v in have.items())
        raise StackError(
            f"cassandra already runs with {running}, not {asked}: "
            "stop it first (stack down --only cassandra)"
        )


def _start_cassandra(args: argparse.Namespace) -> dict[str, Any]:
    shape = {
        k: v if v is not None else CASSANDRA_DEFAULTS[k] for k, v in _cassandra_shape(args).items()
    }
    run_dir = state_root() / f"cassandra-{shape['host']}-{shape['port']}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh cluster each time
    cluster = CassandraCluster(
        shape["nodes"],
        first_host=shape["host"],
        port=shape["port"],
        storage_port=args.storage_port,
        run_dir=run_dir,
        heap=args.heap or ("1G" if shape["nodes"] == 1 else "512M"),
        auth=shape["auth"],
        unsafe_system=args.unsafe_system,
        timer_slack_us=args.cassandra_timer_slack_us,
        progress=_progress,
    )
    cluster.start(timeout=args.timeout * cluster.size)
    record: dict[str, Any] = {
        "address": cluster.address,
        "nodes": [
            {"address": n.address, "pid": n.pid, "run_dir": str(n.run_dir)} for n in cluster.nodes
        ],
        "run_dir": str(run_dir),
        "version": cluster.nodes[0].version,
        "heap": cluster.nodes[0].heap,
        "auth": shape["auth"],
        "unsafe_system": args.unsafe_system,
        "timer_slack_us": args.cassandra_timer_slack_us,
        "start_seconds": round(cluster.start_seconds or 0.0, 1),
    }
    if cluster.credentials:
        record["username"], record["password"] = cluster.credentials
    return record


def _start_zk(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = state_root() / f"zookeeper-{args.zookeeper_port}"
    shutil.rmtree(run_dir, ignore_errors=True)
    ensemble = ZooKeeperEnsemble(
        args.zookeeper_size,
        client_port=args.zookeeper_port,
        run_dir=run_dir,
        jars=args.zookeeper_jars,
        progress=_progress,
    )
    ensemble.start(timeout=args.timeout)
    return {
        "address": ensemble.hosts,
        "jars": describe_jars(ensemble.jars),
        "run_dir": str(run_dir),
        "servers": [
            {"address": s.address, "pid": s.pid, "run_dir": str(s.run_dir)}
            for s in ensemble.servers
        ],
    }


# -- status and down --------------------------------------------------------------------------


def _processes(service: str, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The (pid, address, run_dir) records of a service's processes (a Cassandra recorded
    before clusters existed is its own single process record)."""
    if service == "zookeeper":
        return list(record["servers"])
    return list(record.get("nodes") or [record])


def _credentials(record: dict[str, Any]) -> tuple[str, str] | None:
    return (record["username"], record["password"]) if record.get("auth") else None


def _alive(service: str, record: dict[str, Any] | None) -> bool:
    if not record:
        return False
    return all(pid_matches(p["pid"], p["run_dir"]) for p in _processes(service, record))


def _answers(service: str, address: str, record: dict[str, Any]) -> bool:
    host, port = address.rsplit(":", 1)
    if service == "cassandra":
        return port_open(host, int(port)) and cql_ready(
            host, int(port), credentials=_credentials(record)
        )
    return four_letter(host, int(port), "ruok") == "imok"


def _status(args: argparse.Namespace) -> int:
    _quiet_driver()
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
                "answers": _answers(service, p["address"], record),
            }
            for p in _processes(service, record)
        ]
        info: dict[str, Any] = {
            "address": record["address"],
            "running": all(p["running"] and p["answers"] for p in procs),
            "processes": procs,
        }
        if service == "cassandra" and len(procs) > 1 and info["running"]:
            problem = ring_problem(record["address"], len(procs), _credentials(record))
            info["ring"] = problem or "complete"
            info["running"] = problem is None
        report[service] = info
    if args.json:
        print_json(report)
    else:
        _print_status(report)
    return Exit.OK if all(info["running"] for info in report.values()) else Exit.ERROR


def _print_status(report: dict[str, Any]) -> None:
    for service, info in report.items():
        if "address" not in info:
            sys.stdout.write(f"{service}: not started\n")
            continue
        for p in info["processes"]:
            what = "up" if p["running"] and p["answers"] else "running, not answering"
            what = what if p["running"] else "gone"
            sys.stdout.write(f"{service} {p['address']} pid {p['pid']}: {what}\n")
        if "ring" in info:
            sys.stdout.write(f"{service} ring: {info['ring']}\n")


def _down(args: argparse.Namespace) -> int:
    state = load_state()
    for service in _selected(args):
        record = state.pop(service, None)
        if not record:
            _progress(f"{service}: nothing recorded")
            continue
        procs = _processes(service, record)
        with ThreadPoolExecutor(len(procs)) as pool:  # nodes stop together, not in turn
            list(pool.map(_stop, [service] * len(procs), procs, [args.timeout] * len(procs)))
        save_state(state)
    if args.json:
        print_json({"stopped": list(_selected(args))})
    return 0


def _stop(service: str, proc: dict[str, Any], timeout: float) -> None:
    if not pid_matches(proc["pid"], proc["run_dir"]):
        _progress(f"{service} {proc['address']} (pid {proc['pid']}) was not running")
        return
    _progress(f"stopping {service} {proc['address']} (pid {proc['pid']})")
    started = time.monotonic()
    stop_pid(proc["pid"], timeout=timeout, name=service)
    _progress(f"stopped {service} {proc['address']} in {time.monotonic() - started:.1f} s")
