"""``timeshard schedules ...`` (cron) and ``timeshard dlq ...`` (dead letters)."""

from __future__ import annotations

import argparse
from typing import Any

from google.protobuf.duration_pb2 import Duration

from timeshard.cli import revisions
from timeshard.cli.common import MAX_INT32, add_json_option, parse_duration, parse_time, whole
from timeshard.cli.jobtext import job_json, job_line, job_lines
from timeshard.client.proto import ProtoClient as Client
from timeshard.clock import SystemClock, to_datetime
from timeshard.console import print_json, when, when_local
from timeshard.cron import CronSpec, preview
from timeshard.errors import InvalidArgument
from timeshard.model import MisfirePolicy, OverlapPolicy, parse_json_payload
from timeshard.node.scheduleops import ScheduleOps
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, dur_s, ts_ms


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sch = sub.add_parser("schedules", help="cron schedules")
    ssub = sch.add_subparsers(dest="schedules_cmd", required=True)

    c = ssub.add_parser("create", help="create a cron schedule; prints its id last")
    c.add_argument("type", help="job type of each occurrence")
    _spec_args(c, required=True)
    c.add_argument("--id", default="", help="schedule id (default: generated)")
    revisions.add_reason_option(c)
    add_json_option(c, "SCHEDULE")
    c.set_defaults(func=cmd_create)

    u = ssub.add_parser(
        "update",
        help="change the options given; the others keep their values",
        description="Reads the schedule, changes only the options given, and writes it back.",
    )
    u.add_argument("schedule_id", help="the schedule's id")
    u.add_argument("type", nargs="?", help="job type of each occurrence (default: keep)")
    _spec_args(u, required=False, keep=True)
    revisions.add_reason_option(u)
    add_json_option(u, "SCHEDULE, as updated")
    u.set_defaults(func=cmd_update)

    for name, fn, text, shape in (
        ("get", cmd_get, "show a schedule", "SCHEDULE"),
        ("pause", cmd_pause, "pause (keeps its place)", "SCHEDULE, as paused"),
        (
            "resume",
            cmd_resume,
            "resume (missed runs follow the misfire policy)",
            "SCHEDULE, as resumed",
        ),
        (
            "delete",
            cmd_delete,
            "delete (runs already created still run)",
            '{"deleted": SCHEDULE_ID, "revision": N}',
        ),
    ):
        p = ssub.add_parser(name, help=text)
        p.add_argument("schedule_id", help="the schedule's id")
        if name != "get":
            revisions.add_reason_option(p)
        add_json_option(p, shape)
        p.set_defaults(func=fn)
    revisions.register(ssub)

    ls = ssub.add_parser("list", help="list schedules")
    add_json_option(ls, "an array of SCHEDULE")
    ls.set_defaults(func=cmd_list)

    pv = ssub.add_parser("preview", help="the next fire times of an expression (no server)")
    pv.add_argument("expr", help="cron expression, e.g. '30 2 * * *'")
    pv.add_argument("--tz", required=True, help="IANA time zone, e.g. America/New_York")
    pv.add_argument("--from", dest="start", help="RFC 3339 time (default: now)")
    pv.add_argument("--count", type=whole(1, 1000), default=10, help="how many (1-1000)")
    pv.add_argument(
        "--dst-gap",
        choices=["shift", "skip"],
        help="a run in the skipped hour: shift to the end of the gap, or skip it "
        "(default: cronie's rule)",
    )
    pv.add_argument(
        "--dst-fold",
        choices=["first", "both"],
        help="a run in the repeated hour: the first occurrence, or both (default: cronie's rule)",
    )
    pv.add_argument(
        "--spread",
        default="0s",
        help="also show when each run starts with this spread (needs --id: the offset derives "
        "from the schedule id)",
    )
    pv.add_argument("--id", dest="schedule_id", default="", help="the schedule id (for --spread)")
    add_json_option(
        pv,
        "an array of RFC 3339 UTC times; with --spread, of "
        '{"nominal": UTC, "runs_at": UTC} (the occurrence id stays on the nominal time)',
    )
    pv.set_defaults(func=cmd_preview)

    dlq = sub.add_parser("dlq", help="the dead-letter queue")
    dsub = dlq.add_subparsers(dest="dlq_cmd", required=True)
    dl = dsub.add_parser("list", help="dead jobs")
    dl.add_argument("--type", default="", help="only dead jobs of this type")
    dl.add_argument("--since", help="RFC 3339: died at or after")
    add_json_option(dl, "an array of JOB")
    dl.set_defaults(func=cmd_dlq_list)
    ds = dsub.add_parser("show", help="a dead job: error, attempts, payload")
    ds.add_argument("job_id", help="the dead job's id")
    add_json_option(ds, "JOB")
    ds.set_defaults(func=cmd_dlq_show)
    for name, fn, text, shape in (
        (
            "replay",
            cmd_dlq_replay,
            "schedule dead jobs again (fresh attempts, same key)",
            '{"replayed": [JOB, ...]}',
        ),
        ("purge", cmd_dlq_purge, "delete dead jobs", '{"purged": [JOB_ID, ...]}'),
    ):
        p = dsub.add_parser(name, help=text)
        p.add_argument("job_ids", nargs="*", help="job ids (or --type for all of a type)")
        p.add_argument("--type", default="", help="every dead job of this type (up to 1,000)")
        add_json_option(p, shape)
        p.set_defaults(func=fn)


