"""``timeshard why SCHEDULE TIME`` and ``timeshard why JOB``: why an occurrence ran or did not,
from the occurrence ledger (the ``ExplainOccurrence`` call)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from timeshard.cli.common import add_json_option
from timeshard.cli.jobtext import job_json
from timeshard.client.proto import ProtoClient as Client
from timeshard.clock import to_datetime
from timeshard.console import Exit, print_json, when
from timeshard.errors import InvalidArgument
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import ts_ms

RECENT_MAX = 200


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser(
        "why",
        help="why an occurrence of a schedule ran or did not (the occurrence ledger)",
        description=(
            "timeshard why SCHEDULE TIME: the decisions about the occurrence of SCHEDULE at "
            "TIME, in words: its nominal time, zone and DST rule, what was decided (created, "
            "caught up, skipped and why), by which node, its job, attempts and outcome. "
            "timeshard why JOB: the same for the occurrence a job is (or the job alone). A "
            "TIME that is no occurrence is said so, with the nearest ones (exit 3)."
        ),
    )
    w.add_argument("target", help="a schedule id (with TIME), or a job id (alone)")
    w.add_argument(
        "time",
        nargs="?",
        help="the occurrence: RFC 3339 (2026-12-14T01:00:00Z), or a local time without an "
        "offset (2026-12-14T02:00), read in the schedule's time zone; a local time that a DST "
        "gap skipped or a fold repeated is answered with the schedule's rule",
    )
    w.add_argument(
        "--recent",
        type=_recent,
        default=0,
        metavar="N",
        help=f"also list the schedule's latest N ledger entries (1-{RECENT_MAX})",
    )
    add_json_option(w, "WHY")
    w.set_defaults(func=cmd_why)


def _recent(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= RECENT_MAX:
        raise argparse.ArgumentTypeError(f"must be 0-{RECENT_MAX}, got {text!r}")
    return int(text)


def _at(text: str) -> tuple[datetime | None, datetime | None]:
    """TIME as (an aware instant, None) with an offset, or (None, a naive local time) without
    one: the server reads that in the schedule's time zone, DST gaps and folds included."""
    raw = text.strip().replace("Z", "+00:00").replace("z", "+00:00")
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidArgument(
            "TIME", f"{text!r} is not a time (e.g. 2026-12-14T01:00:00Z or 2026-12-14T02:00)"
        ) from None
    return (at, None) if at.tzinfo is not None else (None, at)


def cmd_why(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        if args.time is None:
            reply = c.explain(job_id=args.target, recent=args.recent)
        else:
            at, local = _at(args.time)
            reply = c.explain(args.target, at, local=local, recent=args.recent)
    if args.json:
        print_json(why_json(reply))
    else:
        for line in why_lines(reply):
            print(line)
    return Exit.OK if reply.found or not reply.schedule_id else Exit.NOT_FOUND


def _t(msg: Any, field: str) -> str | None:
    return when(ts_ms(getattr(msg, field))) if msg.HasField(field) else None


def entry_json(e: pb.LedgerEntry) -> dict[str, Any]:
    """LEDGER_ENTRY in docs/cli.md."""
    return {
        "schedule_id": e.schedule_id,
        "nominal": _t(e, "nominal"),
        "last": _t(e, "last"),
        "count": e.count,
        "reason": e.reason,
        "job_id": e.job_id or None,
        "run_at": _t(e, "run_at"),
        "revision": e.revision,
        "node": e.node,
        "epoch": e.epoch,
        "decided_at": _t(e, "decided_at"),
        "notes": list(e.notes),
    }


def why_json(r: pb.ExplainOccurrenceResponse) -> dict[str, Any]:
    """WHY in docs/cli.md."""
    return {
        "schedule_id": r.schedule_id or None,
        "nominal": _t(r, "nominal"),
        "nominal_local": r.nominal_local or None,
        "timezone": r.timezone or None,
        "found": r.found,
        "entry": entry_json(r.entry) if r.HasField("entry") else None,
        "job": job_json(r.job) if r.HasField("job") else None,
        "steps": list(r.steps),
        "nearest": [when(ts_ms(t)) for t in r.nearest],
        "recent": [entry_json(e) for e in r.recent],
    }


def why_lines(r: pb.ExplainOccurrenceResponse) -> list[str]:
    lines = [f"{i}. {step}" for i, step in enumerate(r.steps, 1)]
    if r.recent:
        lines += ["", f"latest {len(r.recent)} ledger entries of {r.schedule_id}:"]
        lines += [entry_line(e) for e in r.recent]
    return lines


def entry_line(e: pb.LedgerEntry) -> str:
    nominal = when(ts_ms(e.nominal))
    span = ""
    if e.count > 1:  # (a DST gap's skipped times are recorded at one instant: no span)
        last = ts_ms(e.last)
        span = f"{f' .. {when(last)}' if last != ts_ms(e.nominal) else ''} ({e.count})"
    job = f" {e.job_id}" if e.job_id else ""
    decided = to_datetime(ts_ms(e.decided_at)).strftime("%H:%M:%S")
    return f"  {nominal}{span}  {e.reason}{job}  (by {e.node} at {decided})"
