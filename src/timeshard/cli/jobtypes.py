"""``timeshard types ...``: see and set each job type's flow (its cluster-wide rate, whether
it is paused) and policy.

- ``show [TYPE]``: every type with a policy or a flow, as the cluster applies it, and its due
  jobs held on each node (asked of every node: ClusterInfo, then ListTypes on each).
- ``set TYPE --rate R [--burst B]``: at most R jobs of TYPE start per second across the
  cluster (``--rate 0``: no limit); ``set --file FILE``: every type of a types file (policies
  and flows).
- ``pause TYPE...`` / ``resume TYPE...``: hand out none of the type's jobs (they are still
  accepted and stored, and stay ready, in order), or again, at the type's rate.

The node called applies a change at once, the others within 5 s. Admin role.
"""

from __future__ import annotations

import argparse
from typing import Any

from timeshard.cli.common import add_json_option, number, whole
from timeshard.cli.shards import Admin, _rpc
from timeshard.cli.typesfile import FLOW_KEYS, load_types_file
from timeshard.console import print_json
from timeshard.errors import (
    InvalidArgument,
    PermissionDenied,
    TimeshardError,
    Unauthenticated,
    Unavailable,
)
from timeshard.limits import MAX_BURST, MAX_RATE
from timeshard.model import validate_job_type
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur_s, type_policy_to_pb

