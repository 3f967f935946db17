"""``timeshard status [--json]``: the cluster at a glance.

Asks the nodes behind ``--server`` for the members (``ClusterInfo``), then every member for
its state (``AdminService.NodeStatus``, admin role) and merges the answers: health of each node,
shards per node and the shards nobody dispatches, each shard's due entries and dispatch lag,
the job types whose due jobs wait for a claim and for how long (no worker, a typo in a type, a
pause or a concurrency limit: the dispatch lag does not show these, it is how far an owner is
behind), the dead-letter queue's size, recent lateness percentiles (the nodes' lateness buckets
add up) and the latest failures.

Exits 1 when a node did not answer or is not serving, or a shard has no owner (for scripts).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from timeshard.cli.common import add_json_option, number
from timeshard.cli.shards import Admin, _rpc
from timeshard.console import Exit, print_json, when
from timeshard.errors import PermissionDenied, TimeshardError, Unauthenticated, Unavailable
from timeshard.observe.window import percentiles
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, ts_ms

LAG_WARN_MS = 5_000
_HELD = {"paused": "paused", "rate": "held by its rate"}
UNCLAIMED_WARN_MS = 60_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="the cluster at a glance: nodes, shards, lag, DLQ, lateness")
    add_json_option(p, "the merged state of the cluster")
    p.add_argument(
        "--window",
        type=number(10, 900, note="seconds"),
        default=300.0,
        metavar="SECONDS",
        help="recent lateness over this long (10-900)",
    )
    p.set_defaults(func=cmd_status)


def gather(servers: str, window_s: float) -> dict[str, Any]:
    """The merged state of the cluster behind ``servers``."""
    with Admin(servers) as admin:
        info = admin.cluster()
        answers: dict[str, pb.NodeStatusResponse | None] = {}
        errors: dict[str, str] = {}
        for node in info.nodes:
            try:
                answers[node.node_id] = _rpc(
                    admin.stub(node.address).NodeStatus,
                    pb.NodeStatusRequest(window=dur(round(window_s * 1000))),
                )
            except (PermissionDenied, Unauthenticated):
                raise  # it answered: no to these credentials
            except TimeshardError as exc:
                answers[node.node_id] = None
                errors[node.node_id] = exc.message
    if not any(answers.values()):
        raise Unavailable("no node answered NodeStatus")
    return merge(info, answers, errors, window_s)


def merge(
    info: pb.ClusterInfoResponse,
    answers: dict[str, pb.NodeStatusResponse | None],
    errors: dict[str, str],
    window_s: float,
) -> dict[str, Any]:
    nodes = [_node_row(n, answers.get(n.node_id), errors) for n in info.nodes]
    m = _Merged()
    for n in info.nodes:
        a = answers.get(n.node_id)
        if a is not None:
            m.add(n.node_id, a)
    shards = m.shards
    all_answered = all(answers.values())
    unowned = [s for s in range(info.num_shards) if s not in shards] if all_answered else None
    late = percentiles(m.buckets, m.top)
    return {
        "num_shards": info.num_shards,
        "nodes": nodes,
        "shards": [shards[s] for s in sorted(shards)],
        "shards_without_owner": unowned,
        "dead_letters": m.dead,
        "unclaimed": sorted(m.unclaimed.values(), key=lambda t: (-t["oldest_age_ms"], t["type"])),
        "lateness": {"window_s": window_s, **late.as_dict()},
        "schedule_to_start": {
            t: percentiles(seen, most).as_dict() for t, (seen, most) in sorted(m.starts.items())
        },
        "recent_failures": sorted(m.failures, key=lambda e: e["at"], reverse=True)[:20],
    }


def _node_row(
    n: pb.Node, a: pb.NodeStatusResponse | None, errors: dict[str, str]
) -> dict[str, Any]:
    """One node's line of the table: its health, or why it did not answer."""
    row: dict[str, Any] = {"node_id": n.node_id, "address": n.address, "answered": a is not None}
    if a is None:
        row["error"] = errors.get(n.node_id, "")
        return row
    row.update(
        serving=a.serving,
        store_reachable=a.store_reachable,
        store_error=a.store_error,
        coordinator_connected=a.coordinator_connected,
        shards=len(a.shards),
        streams_behind=a.streams_behind,
        ready_due=a.ready_due,
        due=sum(s.due for s in a.shards),
        max_lag_ms=max((s.dispatch_lag_ms for s in a.shards), default=0),
    )
    return row


@dataclass
class _Merged:
    """The nodes' answers added up, one node at a time: the shards each dispatches, the
    lateness and start-delay buckets (they add up), the dead-letter count (whoever counted it),
    recent failures and the job types whose due jobs wait unclaimed."""

    shards: dict[int, dict[str, Any]] = field(default_factory=dict)
    buckets: dict[float, int] = field(default_factory=dict)
    top: float = 0.0
    dead: dict[str, Any] | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    unclaimed: dict[str, dict[str, Any]] = field(default_factory=dict)
    starts: dict[str, tuple[dict[float, int], float]] = field(default_factory=dict)

    def add(self, node_id: str, a: pb.NodeStatusResponse) -> None:
        for s in a.shards:
            self.shards[s.shard] = {
                "shard": s.shard,
                "owner": node_id,
                "epoch": s.epoch,
                "due": s.due,
                "dispatch_lag_ms": s.dispatch_lag_ms,
                "ready": s.ready,
            }
        for b in a.lateness:
            self.buckets[b.le_ms] = self.buckets.get(b.le_ms, 0) + b.count
        self.top = max(self.top, a.lateness_max_ms)
        for d in a.start_delay:
            seen, most = self.starts.get(d.type, ({}, 0.0))
            for b in d.buckets:
                seen[b.le_ms] = seen.get(b.le_ms, 0) + b.count
            self.starts[d.type] = (seen, max(most, d.max_ms))
        if a.dead_letters_counted:
            self.dead = {
                "count": a.dead_letters,
                "counted_by": node_id,
                "counted_at": when(ts_ms(a.dead_letters_at)),
            }
        self.failures += [_event(e, node_id) for e in a.recent_failures]
        for w in a.unclaimed:
            t = self.unclaimed.setdefault(
                w.type, {"type": w.type, "jobs": 0, "oldest_age_ms": 0, "held": None}
            )
            t["jobs"] += w.jobs
            t["oldest_age_ms"] = max(t["oldest_age_ms"], w.oldest_age_ms)
            if w.held and t["held"] != "paused":  # paused anywhere says more than a rate
                t["held"] = w.held


