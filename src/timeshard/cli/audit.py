"""``timeshard audit FILE``: the operator actions taken in a node's console (``--audit-log``,
or ``audit.jsonl`` in ``timeshard dev``'s ``--data``), newest first: when, who (the token's
name) with their role, the action, its target or filter, and how many jobs it changed."""

from __future__ import annotations

import argparse
from pathlib import Path

from timeshard.argtypes import whole
from timeshard.cli.common import add_json_option
from timeshard.console import print_json, when
from timeshard.errors import NotFound
from timeshard.views.console.audit import AuditEntry, read_file


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("audit", help="operator actions taken in the console", description=__doc__)
    p.add_argument("file", help="the node's audit log (JSON Lines)")
    p.add_argument("--who", default="", help="only this token name's actions")
    p.add_argument("--action", default="", help="only this action, e.g. bulk-cancel")
    p.add_argument("--limit", type=whole(1, 100_000), default=50, help="newest N (default 50)")
    add_json_option(p, "[{at_ms, who, role, action, target, count, node, detail}]")
    p.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise NotFound("audit log", args.file)
    entries = [
        e
        for e in read_file(path)
        if (not args.who or e.who == args.who) and (not args.action or e.action == args.action)
    ][: args.limit]
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