TYPE_SHAPE = (
    '{"type", "rate", "burst", "paused", "max_attempts", "retry_base_s", "retry_max_s", '
    '"concurrency", "ready", "held", "oldest_age_ms"}'
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "types",
        help="see and set job types' rate, pause and policy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tsub = parser.add_subparsers(dest="types_cmd", required=True, metavar="COMMAND")

    show = tsub.add_parser("show", help="each type's rate, pause, policy and held jobs")
    show.add_argument("type", nargs="?", default="", help="only this job type")
    add_json_option(show, f"[{TYPE_SHAPE}, ...]")
    show.set_defaults(func=cmd_show)

    put = tsub.add_parser("set", help="set a type's cluster-wide rate, or a whole types file")
    put.add_argument("type", nargs="?", default="", help="the job type (not with --file)")
    put.add_argument(
        "--rate",
        type=number(0, MAX_RATE, note="jobs per second; 0: no limit"),
        metavar="PER_SECOND",
        help="jobs started per second across the cluster (0: no limit)",
    )
    put.add_argument(
        "--burst",
        type=whole(1, MAX_BURST),
        default=0,
        metavar="JOBS",
        help="how many may start at once (default: half a second's worth, at least 1)",
    )
    put.add_argument(
        "--file",
        metavar="FILE",
        help="a types file: every type's policy and flow keys in it (see timeshard server --types)",
    )
    add_json_option(put, f"[{TYPE_SHAPE}, ...]")
    put.set_defaults(func=cmd_set)

    for name, paused, what in (
        ("pause", True, "hand out no job of these types (they stay ready, in order)"),
        ("resume", False, "hand out these types' jobs again, at their rate"),
    ):
        p = tsub.add_parser(name, help=what)
        p.add_argument("types", nargs="+", metavar="TYPE", help="job types")
        add_json_option(p, f"[{TYPE_SHAPE}, ...]")
        p.set_defaults(func=cmd_pause, paused=paused)


def _type_json(t: pb.TypeInfo) -> dict[str, Any]:
    policy = t.policy if t.HasField("policy") else None
    has_retry = policy is not None and policy.HasField("retry_base")
    return {
        "type": t.type,
        "rate": t.rate or None,
        "burst": t.burst or None,
        "paused": t.paused,
        "max_attempts": (policy.max_attempts or None) if policy else None,
        "retry_base_s": dur_s(policy.retry_base) if policy and has_retry else None,
        "retry_max_s": dur_s(policy.retry_max) if policy and has_retry else None,
        "concurrency": (policy.concurrency or None) if policy else None,
        "ready": t.ready,
        "held": t.held or None,
        "oldest_age_ms": t.oldest_age_ms,
    }


def gather(servers: str, job_type: str) -> list[dict[str, Any]]:
    """Every node's ListTypes, merged: the settings as the first node that answered has them,
    the ready jobs summed over the nodes, the longest wait, and each reason jobs are held."""
    with Admin(servers) as admin:
        info = admin.cluster()
        answers: list[pb.ListTypesResponse] = []
        for node in info.nodes:
            try:
                answers.append(
                    _rpc(admin.stub(node.address).ListTypes, pb.ListTypesRequest(type=job_type))
                )
            except (PermissionDenied, Unauthenticated, InvalidArgument):
                raise  # it answered: no to these credentials, or to the type
            except TimeshardError:
                continue  # a node down: the others tell
    if not answers:
        raise Unavailable("no node answered ListTypes")
    merged: dict[str, dict[str, Any]] = {}
    for answer in answers:
        for t in answer.types:
            row = _type_json(t)
            have = merged.setdefault(t.type, {**row, "ready": 0, "held": None, "oldest_age_ms": 0})
            have["ready"] += row["ready"]
            have["oldest_age_ms"] = max(have["oldest_age_ms"], row["oldest_age_ms"])
            if row["held"] and row["held"] != have["held"]:
                have["held"] = row["held"] if not have["held"] else "paused"
    return [merged[t] for t in sorted(merged)]


def _print(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no job type has a policy or a flow set")
        return
    print(
        f"{'TYPE':<28} {'RATE/S':>8} {'BURST':>6} {'PAUSED':<6} {'CONCURRENCY':>11} "
        f"{'ATTEMPTS':>8} {'READY':>6} {'HELD':<7} OLDEST"
    )
    for r in rows:
        rate = f"{r['rate']:g}" if r["rate"] else "-"
        oldest = f"{r['oldest_age_ms'] / 1000:.1f}s" if r["ready"] else "-"
        print(
            f"{r['type']:<28} {rate:>8} {r['burst'] or '-':>6} {'yes' if r['paused'] else 'no':<6} "
            f"{r['concurrency'] or '-':>11} {r['max_attempts'] or '-':>8} {r['ready']:>6} "
            f"{r['held'] or '-':<7} {oldest}"
        )


def cmd_show(args: argparse.Namespace) -> int:
    if args.type:
        validate_job_type(args.type)
    rows = gather(args.server, args.type)
    if args.json:
        print_json(rows)
    else:
        _print(rows)
    return 0


def _set_flows(args: argparse.Namespace, flows: list[pb.TypeFlow]) -> list[dict[str, Any]]:
    with Admin(args.server) as admin:
        resp = admin.first(lambda s: _rpc(s.SetTypeFlows, pb.SetTypeFlowsRequest(flows=flows)))
    return [_type_json(t) for t in resp.types]


def _show_set(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    if args.json:
        print_json(rows)
    else:
        _print(rows)
        print("(applied by the node called now, by the others within 5 s)")
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    if args.file:
        if args.type or args.rate is not None or args.burst:
            raise InvalidArgument("--file", "give a types file, or a TYPE with --rate, not both")
        return _show_set(args, _set_file(args, args.file))
    if not args.type:
        raise InvalidArgument("type", "name the job type (or give --file FILE)")
    validate_job_type(args.type)
    if args.rate is None:
        raise InvalidArgument("--rate", "give the rate (jobs per second; 0: no limit)")
    if args.burst and not args.rate:
        raise InvalidArgument("--burst", "a burst needs a rate above 0")
    flow = pb.TypeFlow(type=args.type, rate=args.rate, burst=args.burst)
    return _show_set(args, _set_flows(args, [flow]))


def _set_file(args: argparse.Namespace, path: str) -> list[dict[str, Any]]:
    types = load_types_file(path, "--file")
    policies = [type_policy_to_pb(t, p) for t, p in types.policies.items()]
    flows = []
    for job_type, flow in types.flows.items():
        msg = pb.TypeFlow(type=job_type, burst=flow.burst or 0)
        given = types.given[job_type] & set(FLOW_KEYS)
        if "rate" in given:
            msg.rate = flow.rate or 0.0
        if "paused" in given:
            msg.paused = flow.paused
        flows.append(msg)
    with Admin(args.server) as admin:
        if policies:
            req = pb.SetTypePoliciesRequest(policies=policies)
            admin.first(lambda s: _rpc(s.SetTypePolicies, req))
        if flows:
            admin.first(lambda s: _rpc(s.SetTypeFlows, pb.SetTypeFlowsRequest(flows=flows)))
    return [r for r in gather(args.server, "") if r["type"] in types.given]


def cmd_pause(args: argparse.Namespace) -> int:
    for t in args.types:
        validate_job_type(t)
    flows = [pb.TypeFlow(type=t, paused=args.paused) for t in dict.fromkeys(args.types)]
    return _show_set(args, _set_flows(args, flows))