def _event(e: pb.JobEvent, node: str) -> dict[str, Any]:
    return {
        "at": when(ts_ms(e.at)),
        "node": node,
        "job_id": e.job_id,
        "type": e.type,
        "shard": e.shard,
        "attempt": e.attempt,
        "kind": e.kind,
        "error": e.error,
    }


def _ms(v: float) -> str:
    return f"{v / 1000:.2f}s" if v >= 1000 else f"{v:.0f}ms"


def render(st: dict[str, Any]) -> list[str]:
    return [*_summary(st), *_node_lines(st["nodes"]), *_attention(st)]


def _summary(st: dict[str, Any]) -> list[str]:
    """The cluster in a few lines: nodes and shard owners, the dead letters, lateness and
    schedule-to-start; then the node table's header."""
    unowned = st["shards_without_owner"]
    owner_note = (
        "owners unknown (a node did not answer)"
        if unowned is None
        else f"{len(unowned)} without an owner" + (f": {unowned[:20]}" if unowned else "")
    )
    dead = st["dead_letters"]
    dlq = (
        f"{dead['count']} (counted {dead['counted_at']} by {dead['counted_by']})"
        if dead
        else "not counted yet"
    )
    late = st["lateness"]
    return [
        f"{len(st['nodes'])} node(s), {st['num_shards']} shards, {owner_note}",
        f"dead letters: {dlq}",
        f"lateness, last {late['window_s']:g} s ({late['count']} claims): "
        f"p50 {_ms(late['p50_ms'])}  p90 {_ms(late['p90_ms'])}  p99 {_ms(late['p99_ms'])}  "
        f"max {_ms(late['max_ms'])}",
        *(
            f"schedule-to-start {t} ({d['count']} starts): p50 {_ms(d['p50_ms'])}  "
            f"p99 {_ms(d['p99_ms'])}  max {_ms(d['max_ms'])}"
            for t, d in list(st["schedule_to_start"].items())[:20]
        ),
        "",
        f"{'NODE':<20} {'ADDRESS':<22} {'HEALTH':<12} {'SHARDS':>6} {'DUE':>6} {'MAX LAG':>8}",
    ]


def _node_lines(nodes: list[dict[str, Any]]) -> list[str]:
    out = []
    for n in nodes:
        if not n["answered"]:
            out.append(f"{n['node_id']:<20} {n['address']:<22} no answer: {n.get('error', '')}")
            continue
        health = "SERVING" if n["serving"] else "NOT_SERVING"
        why = []
        if not n["store_reachable"]:
            why.append(f"store: {n['store_error']}")
        if not n["coordinator_connected"]:
            why.append("coordinator session lost")
        out.append(
            f"{n['node_id']:<20} {n['address']:<22} {health:<12} {n['shards']:>6} "
            f"{n['due']:>6} {_ms(n['max_lag_ms']):>8}"
            + (f"  ({'; '.join(why)})" if why else "")
            + (
                f"  [{n['streams_behind']} worker stream(s) behind: claims paused]"
                if n.get("streams_behind")
                else ""
            )
        )
    return out


def _attention(st: dict[str, Any]) -> list[str]:
    """What needs a look, if anything: shards behind, due jobs nobody claims, recent
    failures."""
    out: list[str] = []
    behind = [s for s in st["shards"] if s["dispatch_lag_ms"] > LAG_WARN_MS]
    if behind:
        out += ["", f"shards behind (dispatch lag over {LAG_WARN_MS // 1000} s):"]
        out += [
            f"  shard {s['shard']} on {s['owner']}: {s['due']} due, lag {_ms(s['dispatch_lag_ms'])}"
            for s in sorted(behind, key=lambda s: -s["dispatch_lag_ms"])[:20]
        ]
    waiting = [t for t in st["unclaimed"] if t["jobs"]]
    if waiting:
        out += ["", "due jobs nobody has claimed (no worker for the type? paused? at its limit?):"]
        out += [
            f"  {t['type']}: {t['jobs']} waiting, oldest due {_ms(t['oldest_age_ms'])} ago"
            + (f" ({_HELD.get(t['held'], t['held'])})" if t["held"] else "")
            + ("  <- check" if t["oldest_age_ms"] > UNCLAIMED_WARN_MS and not t["held"] else "")
            for t in waiting[:20]
        ]
    if st["recent_failures"]:
        out += ["", "recent failures:"]
        out += [
            f"  {e['at']} {e['type']} {e['job_id']} attempt {e['attempt']} {e['kind']}: "
            f"{e['error'][:120]}"
            for e in st["recent_failures"][:10]
        ]
    return out


def cmd_status(args: argparse.Namespace) -> int:
    st = gather(args.server, args.window)
    if args.json:
        print_json(st)
    else:
        print("\n".join(render(st)))
    healthy = all(n["answered"] and n["serving"] for n in st["nodes"])
    return Exit.OK if healthy and not st["shards_without_owner"] else Exit.ERROR
