"""``timeshard audit [FILE]``: the operator actions taken in the console, newest first: when,
who (the token's name) with their role, the action, its target or filter, and how many jobs it
changed.

Without FILE it asks the node at ``--server`` (``AdminService.ListAudit``, an admin token),
which reads them from the store: the whole cluster's, whichever node served each action. With
FILE it reads a node's own JSON Lines copy (``--audit-log FILE``, or ``audit.jsonl`` in
``timeshard dev``'s ``--data``), which needs no node running."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from timeshard.argtypes import whole
from timeshard.cli.common import add_json_option
from timeshard.cli.shards import Admin, _rpc
from timeshard.console import print_json, when
from timeshard.errors import NotFound
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.views.console.audit import MAX_READ, AuditEntry, read_file
from timeshard.wire import ts_ms


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "audit",
        help="operator actions taken in the console",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "file", nargs="?", default="", help="a node's audit file (JSON Lines); else ask --server"
    )
    p.add_argument("--who", default="", help="only this token name's actions")
    p.add_argument("--action", default="", help="only this action, e.g. bulk-cancel")
    p.add_argument("--limit", type=whole(1, MAX_READ), default=50, help="newest N (default 50)")
    add_json_option(p, "[{at_ms, who, role, action, target, count, node, detail}]")
    p.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    entries = _from_file(args) if args.file else _from_cluster(args)
    if args.json:
        print_json([_as_dict(e) for e in entries])
        return 0
    for e in entries:
        detail = " ".join(f"{k}={v}" for k, v in sorted(e.detail.items()))
        print(
            f"{when(e.at_ms)}  {e.who} ({e.role})  {e.action}  {e.target}  "
            f"count {e.count}" + (f"  {detail}" if detail else "")
        )
    if not entries:
        print("no actions recorded" + (" that match" if args.who or args.action else ""))
    return 0


def _from_file(args: argparse.Namespace) -> list[AuditEntry]:
    path = Path(args.file)
    if not path.is_file():
        raise NotFound("audit log", args.file)
    return [
        e
        for e in read_file(path)
        if (not args.who or e.who == args.who) and (not args.action or e.action == args.action)
    ][: args.limit]


def _from_cluster(args: argparse.Namespace) -> list[AuditEntry]:
    request = pb.ListAuditRequest(limit=args.limit, who=args.who, action=args.action)
    with Admin(args.server) as admin:
        reply = admin.first(lambda s: _rpc(s.ListAudit, request))
    return [
        AuditEntry(
            at_ms=ts_ms(e.at),
            who=e.who,
            role=e.role,
            action=e.action,
            target=e.target,
            count=e.count,
            node=e.node,
            detail=json.loads(e.detail_json or "{}"),
        )
        for e in reply.entries
    ]


def _as_dict(e: AuditEntry) -> dict[str, object]:
    return {
        "at_ms": e.at_ms,
        "who": e.who,
        "role": e.role,
        "action": e.action,
        "target": e.target,
        "count": e.count,
        "node": e.node,
        "detail": e.detail,
    }
