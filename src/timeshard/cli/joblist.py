"""``timeshard jobs list`` and ``timeshard jobs cancel --type``: finding jobs by their filters
(ListJobs), and cancelling the jobs a listing finds, after a dry run that counts them.

A listing prints a table on stdout (a header, a line a job) and its summary on stderr: how many
jobs match, and a line saying so when ``--limit`` cut the list, or ``no jobs match``; so a pipe
gets the table alone (docs/cli.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

from timeshard.cli.common import parse_duration, parse_time, whole
from timeshard.cli.jobtext import job_json
from timeshard.client.proto import ProtoClient as Client
from timeshard.clock import SystemClock
from timeshard.console import Progress, print_json, when
from timeshard.errors import FailedPrecondition, InvalidArgument, NotFound
from timeshard.limits import MAX_PAGE_SIZE
from timeshard.model import JobState
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import state_from_pb, state_to_pb, ts, ts_ms

SORTS = {"due": pb.JOB_ORDER_DUE, "created": pb.JOB_ORDER_CREATED, "id": pb.JOB_ORDER_ID}
SORT_WORDS = {"due": "by due time", "created": "by creation time", "id": "by id"}
DEFAULT_LIMIT = 50
CANCELLABLE = (JobState.SCHEDULED.value, JobState.RUNNING.value)

TIME_HELP = "RFC 3339 (2026-12-01T09:00:00Z), now, or now+DURATION / now-DURATION (now-1h)"


def add_filter_options(p: argparse.ArgumentParser, *, states: Sequence[str], what: str) -> None:
    """The filters of a listing, each narrowing it further (a job must match all)."""
    p.add_argument(
        "--state",
        action="append",
        choices=list(states),
        metavar="STATE",
        help=f"only {what} in this state ({', '.join(states)}); give it again for several",
    )
    p.add_argument("--type", default="", help=f"only {what} of this type")
    p.add_argument(
        "--from", dest="due_from", metavar="TIME", help=f"only {what} due at or after: {TIME_HELP}"
    )
    p.add_argument("--to", dest="due_to", metavar="TIME", help=f"only {what} due before TIME")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("--key", default="", help="the job scheduled with exactly this key")
    keys.add_argument(
        "--key-prefix", default="", help=f"only {what} whose idempotency key starts with this"
    )
    p.add_argument(
        "--schedule",
        default="",
        metavar="SCHEDULE_ID",
        help="only the occurrences of this cron schedule",
    )


def add_list_options(p: argparse.ArgumentParser) -> None:
    add_filter_options(p, states=[s.value for s in JobState], what="jobs")
    p.add_argument(
        "--sort",
        choices=list(SORTS),
        default="due",
        help="due: by due time (run_at); created: by creation time; id: by job id",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--limit", type=whole(1), default=DEFAULT_LIMIT, help="list at most this many jobs"
    )
    size.add_argument("--all", action="store_true", help="list every job that matches")


def parse_when(text: str, flag: str, now_ms: int) -> int:
    """``--from``/``--to``: RFC 3339, ``now``, or ``now`` plus or minus a duration."""
    spoken = text.strip().lower()
    if spoken == "now":
        return now_ms
    if spoken.startswith(("now+", "now-")):
        seconds = parse_duration(spoken[4:], flag)
        return now_ms + round((seconds if spoken[3] == "+" else -seconds) * 1000)
    try:
        return parse_time(text, flag)
    except InvalidArgument as exc:
        raise InvalidArgument(flag, f"{exc.problem}; or now, now+1h, now-30m") from None


def list_request(args: argparse.Namespace, *, order: int) -> pb.ListJobsRequest:
    """The ListJobs request of the command's filters (checked here first where a flag can be
    named: a bad time, an empty range)."""
    req = pb.ListJobsRequest(
        states=[state_to_pb(JobState(s)) for s in args.state or []],
        type=args.type,
        idempotency_key=args.key,
        idempotency_key_prefix=args.key_prefix,
        schedule_id=args.schedule,
        order=order,  # type: ignore[arg-type]
    )
    now = SystemClock().now_ms()
    due_from = parse_when(args.due_from, "--from", now) if args.due_from else None
    due_to = parse_when(args.due_to, "--to", now) if args.due_to else None
    if due_from is not None and due_to is not None and due_to <= due_from:
        raise InvalidArgument(
            "--to", f"{when(due_to)} is not after --from {when(due_from)} (jobs due from <= to)"
        )
    if due_from is not None:
        req.run_at_from.CopyFrom(ts(due_from))
    if due_to is not None:
        req.run_at_to.CopyFrom(ts(due_to))
    return req


def pages(c: Client, req: pb.ListJobsRequest, page_size: int) -> Iterator[pb.ListJobsResponse]:
    """Every page of ``req``'s listing, in order."""
    req.page_size = page_size
    while True:
        resp = c.list_jobs_page(req)
        yield resp
        if not resp.next_page_token:
            return
        req.page_token = resp.next_page_token


def jobs_counted(n: int) -> str:
    return f"{n:,} job" if n == 1 else f"{n:,} jobs"


# -- jobs list -------------------------------------------------------------------------------


