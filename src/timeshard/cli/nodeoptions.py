"""The options of a node (``timeshard dev`` and ``timeshard server``): shards, lookahead,
claims ahead, retention, limits, the types file, the HTTP ports; and the checks of their values
that can be made before the node starts (a bad one is refused naming its flag)."""

from __future__ import annotations

import argparse
from pathlib import Path

from timeshard.cli.common import number, port, shard_count, whole
from timeshard.errors import InvalidArgument
from timeshard.limits import (
    DEFAULT_MAX_UNSTARTED,
    DEFAULT_PRIORITY_AGING_MS,
    MAX_PRIORITY,
    MAX_UNSTARTED,
)
from timeshard.node.dispatchconfig import DEFAULT_CLAIM_AHEAD_MS, READ_MARGIN_S, DispatchConfig
from timeshard.node.retry import RetryPolicy
from timeshard.views.console.access import session_secret


def node_options(p: argparse.ArgumentParser, *, shards: int, http_port: int = 0) -> None:
    p.add_argument(
        "--shards",
        type=shard_count,
        default=shards,
        help="shard count, a power of two (fixed per cluster)",
    )
    p.add_argument(
        "--lookahead",
        type=number(lo=MIN_LOOKAHEAD_S, hi=3600, note="seconds"),
        default=5.0,
        help=f"seconds read ahead (at least {MIN_LOOKAHEAD_S:g}: a bucket refresh every second "
        "and the time it takes)",
    )
    p.add_argument(
        "--retention-hours",
        type=number(above=0, hi=MAX_RETENTION_HOURS, note="hours; Cassandra's TTL limit"),
        default=7 * 24,
        help="keep succeeded and cancelled jobs this long (7 days)",
    )
    p.add_argument(
        "--dead-retention-hours",
        type=number(above=0, hi=MAX_RETENTION_HOURS, note="hours; Cassandra's TTL limit"),
        default=30 * 24,
        help="keep dead letters this long unless replayed or purged (30 days)",
    )
    p.add_argument(
        "--ledger-retention-days",
        type=number(above=0, hi=MAX_RETENTION_HOURS / 24, note="days; Cassandra's TTL limit"),
        default=30,
        help="keep the occurrence ledger (`timeshard why`), and a deleted schedule's history, "
        "this long (30 days)",
    )
    p.add_argument(
        "--retry-base",
        type=number(above=0, hi=RetryPolicy().max_backoff_s, note="seconds, up to the max backoff"),
        default=1.0,
        help="retry backoff base seconds",
    )
    p.add_argument(
        "--priority-aging",
        type=number(above=0, hi=3600, note="seconds"),
        default=DEFAULT_PRIORITY_AGING_MS / 1000,
        help="a waiting job gains one priority level per this many seconds, so a priority-0 "
        f"job waits at most {MAX_PRIORITY}x this longer than a priority-{MAX_PRIORITY} one",
    )
    p.add_argument(
        "--max-ready",
        type=whole(1, note="due jobs"),
        default=None,
        metavar="N",
        help="refuse due-now ScheduleJob calls (RESOURCE_EXHAUSTED with a retry-after) while this "
        "node holds N due jobs that no worker started; future jobs are always accepted "
        "(default: no bound)",
    )
    p.add_argument(
        "--claim-ahead-ms",
        type=whole(0, 60_000, note="ms"),
        default=DEFAULT_CLAIM_AHEAD_MS,
        metavar="MS",
        help="claim jobs up to MS before they are due, a batch per bucket partition, and hold "
        "them until due: a waiting worker gets them at due time with no store call, a Python "
        "worker ahead, to start on its own clock (default %(default)s; 0: claim at due "
        "time); less than the lookahead and half the default lease",
    )
    p.add_argument(
        "--max-unstarted",
        type=whole(1, MAX_UNSTARTED, note="deliveries"),
        default=DEFAULT_MAX_UNSTARTED,
        metavar="N",
        help='a job delivered N times without its handler starting is dead, "never started" '
        f"(a type's policy may say otherwise; default {DEFAULT_MAX_UNSTARTED}); such "
        "deliveries never count as attempts",
    )
    p.add_argument(
        "--types",
        help='JSON file of per-type policies and flows: {"email.send": {"max_attempts": 5, '
        '"retry_base": 2, "retry_max": 600, "concurrency": 10, "rate": 50, "burst": 10, '
        '"paused": false}} (stored settings win)',
    )
    metrics_options(p, what="Prometheus metrics, and the status page at /")
    p.add_argument(
        "--audit-log",
        default="",
        metavar="FILE",
        help="also append the console's operator actions to this JSON Lines file (they are "
        "written to the store in any case; timeshard audit FILE prints it; default for dev: "
        "audit.jsonl in --data)",
    )
    p.add_argument(
        "--console-secret-file",
        dest="console_secret",
        type=secret_file,
        default="",
        metavar="FILE",
        help="the key that signs console sessions, so they survive a restart (give every node "
        "the same file: a session then works on each; default for dev: console-secret in "
        "--data, made on first start; for server: a new key at each start)",
    )
    p.add_argument(
        "--http-port",
        type=port(zero="off"),
        default=http_port,
        metavar="PORT",
        help="serve the operator console (/console/), the status page (/, /status.json) and "
        "/metrics on this port too "
        + (
            "(default: the port after --port, or any free one if that is taken; 0: off)"
            if http_port == HTTP_BESIDE
            else "(default: only on --metrics-port)"
        ),
    )


def secret_file(path: str) -> str:
    """The console's session key, read from the file ``--console-secret-file`` names ("" for
    none: argparse passes the default through here too)."""
    if not path:
        return ""
    try:
        return session_secret(Path(path), create=False)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def check_claim_ahead(ahead_ms: int, lookahead_s: float, lease_s: float) -> None:
    """A claim ahead is made from the entries read ahead, and held within its lease."""
    if ahead_ms >= lookahead_s * 1000:
        raise InvalidArgument(
            "--claim-ahead-ms",
            f"{ahead_ms} ms is not less than the lookahead ({lookahead_s:g} s): jobs are "
            "claimed ahead from the entries read ahead; lower it or raise --lookahead",
        )
    if 2 * ahead_ms > lease_s * 1000:
        raise InvalidArgument(
            "--claim-ahead-ms",
            f"{ahead_ms} ms is more than half the default lease ({lease_s:g} s): a held job "
            "must have most of its lease left when a worker gets it",
        )


HTTP_BESIDE = -1
"""``timeshard dev``'s default ``--http-port``: the port after the node's (``_http_beside``)."""

MIN_LOOKAHEAD_S = DispatchConfig().refresh_s + READ_MARGIN_S


def metrics_options(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument(
        "--metrics-port",
        type=port(zero="off"),
        default=0,
        metavar="PORT",
        help=f"serve {what} at http://METRICS_HOST:PORT/metrics (default: off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="listen address of the HTTP ports (no authentication: keep it private)",
    )


MAX_RETENTION_HOURS = 20 * 365 * 24  # Cassandra refuses a TTL over 20 years
