"""``timeshard schedules history|diff|rollback``: a schedule's revisions, what changed between
two, and a new revision that restores an old one's definition."""

from __future__ import annotations

import argparse
from typing import Any

from timeshard.cli.common import add_json_option, whole
from timeshard.client.proto import ProtoClient as Client
from timeshard.console import print_json, when
from timeshard.errors import NotFound
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur_s, ts_ms

MAX_REVISION = 2**63 - 1


def revision_number(text: str) -> int:
    """A revision on the command line: 1 or more (argparse names the argument when not)."""
    value = whole(1)(text)
    if value > MAX_REVISION:
        raise argparse.ArgumentTypeError(f"{value} is past the last revision there can be")
    return value


def add_reason_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reason",
        default="",
        help="why (kept with the revision this change makes; `schedules history` shows it)",
    )


def register(ssub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    h = ssub.add_parser(
        "history",
        help="a schedule's revisions, newest first: who changed it, when, how and why",
    )
    h.add_argument("schedule_id", help="the schedule's id (also a deleted one)")
    add_json_option(h, "an array of REVISION")
    h.set_defaults(func=cmd_history)

    d = ssub.add_parser("diff", help="what changed between two revisions of a schedule")
    d.add_argument("schedule_id", help="the schedule's id")
    d.add_argument("a", type=revision_number, help="a revision (the older, usually)")
    d.add_argument("b", type=revision_number, help="another revision")
    add_json_option(d, '{"schedule_id", "from", "to", "changes": {FIELD: {"from", "to"}}}')
    d.set_defaults(func=cmd_diff)

    r = ssub.add_parser(
        "rollback",
        help="make a new revision with revision N's definition; prints the revision made",
        description="Makes a new revision whose cron, time zone, DST rules, job template and "
        "policies are revision N's. The schedule stays paused or running as it is, and keeps "
        "its place as an update does. A deleted schedule is refused (exit 5), nothing "
        "changed: create it again.",
    )
    r.add_argument("schedule_id", help="the schedule's id")
    r.add_argument("revision", type=revision_number, help="the revision to restore")
    add_reason_option(r)
    add_json_option(
        r, '{"schedule_id", "revision" (the one made), "rolled_back_to", DEFINITION, "next_fire"}'
    )
    r.set_defaults(func=cmd_rollback)


def definition(s: pb.Schedule) -> dict[str, Any]:
    """What a person defines about a schedule (what a diff compares), as JSON shows it."""
    return {
        "cron": s.cron,
        "timezone": s.timezone,
        "dst_gap": s.dst_gap or "default",
        "dst_fold": s.dst_fold or "default",
        "type": s.type,
        "payload": s.payload.decode("utf-8", "replace"),
        "max_attempts": s.max_attempts,
        "misfire": s.misfire,
        "misfire_grace_s": dur_s(s.misfire_grace),
        "max_catchup": s.max_catchup,
        "overlap": s.overlap,
        "max_concurrent": s.max_concurrent,
        "jitter_s": dur_s(s.jitter),
        "spread_s": dur_s(s.spread),
        "paused": s.paused,
    }


def revision_json(r: pb.ScheduleRevision) -> dict[str, Any]:
    """REVISION in docs/cli.md."""
    return {
        "schedule_id": r.schedule_id,
        "revision": r.revision,
        "change": r.change,
        "actor": r.actor,
        "at": when(ts_ms(r.at)),
        "reason": r.reason,
        "rolled_back_to": r.rolled_back_to or None,
        "schedule": {**definition(r.schedule), "next_fire": when(ts_ms(r.schedule.next_fire))},
    }


def _what(r: pb.ScheduleRevision) -> str:
    if r.change == "rollback":
        return f"rollback to {r.rolled_back_to}"
    return r.change


def cmd_history(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        found = list(c.schedule_history(args.schedule_id))
    if args.json:
        print_json([revision_json(r) for r in found])
        return 0
    if not found:
        print(f"schedule {args.schedule_id} has no revisions (created before they were kept)")
        return 0
    rows = [("REV", "CHANGE", "AT (UTC)", "ACTOR", "CRON", "REASON")]
    for r in found:
        s = r.schedule
        spec = f"{s.cron!r} {s.timezone}" + (" paused" if s.paused else "")
        rows.append((str(r.revision), _what(r), when(ts_ms(r.at)), r.actor, spec, r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[5])
    return 0


def changes(a: pb.Schedule, b: pb.Schedule) -> dict[str, dict[str, Any]]:
    """The fields of ``definition`` that differ, each with its value in ``a`` and in ``b``."""
    old, new = definition(a), definition(b)
    return {k: {"from": old[k], "to": new[k]} for k in old if old[k] != new[k]}


def cmd_diff(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        a = c.schedule_revision(args.schedule_id, args.a)
        b = c.schedule_revision(args.schedule_id, args.b)
    diff = changes(a.schedule, b.schedule)
    if args.json:
        print_json({"schedule_id": args.schedule_id, "from": args.a, "to": args.b, "changes": diff})
        return 0
    print(
        f"schedule {args.schedule_id}: revision {args.a} ({_what(a)} by {a.actor}) -> "
        f"revision {args.b} ({_what(b)} by {b.actor})"
    )
    if not diff:
        print("  no differences in cron, time zone, DST rules, template, policies or pause")
    for field, values in diff.items():
        print(f"  {field}: {values['from']!r} -> {values['to']!r}")
    return 0


def _current_revision(c: Client, schedule_id: str) -> int:
    """The schedule's revision before a rollback (0 if it is gone: the rollback then says why
    it is refused)."""
    try:
        return c.get_schedule(schedule_id).revision
    except NotFound:
        return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        before = _current_revision(c, args.schedule_id)
        s = c.rollback_schedule(args.schedule_id, args.revision, args.reason)
    if args.json:
        print_json(
            {
                "schedule_id": s.schedule_id,
                "revision": s.revision,
                "rolled_back_to": args.revision,
                **definition(s),
                "next_fire": when(ts_ms(s.next_fire)),
            }
        )
        return 0
    state = f"(cron {s.cron!r} {s.timezone}" + (", paused)" if s.paused else ")")
    if s.revision == before:  # the definition was revision N's already: nothing written
        print(
            f"schedule {s.schedule_id} has revision {args.revision}'s definition already: "
            f"no revision made, revision {s.revision} is current {state}"
        )
        return 0
    print(
        f"rolled schedule {s.schedule_id} back to revision {args.revision}'s definition: "
        f"made revision {s.revision} {state}"
    )
    return 0