def _spec_args(p: argparse.ArgumentParser, *, required: bool, keep: bool = False) -> None:
    """``keep``: every default is None, so an update can tell what was given."""

    def default(value: object) -> object:
        return None if keep else value

    p.add_argument("--cron", required=required, help="e.g. '0 2 * * *' (optional seconds field)")
    p.add_argument("--tz", required=required, help="IANA time zone, e.g. Europe/Berlin")
    p.add_argument("--payload", default=default("{}"), help="JSON payload of each occurrence")
    p.add_argument(
        "--misfire",
        default=default("once"),
        choices=[m.value for m in MisfirePolicy],
        help="runs missed by more than --misfire-grace: skip them, run the latest once, or all "
        "(up to --max-catchup)",
    )
    p.add_argument(
        "--misfire-grace",
        default=default("60s"),
        help="how late a run may still start as usual (a duration, at least 1s)",
    )
    p.add_argument(
        "--max-catchup",
        type=whole(1, 1000),
        default=default(10),
        help="with --misfire all: at most this many catch-up runs",
    )
    p.add_argument(
        "--overlap",
        default=default("skip"),
        choices=[o.value for o in OverlapPolicy],
        help="the previous run still going when the next is due: skip the next (recorded), "
        "queue it (at most one waits), or allow it (up to --max-concurrent)",
    )
    p.add_argument(
        "--max-concurrent",
        type=whole(1, 1000),
        default=default(1),
        help="with --overlap allow: runs of this schedule at once",
    )
    p.add_argument(
        "--jitter",
        default=default("0s"),
        help="spread each run up to this long after its time, stable per schedule (a duration)",
    )
    p.add_argument(
        "--spread",
        default=default("0s"),
        help="run each occurrence a stable offset after its time, in [0, SPREAD): derived from "
        "the schedule id, the same every time, never early (a duration shorter than the time "
        "between two runs; 0s: none)",
    )
    p.add_argument(
        "--dst-gap",
        default=default(""),
        choices=["", "shift", "skip"],
        help="a run in the skipped hour: shift to the end of the gap, or skip it "
        "(empty: cronie's rule)",
    )
    p.add_argument(
        "--dst-fold",
        default=default(""),
        choices=["", "first", "both"],
        help="a run in the repeated hour: the first occurrence, or both (empty: cronie's rule)",
    )
    p.add_argument(
        "--max-attempts",
        type=whole(0, MAX_INT32, note="0: the type's default"),
        default=default(0),
        help="attempts of each run before it is dead (0: the type's default)",
    )


def _schedule_msg(args: argparse.Namespace, schedule_id: str) -> pb.Schedule:
    return pb.Schedule(
        schedule_id=schedule_id,
        cron=args.cron,
        timezone=args.tz,
        type=args.type,
        payload=parse_json_payload(args.payload),
        misfire=args.misfire,
        misfire_grace=dur(round(parse_duration(args.misfire_grace, "--misfire-grace") * 1000)),
        max_catchup=args.max_catchup,
        overlap=args.overlap,
        max_concurrent=args.max_concurrent,
        jitter=dur(round(parse_duration(args.jitter, "--jitter") * 1000)),
        dst_gap=args.dst_gap,
        dst_fold=args.dst_fold,
        max_attempts=args.max_attempts,
        spread=_spread(args.spread),
    )


def _spread(text: str) -> Duration:
    seconds = parse_duration(text, "--spread")
    if seconds < 0:
        raise InvalidArgument("--spread", "must not be negative")
    return dur(round(seconds * 1000))


def schedule_json(s: pb.Schedule) -> dict[str, Any]:
    """SCHEDULE in docs/cli.md: a schedule as every ``--json`` prints it."""

    def t(msg: Any, present: bool) -> str | None:
        return when(ts_ms(msg)) if present else None

    return {
        "schedule_id": s.schedule_id,
        "cron": s.cron,
        "timezone": s.timezone,
        "type": s.type,
        "payload": s.payload.decode("utf-8", "replace"),
        "paused": s.paused,
        "next_fire": t(s.next_fire, True),
        "misfire": s.misfire,
        "overlap": s.overlap,
        "max_concurrent": s.max_concurrent,
        "dst_gap": s.dst_gap or "default",
        "dst_fold": s.dst_fold or "default",
        "skipped": s.skipped,
        "last_fire_at": t(s.last_fire_at, s.HasField("last_fire_at")),
        "last_skip_at": t(s.last_skip_at, s.HasField("last_skip_at")),
        "active_jobs": list(s.active_jobs),
        "spread_s": dur_s(s.spread),
        "revision": s.revision,
    }