class Table:
    """Jobs as lines under a header, the columns as wide as the first jobs need (a later,
    wider value pushes its line on rather than being cut)."""

    HEADER = ("JOB_ID", "TYPE", "STATE", "ATTEMPT", "RUN_AT", "KEY")

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.widths: list[int] = []

    def add(self, jobs: Sequence[pb.Job]) -> None:
        rows = [self._row(j) for j in jobs]
        if not self.widths and rows:
            self.widths = [max(len(r[i]) for r in [self.HEADER, *rows]) for i in range(5)]
            self._line(self.HEADER)
        for row in rows:
            self._line(row)

    def _line(self, row: Sequence[str]) -> None:
        cells = [c.ljust(w) for c, w in zip(row, self.widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip(), file=self.out)

    @staticmethod
    def _row(job: pb.Job) -> tuple[str, ...]:
        state = state_from_pb(job.state)
        return (
            job.job_id,
            job.type,
            state.value if state else "unknown",
            f"{job.attempt}/{job.max_attempts}",
            when(ts_ms(job.run_at)),
            job.idempotency_key or "-",
        )


def cmd_list(args: argparse.Namespace) -> int:
    req = list_request(args, order=SORTS[args.sort])
    limit = None if args.all else args.limit
    shown: list[pb.Job] = []
    table = None if args.json else Table(sys.stdout)
    total, more = 0, False
    with Client(args.server) as c:
        for page in pages(c, req, MAX_PAGE_SIZE if limit is None else min(limit, MAX_PAGE_SIZE)):
            total = page.total
            take = list(page.jobs)[: None if limit is None else limit - len(shown)]
            shown += take
            if table is not None:
                table.add(take)
            if limit is not None and len(shown) >= limit:
                more = len(take) < len(page.jobs) or bool(page.next_page_token)
                break
    if args.json:
        print_json([job_json(j) for j in shown])
    print(_summary(len(shown), max(total, len(shown)), more, args.sort), file=sys.stderr)
    return 0


def _summary(shown: int, total: int, more: bool, sort: str) -> str:
    if not shown:
        return "no jobs match"
    if not more:
        return f"{jobs_counted(shown)} ({SORT_WORDS[sort]})"
    return (
        f"{shown:,} of {jobs_counted(total)} shown ({SORT_WORDS[sort]}); more match: "
        "--limit N or --all lists more"
    )


# -- jobs cancel --type ----------------------------------------------------------------------


def filters_given(args: argparse.Namespace) -> bool:
    return any(
        (args.state, args.type, args.due_from, args.due_to, args.key, args.key_prefix)
    ) or bool(args.schedule)


def cmd_cancel_matching(args: argparse.Namespace) -> int:
    """Count the jobs the filters find (a dry run: nothing cancelled) and, with ``--yes``,
    cancel them, a page at a time. A job that finished meanwhile is counted, not an error."""
    if not args.type:
        raise InvalidArgument(
            "--type",
            "name the type of the jobs to cancel (a bulk cancel never spans every type), "
            "or give one job's id",
        )
    args.state = args.state or list(CANCELLABLE)
    req = list_request(args, order=pb.JOB_ORDER_DUE)
    what = describe(req)
    with Client(args.server) as c:
        probe = pb.ListJobsRequest()
        probe.CopyFrom(req)
        probe.page_size = 1
        matched = c.list_jobs_page(probe).total
        if not matched:
            return _report(args, 0, [], [], dry_run=not args.yes, what=what)
        if not args.yes:
            return _report(args, matched, [], [], dry_run=True, what=what)
        cancelled, finished = _cancel_all(c, req, matched, args.progress)
    return _report(args, matched, cancelled, finished, dry_run=False, what=what)


def describe(req: pb.ListJobsRequest) -> str:
    """The filters of a listing, for people: ``type mail, state scheduled or running, ...``."""
    states = [s.value for s in map(state_from_pb, req.states) if s is not None]
    parts = [
        f"type {req.type}" if req.type else "",
        f"state {' or '.join(states)}" if states else "",
        f"due from {when(ts_ms(req.run_at_from))}" if req.HasField("run_at_from") else "",
        f"due before {when(ts_ms(req.run_at_to))}" if req.HasField("run_at_to") else "",
        f"key {req.idempotency_key}" if req.idempotency_key else "",
        f"key starting {req.idempotency_key_prefix}" if req.idempotency_key_prefix else "",
        f"schedule {req.schedule_id}" if req.schedule_id else "",
    ]
    return ", ".join(p for p in parts if p)


def _cancel_all(
    c: Client, req: pb.ListJobsRequest, matched: int, progress: bool | None
) -> tuple[list[str], list[str]]:
    """Cancel every job the listing finds; the ids cancelled, and those that were finished
    (or gone) by the time their cancel came. Any other error stops here and is raised, after
    saying on stderr how many were cancelled before it."""
    cancelled: list[str] = []
    finished: list[str] = []
    shown = Progress(matched, sys.stderr, shown=progress, verb="cancelled")
    try:
        for page in pages(c, req, MAX_PAGE_SIZE):
            for job in page.jobs:
                try:
                    c.cancel(job.job_id)
                    cancelled.append(job.job_id)
                except (FailedPrecondition, NotFound):
                    finished.append(job.job_id)
                shown(len(cancelled))
    except BaseException:
        shown.end()
        print(f"cancelled {jobs_counted(len(cancelled))} before this error", file=sys.stderr)
        raise
    shown.end()
    return cancelled, finished


def _report(
    args: argparse.Namespace,
    matched: int,
    cancelled: list[str],
    finished: list[str],
    *,
    dry_run: bool,
    what: str,
) -> int:
    if args.json:
        print_json(
            {
                "matched": matched,
                "dry_run": dry_run,
                "cancelled": cancelled,
                "finished_meanwhile": finished,
            }
        )
    if not matched:
        print(f"no jobs match: {what}", file=sys.stderr)
    elif dry_run:
        if not args.json:
            print(f"{jobs_counted(matched)} would be cancelled: {what}")
        print(
            "nothing was cancelled (a dry run): run the same command with --yes to cancel them",
            file=sys.stderr,
        )
    elif not args.json:
        late = f"; {len(finished):,} had finished meanwhile" if finished else ""
        print(f"cancelled {jobs_counted(len(cancelled))} of {matched:,} matching: {what}{late}")
    return 0
