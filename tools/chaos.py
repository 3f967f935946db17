"""The chaos suite: real processes on this machine under a seeded plan of faults, then a check
of every guarantee (timeshard.testing.chaos).

    python tools/chaos.py [--duration SECONDS] [--rate JOBS_PER_S] [--seed N] [--json]
                          [--cassandra-nodes 1|3] [--faults KIND,...]

Starts a Cassandra (three nodes on 127.0.0.11-13 with --cassandra-nodes 3, replication factor
3, QUORUM/SERIAL; one node on 127.0.0.11 with 1), a 3-server ZooKeeper ensemble, 3 scheduler
nodes and 4 worker processes; schedules delayed and cron jobs while it kills, pauses and
restarts workers, nodes, a ZooKeeper server and a Cassandra node, and takes the whole store
away; drains; checks. The fault kinds:

    worker_kill     kill -9 a worker, start it again
    worker_stop     SIGSTOP a worker past its lease, then SIGCONT
    node_kill       kill -9 a scheduler node, start it again
    node_stop       SIGSTOP a scheduler node past its ZooKeeper session, then SIGCONT
    zk_restart      kill -9 one ZooKeeper server of three, start it again
    cassandra_kill  kill -9 one Cassandra node of three, start it again (--cassandra-nodes 3)
    store_outage    kill -9 every Cassandra node (with --cassandra-nodes 1 the only one), hold
                    them down 10-20 s, start them again; over when the store answers

The seeded plan draws from every kind the run can inject; --faults narrows it to a few. Reuse
running services with --cassandra HOST:PORT[,...] / --zookeeper HOST:PORT[,...] (or
TIMESHARD_CASSANDRA and TIMESHARD_ZOOKEEPER when no --cassandra-nodes is given): their servers
are then left alone (no ZooKeeper restarts, no Cassandra kills, no store outages).

Progress goes to stderr; the report to stdout, and with --json its last line is one JSON object.
The exit status is 1 when a must-be-zero count is not zero (lost, overlapping, double_effects,
cron_missing, cron_doubled, ran_after_cancel, early, wrong_state). The run directory (ledger,
journal, store snapshot, process logs) is kept; its path is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from timeshard.node.dispatchconfig import DEFAULT_CLAIM_AHEAD_MS
from timeshard.stack import CassandraCluster
from timeshard.testing.chaos.plan import FaultKind
from timeshard.testing.chaos.run import (
    ChaosConfig,
    ChaosRun,
    Services,
    chosen_kinds,
    injectable_kinds,
    say,
)
from timeshard.testing.services import zookeeper_ensemble


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="soak: --duration 1800 --cassandra-nodes 3"
    )
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load (300)")
    parser.add_argument("--rate", type=float, default=10.0, help="jobs per second (10)")
    parser.add_argument("--seed", type=int, default=1, help="the fault plan and workload (1)")
    parser.add_argument("--json", action="store_true", help="last stdout line: a JSON object")
    parser.add_argument("--cassandra-nodes", type=int, choices=(1, 3), help="start this many")
    parser.add_argument("--cassandra-host", default="127.0.0.11", help="first node's address")
    parser.add_argument("--cassandra", help="reuse this Cassandra (contact points)")
    parser.add_argument("--zookeeper", help="reuse this ZooKeeper (HOST:PORT[,...])")
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--session-timeout", type=float, default=4.0, help="ZooKeeper seconds")
    parser.add_argument("--lease", type=float, default=4.0, help="worker lease seconds")
    parser.add_argument(
        "--claim-ahead-ms",
        type=int,
        default=DEFAULT_CLAIM_AHEAD_MS,
        help="the nodes' --claim-ahead-ms (default %(default)s, as the server's; 0: off): jobs "
        "pushed ahead start on the workers' clocks",
    )
    parser.add_argument("--drain", type=float, default=300.0, help="most seconds to drain")
    parser.add_argument("--no-faults", action="store_true", help="the load alone")
    parser.add_argument(
        "--faults",
        type=_kinds,
        default=(),
        metavar="KIND,...",
        help=f"only these fault kinds ({', '.join(FaultKind)}; default: all the run can inject)",
    )
    parser.add_argument(
        "--dir", type=Path, help="run directory, new or empty (default: a new one in /tmp)"
    )
    args = parser.parse_args(argv)
    try:  # before any service starts: the kinds asked for must be ones this run can inject
        chosen_kinds(_injectable(args), args.faults)
    except ValueError as exc:
        parser.error(str(exc))

    if args.dir is not None and args.dir.exists() and any(args.dir.iterdir()):
        # A run appends to its journal: a second run in one directory would be checked
        # against both runs' jobs.
        parser.error(f"--dir {args.dir}: not empty (a run directory holds one run)")
    run_dir = args.dir or Path(tempfile.mkdtemp(prefix=f"timeshard-chaos-{args.seed}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    config = ChaosConfig(
        duration_s=args.duration,
        rate=args.rate,
        seed=args.seed,
        shards=args.shards,
        lease_s=args.lease,
        claim_ahead_ms=args.claim_ahead_ms,
        session_s=args.session_timeout,
        drain_s=args.drain,
        faults=not args.no_faults,
        fault_kinds=args.faults,
    )
    started = time.monotonic()
    with ExitStack() as stack:
        services = Services(zookeeper="", cassandra="")  # each started or reused, below
        _zookeeper(args, run_dir, stack, services)
        _cassandra(args, run_dir, stack, services)
        report = ChaosRun(config, services, run_dir).run()
    say(f"run directory: {run_dir} ({time.monotonic() - started:.0f} s in all)")
    sys.stdout.write(report.text() + "\n")
    if args.json:
        sys.stdout.write(json.dumps(report.as_json()) + "\n")
    return 0 if report.ok else 1


def _kinds(text: str) -> tuple[FaultKind, ...]:
    try:
        return tuple(FaultKind(k.strip()) for k in text.split(",") if k.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; the kinds: {', '.join(FaultKind)}") from exc


def _reused_zookeeper(args: argparse.Namespace) -> str | None:
    return args.zookeeper or os.environ.get("TIMESHARD_ZOOKEEPER")


def _reused_cassandra(args: argparse.Namespace) -> str | None:
    return args.cassandra or (
        os.environ.get("TIMESHARD_CASSANDRA") if args.cassandra_nodes is None else None
    )


def _injectable(args: argparse.Namespace) -> tuple[FaultKind, ...]:
    """The kinds the services these arguments start (or reuse) will let the run inject."""
    return injectable_kinds(
        zookeepers=0 if _reused_zookeeper(args) else 3,
        cassandras=0 if _reused_cassandra(args) else args.cassandra_nodes or 3,
    )


def _zookeeper(args: argparse.Namespace, run_dir: Path, stack: ExitStack, s: Services) -> None:
    given = _reused_zookeeper(args)
    if given:
        say(f"using ZooKeeper {given} (no ZooKeeper restarts)")
        s.zookeeper = given
        return
    ensemble = zookeeper_ensemble(3, run_dir / "services" / "zookeeper")
    stack.callback(ensemble.stop)
    s.zookeeper, s.ensemble = ensemble.hosts, ensemble


def _cassandra(args: argparse.Namespace, run_dir: Path, stack: ExitStack, s: Services) -> None:
    given = _reused_cassandra(args)
    if given:
        say(f"using Cassandra {given} (no Cassandra kills, no store outages)")
        s.cassandra = given
        return
    nodes = args.cassandra_nodes or 3
    services_dir = run_dir / "services" / "cassandra"
    cluster = CassandraCluster(
        nodes,
        run_dir=services_dir,
        first_host=args.cassandra_host,
        heap="512M" if nodes > 1 else "1G",
        cluster_name="timeshard-chaos",
        progress=say,
    )
    say(f"starting {nodes} Cassandra node(s) from {args.cassandra_host} (a minute or two)")
    cluster.start(timeout=300.0 * nodes)

    def stop() -> None:
        cluster.stop()
        for node in cluster.nodes:  # the logs stay; the data would take gigabytes
            shutil.rmtree(node.run_dir / "data", ignore_errors=True)

    stack.callback(stop)
    s.cassandra, s.cluster = cluster.address, cluster


if __name__ == "__main__":
    sys.exit(main())
