"""Load tests of timeshard through its real processes, side by side with the peers.

    python tools/loadtest.py fire --jobs 20000 --window 10 [--rate R] [--store URL]
                                  [--workers 2] [--batch|--single] [--json] [--plot F.png]
    python tools/loadtest.py steady --rate 1000 --duration 30
    python tools/loadtest.py backlog --stored 10000,1000000 --jobs 10000
    python tools/loadtest.py fire|steady ... --nodes 3 --store cassandra://... [--zookeeper H:P]
    python tools/loadtest.py shards --counts 16,256,1024,4096 [--rate 400] [--store URL]
    python tools/loadtest.py failover --nodes 3 --rate 400 --store cassandra://...
    python tools/loadtest.py peers --jobs 20000 --window 10
    python tools/loadtest.py peers --steady --rate 400 --duration 30 [--peers celery]
    python tools/loadtest.py rated --limit 50 --jobs 1500 [--burst B] [--store URL] [--plot F.png]
    python tools/loadtest.py overload [--duration 300] [--lease 2] [--busy 2] [--work-ms 200]
    python tools/loadtest.py report [--skip backlog,peers]   # the set docs/benchmarks.md shows

Each run starts a ``timeshard server`` (the embedded SQLite store in a temporary folder, or
``--store cassandra://HOST:PORT[/KEYSPACE]``: without a keyspace a fresh one, dropped at the
end) with its metrics endpoint, and W worker processes running a no-op handler that notes when
each run started. Lateness = handler start - due time; early = started before due; lost =
scheduled but not run when nothing more ran for --drain seconds after the last due time;
duplicates = run more than once. CPU seconds per 1,000 jobs come from /proc for the server and
the workers, and from this process for the client. On Cassandra the Paxos rounds per job come
from the server's ``timeshard_store_paxos_rounds_total`` (scraped before and after), and a few
seconds of raw single-row LWTs on the same Cassandra give the ceiling to compare with.

``--nodes N`` runs N servers on ZooKeeper (``--zookeeper``, else $TIMESHARD_ZOOKEEPER; a fresh
root per run) sharing one Cassandra; the clients' calls take turns over the nodes and every
worker polls every node. CPU is then summed over the nodes, and ``per_node`` gives each node's
CPU per fired job, the jobs it claimed and created, the results it took for jobs another node
claimed, and its Paxos rounds. ``shards`` measures, for each shard count, a node owning every
shard with nothing due (its CPU as a share of one core, bucket partitions read per second)
and then a steady rate spread over them. ``failover`` runs ``steady`` on N nodes and kill -9s
the node owning the most shards ``--kill-after`` seconds in: when each of its shards fired
again, the lateness of its jobs against the others', lost, duplicates, and runs that may have
overlapped (a second start within a lease of the first).

Every firing run reports, per fired job: the server's and the workers' CPU (ms), the jobs
claimed per claim message and the results per result message a worker sent (from the server's
``timeshard_worker_messages_total``, ``timeshard_jobs_claimed_total`` and
``timeshard_results_received_total``), the worker stream's requests read and messages
written (``stream_messages_in`` / ``_out``, from ``timeshard_worker_stream_messages_total``),
and on Cassandra the Paxos rounds (the embedded store has none); and the lateness p50 / p99 /
max. ``server_time`` says where the server's share
of the lateness went: the mean from due time to the claim that took a job, of a Claim and a
Finish call, and each store operation's mean time per call (a stream's pushes count as claim
messages and its requests with results as result messages); a steady run on Cassandra adds
``cassandra_side``, Cassandra's own coordinator latency per table and its thread pools with
tasks waiting, to tell a slow Cassandra from a queue on the node's side of the driver.

A steady run reports ingest and fire apart. Creating and firing overlap in it (a job is
created ``--lead`` before it is due), so it first measures ``--idle-s`` seconds with nothing
offered (``idle``: the server's and Cassandra's CPU per second; ``after_run``: the same right
after the run, which adds what the run left behind, not taken off), then ``--ingest-s`` seconds
of creates only at the same rate, due an hour later so none fires (``per_created_job``: CPU
per created job less the idle use, Paxos rounds per created job; and the workers' CPU per
second meanwhile, when they have no job: ``workers_idle_cpu_ms_per_s``); ``per_fired_job``
then adds ``server_cpu_ms_fire_only`` and ``cassandra_cpu_ms_fire_only`` (the run's CPU less
the idle use and the jobs it created at that price, per fired job),
``worker_cpu_ms_fire_only`` (the workers' CPU less their idle use) and, on Cassandra,
``paxos_rounds_by_kind`` (the rounds per fired job by what each carried: ``claim``,
``complete``, ``claim+complete``, ``save_cursor``..., from the server's
``timeshard_store_paxos_rounds_by_kind_total``).

    python tools/loadtest.py schedule --clients 1,8 [--store URL] [--seconds 8]

measures one ScheduleJob call: calls/s and the server's CPU per call for C synchronous clients
(separate processes), on a do-nothing grpc.aio servicer (the floor: same server options, a
pass-through interceptor, a reply of the same shape) and then on timeshard, in the same run,
with the ratio of the two.

External workers (fire and steady): ``--worker-command 'CMD ARGS...'`` runs CMD (split like a
shell would, not through one) instead of the Python load worker, --workers times, each in a
session of its own with this environment:

    TIMESHARD_SERVER       the nodes' gRPC addresses, comma-separated (host:port,...)
    TIMESHARD_RECORD       a file path, a different one for each copy
    TIMESHARD_CONCURRENCY  the handler slots it should run (--concurrency)

It must run a worker for the job type ``loadtest.noop`` (the worker protocol of
docs/architecture.md) whose handler does nothing but append one line per run to
$TIMESHARD_RECORD:

    <job_id> <run_at> <start_ms>

``run_at`` as the job carries it (epoch ms, an integer), ``start_ms`` the wall clock when the
handler started, epoch ms with 3 decimals. Lines may be buffered, but are written out at least
every 0.2 s and at exit; at the end the tool sends SIGTERM to the session and waits 15 s (then
SIGKILL), so the worker must flush on SIGTERM. Its CPU time is read from /proc for the
command's whole process tree. ``timeshard.testing.loadworker`` is the Python one.

``overload`` offers 5x what its workers can run with the CPU starved on purpose, drains, and
holds the run to "late, never dead" (invariant 9): no job dead without a handler start, none
lost, early or run twice at once; ``python tools/loadtest.py overload --help`` says more.

Progress goes to stderr (a bar on a terminal); the figures to stdout, with --json as one JSON
object on the last line.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

import grpc
from bench import overload, rated, report, scale, scenarios
from bench.calls import schedule_cost
from bench.plot import plot, require
from bench.steady import add_options as add_steady_options
from bench.steady import steady as run_steady

from timeshard.node.dispatchconfig import DEFAULT_CLAIM_AHEAD_MS


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store", default="sqlite", help="sqlite (default) or cassandra://HOST:PORT[/KS]"
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (%(default)s)")
    p.add_argument(
        "--concurrency", type=int, default=512, help="handler slots per worker (%(default)s)"
    )
    p.add_argument("--shards", type=int, default=16, help="shards of the store (16)")
    p.add_argument("--lookahead", type=float, default=5.0, help="server --lookahead seconds (5)")
    p.add_argument(
        "--claim-ahead-ms",
        type=int,
        default=DEFAULT_CLAIM_AHEAD_MS,
        metavar="MS",
        help="server --claim-ahead-ms: claim jobs MS before due and hold them (default "
        "%(default)s, as the server's; 0: at due)",
    )
    p.add_argument(
        "--lead",
        type=float,
        default=None,
        help="seconds from now to the first due time (default: from a warm-up)",
    )
    p.add_argument(
        "--drain",
        type=float,
        default=30.0,
        help="after the last due time, give up when nothing ran for this long (%(default)s)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="timeshard server processes (1); more than one share the shards through "
        "--zookeeper and need --store cassandra://...",
    )
    p.add_argument(
        "--zookeeper",
        default="",
        metavar="HOST:PORT",
        help="run the nodes on this ZooKeeper (a fresh root per run) instead of the local "
        "coordinator (with --nodes > 1 it defaults to $TIMESHARD_ZOOKEEPER)",
    )
    p.add_argument(
        "--session-timeout", type=float, default=4.0, help="ZooKeeper session, seconds (4)"
    )
    p.add_argument("--keep", action="store_true", help="keep logs, records and the keyspace")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="lateness and fire rate over time")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--batch",
        dest="mode",
        action="store_const",
        const="batch",
        help="ScheduleJobs batches of 500, 4 in flight (default)",
    )
    mode.add_argument(
        "--single",
        dest="mode",
        action="store_const",
        const="single",
        help="one ScheduleJob per job from a synchronous client",
    )
    p.add_argument(
        "--clients",
        type=int,
        default=1,
        help="with --single: this many synchronous clients at once, each one call at a time (1)",
    )
    p.set_defaults(mode="batch")


def _worker_command(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--worker-command",
        metavar="'CMD ...'",
        help="run this instead of the Python load worker, --workers times (the contract: "
        "see the top of this help)",
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = ap.add_subparsers(dest="command", required=True)

    fire = sub.add_parser("fire", help="N jobs due over a window (or at a rate), then fired")
    fire.add_argument("--jobs", type=int, default=20000)
    fire.add_argument("--window", type=float, default=10.0, help="seconds the due times span")
    fire.add_argument("--rate", type=float, default=0, help="offered jobs/s (window = N / R)")
    fire.add_argument(
        "--lwt-seconds",
        type=float,
        default=4.0,
        help="Cassandra: seconds of raw single-row LWTs measured after the run",
    )
    _common(fire)
    _worker_command(fire)

    steady = sub.add_parser("steady", help="jobs streamed at an offered rate below capacity")
    add_steady_options(steady)
    _common(steady)
    _worker_command(steady)

    backlog = sub.add_parser("backlog", help="bursts fired with N future jobs already stored")
    backlog.add_argument("--stored", default="10000,1000000", help="sizes, e.g. 10000,1000000")
    backlog.add_argument("--jobs", type=int, default=10000, help="jobs in each burst")
    backlog.add_argument("--window", type=float, default=0.0, help="seconds a burst spans (0)")
    _common(backlog)

    many = sub.add_parser(
        "shards", help="a node owning many shards: its idle cost, and steady lateness over them"
    )
    many.add_argument("--counts", default="16,256,1024,4096", help="shard counts, one run each")
    many.add_argument("--idle", type=float, default=20.0, help="seconds measured idle (20)")
    many.add_argument(
        "--settle", type=float, default=8.0, help="seconds after every shard is owned (8)"
    )
    many.add_argument("--rate", type=float, default=400.0, help="steady jobs/s after (0: none)")
    many.add_argument("--duration", type=float, default=20.0, help="seconds of steady load")
    _common(many)

    kill = sub.add_parser(
        "failover", help="steady on several nodes; kill -9 the node owning the most shards"
    )
    kill.add_argument("--rate", type=float, default=400.0, help="jobs per second offered (400)")
    kill.add_argument("--duration", type=float, default=40.0, help="seconds of offered load")
    kill.add_argument(
        "--kill-after", type=float, default=15.0, help="seconds into the run to kill (15)"
    )
    _common(kill)

    peers = sub.add_parser(
        "peers", help="the fire (or --steady) workload on timeshard and on the peers"
    )
    peers.add_argument("--jobs", type=int, default=20000)
    peers.add_argument("--window", type=float, default=10.0)
    peers.add_argument(
        "--peers",
        default=None,
        help="comma-separated (default: celery,procrastinate,aps-sqlite,aps-postgres; "
        "with --steady: celery, the one with a steady mode)",
    )
    peers.add_argument(
        "--peers-python",
        default=None,
        help="the peers' virtualenv Python (default: $TIMESHARD_PEERS_PYTHON, "
        "else /opt/timeshard-peers/bin/python)",
    )
    peers.add_argument(
        "--steady",
        action="store_true",
        help="the steady workload instead (--rate jobs/s for --duration s, each sent --lead "
        "before due; 2 s by default): lateness and CPU per fired job side by side",
    )
    add_steady_options(peers, rate_required=False)
    _common(peers)
    cost = sub.add_parser("schedule", help="ScheduleJob calls/s and server CPU per call")
    cost.add_argument("--clients", default="1,8", help="synchronous client counts (1,8)")
    cost.add_argument("--seconds", type=float, default=8.0, help="seconds per measurement (8)")
    cost.add_argument("--store", default="sqlite", help="sqlite or cassandra://HOST:PORT[/KS]")
    cost.add_argument("--shards", type=int, default=16, help="shards of the store (16)")
    cost.add_argument("--lookahead", type=float, default=5.0, help="server --lookahead (5)")
    cost.add_argument("--keep", action="store_true", help="keep logs and the keyspace")
    cost.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    cost.set_defaults(workers=0, concurrency=1, plot=None)
    _common(rated.add_parser(sub))
    starved = overload.add_parser(sub)
    _common(starved)
    starved.set_defaults(**overload.DEFAULTS)
    report.add_parser(sub)
    return ap


def show(result: dict[str, Any], indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            show(value, indent + "  ")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            print(f"{indent}{key}:")
            for i, item in enumerate(value):
                print(f"{indent}  [{i}]")
                show(item, indent + "    ")
        else:
            print(f"{indent}{key:>{32 - len(indent)}}: {value}")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "plot", None):
        require()
    if args.command == "report":
        report.report(args, parser().parse_args)
        return 0
    load_before = report.loadavg()
    # A SIGTERM unwinds as Ctrl-C does, so the scenario's cleanup stops the server, workers
    # and busy processes it started instead of leaving them running.
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        if args.command == "peers":
            from bench.peers import compare

            result, series = compare(args)
        elif args.command == "schedule":
            result, series = schedule_cost(args)
        elif args.command in ("shards", "failover"):
            result, series = getattr(scale, args.command)(args)
        elif args.command == "rated":
            result, series = rated.rated(args)
        elif args.command == "overload":
            result, series = overload.overload(args)
        elif args.command == "steady":
            result, series = run_steady(args)
        else:
            result, series = getattr(scenarios, args.command)(args)
    except grpc.RpcError as exc:
        code, details = exc.code().name, exc.details()  # type: ignore[attr-defined]
        raise SystemExit(f"loadtest: the server answered {code}: {details}") from None
    except KeyboardInterrupt:
        print("loadtest: interrupted; what it started is stopped", file=sys.stderr)
        return 130
    during = result.get("load_average", {})
    result["load_average"] = {"before": load_before, **during, "after": report.loadavg()}
    given = sys.argv[1:] if argv is None else argv
    result["command"] = " ".join(a for a in given if a != "--json")
    if args.plot:
        if args.command == "rated":
            rated.plot_rated(args.plot, result)
        else:
            plot(args.plot, series, f"timeshard loadtest {args.command}")
        scenarios.note(f"plot written to {args.plot}")
    if args.command == "peers":
        from bench.peers import table

        print(table(result))
    elif not args.json:
        show(result)
    if result.get("failed"):
        print(f"FAIL: {', '.join(f'{k} {result[k]}' for k in result['failed'])} (must be 0)")
    if args.json:
        print(json.dumps(result))
    if result.get("failed"):
        return 1  # the run's own must-be-zero figures
    # this run, or its rows (backlog sizes; in peers, timeshard's row but not the peers')
    rows = [
        r for r in result.get("results", []) if r.get("system", "timeshard+")[:10] == "timeshard+"
    ]
    runs = [result, *rows]
    bad = any(r.get("lost") or r.get("duplicates") or r.get("early") for r in runs)
    return 1 if bad else 0  # a timeshard run lost, repeated or started a job early


if __name__ == "__main__":
    sys.exit(main())