def _show(s: pb.Schedule, as_json: bool) -> None:
    if as_json:
        print_json(schedule_json(s))
        return
    state = "paused" if s.paused else f"next {when_local(ts_ms(s.next_fire))}"
    print(
        f"{s.schedule_id}  {s.cron!r} {s.timezone}  {s.type}  {state}  skipped {s.skipped}"
        f"  revision {s.revision}"
    )


def cmd_create(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        s = c.create_schedule(_schedule_msg(args, args.id), args.reason)
    if args.json:
        print_json(schedule_json(s))
    else:
        print(f"created schedule, next run {when_local(ts_ms(s.next_fire))}: {s.schedule_id}")
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    """UpdateSchedule replaces the whole schedule, so read it, change what was given, send it
    back. (Two updates of one schedule at once: the later write wins whole.)"""
    with Client(args.server) as c:
        current = c.get_schedule(args.schedule_id)
        _show(c.update_schedule(_changed(current, args), args.reason), args.json)
    return 0


def _changed(current: pb.Schedule, args: argparse.Namespace) -> pb.Schedule:
    msg = pb.Schedule()
    msg.CopyFrom(current)
    plain = {
        "cron": "cron",
        "tz": "timezone",
        "type": "type",
        "misfire": "misfire",
        "max_catchup": "max_catchup",
        "overlap": "overlap",
        "max_concurrent": "max_concurrent",
        "dst_gap": "dst_gap",
        "dst_fold": "dst_fold",
        "max_attempts": "max_attempts",
    }
    for dest, field in plain.items():
        if getattr(args, dest) is not None:
            setattr(msg, field, getattr(args, dest))
    if args.payload is not None:
        msg.payload = parse_json_payload(args.payload)
    if args.misfire_grace is not None:
        grace = parse_duration(args.misfire_grace, "--misfire-grace")
        msg.misfire_grace.CopyFrom(dur(round(grace * 1000)))
    if args.jitter is not None:
        msg.jitter.CopyFrom(dur(round(parse_duration(args.jitter, "--jitter") * 1000)))
    if args.spread is not None:
        msg.spread.CopyFrom(_spread(args.spread))
    return msg


def cmd_get(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        _show(c.get_schedule(args.schedule_id), args.json)
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        _show(c.pause_schedule(args.schedule_id, args.reason), args.json)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        _show(c.resume_schedule(args.schedule_id, args.reason), args.json)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        gone = c.delete_schedule(args.schedule_id, args.reason)
    if args.json:
        print_json({"deleted": args.schedule_id, "revision": gone.revision})
    else:
        print(f"deleted schedule {args.schedule_id} (revision {gone.revision}; history kept)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        found = list(c.list_schedules())
    if args.json:
        print_json([schedule_json(s) for s in found])
    else:
        for s in found:
            _show(s, False)
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    spec = CronSpec(
        expression=args.expr, timezone=args.tz, dst_gap=args.dst_gap, dst_fold=args.dst_fold
    )
    start = parse_time(args.start, "--from") if args.start else SystemClock().now_ms()
    spread_ms = round(dur_s(_spread(args.spread)) * 1000)
    if not spread_ms:
        entries = preview(spec, start, args.count)
        if args.json:
            print_json([e.utc for e in entries])
            return 0
        for e in entries:
            note = f"   ({e.note})" if e.note else ""
            print(f"{e.utc}   {e.local}{note}")
        return 0
    if not args.schedule_id:
        raise InvalidArgument("--id", "a spread's offset derives from the schedule id: give --id")
    spread = ScheduleOps.preview(
        spec, start, args.count, schedule_id=args.schedule_id, spread_ms=spread_ms
    )
    if args.json:
        print_json([{"nominal": t.fire.utc, "runs_at": when(t.runs_at)} for t in spread])
        return 0
    for t in spread:
        note = f"   ({t.fire.note})" if t.fire.note else ""
        print(f"{t.fire.utc}   runs {when(t.runs_at)}   {t.runs_at_local}{note}")
    return 0


def cmd_dlq_list(args: argparse.Namespace) -> int:
    since = to_datetime(parse_time(args.since, "--since")) if args.since else None
    with Client(args.server) as c:
        jobs = list(c.dead_letters(job_type=args.type, since=since))
    if args.json:
        print_json([job_json(j) for j in jobs])
    else:
        for j in jobs:
            print(f"{job_line(j)}  error: {j.last_error}")
    return 0


def cmd_dlq_show(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        job = c.get(args.job_id)
    if args.json:
        print_json(job_json(job))
    else:
        print("\n".join(job_lines(job)))
    return 0


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        jobs = c.replay(args.job_ids, args.type)
    if args.json:
        print_json({"replayed": [job_json(j) for j in jobs]})
        return 0
    for j in jobs:
        print(f"replayed {job_line(j)}")
    print(f"{len(jobs)} replayed")
    return 0


def cmd_dlq_purge(args: argparse.Namespace) -> int:
    with Client(args.server) as c:
        ids = list(c.purge(args.job_ids, args.type))
    if args.json:
        print_json({"purged": ids})
    else:
        print(f"{len(ids)} purged: {' '.join(ids)}")
    return 0
