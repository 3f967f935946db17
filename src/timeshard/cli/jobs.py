"""``timeshard jobs ...``: schedule, load, get, list, cancel, reschedule over the JobService."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from timeshard.cli.common import MAX_INT32, add_json_option, parse_duration, parse_time, whole
from timeshard.cli.joblist import (
    CANCELLABLE,
    DEFAULT_LIMIT,
    add_filter_options,
    add_list_options,
    cmd_cancel_matching,
    cmd_list,
    filters_given,
)
from timeshard.cli.jobtext import job_json, job_line, job_lines
from timeshard.cli.load import (
    DEFAULT_KEY_PREFIX,
    add_if_exists_option,
    cmd_load,
    key_prefix,
    not_scheduled_why,
    print_warnings,
)
from timeshard.client.proto import ProtoClient as Client
from timeshard.client.proto import Scheduled
from timeshard.clock import to_datetime
from timeshard.console import Exit, add_progress_option, print_json, when, when_local
from timeshard.errors import FailedPrecondition, InvalidArgument, TimeshardError
from timeshard.limits import MAX_BATCH, MAX_PRIORITY
from timeshard.model import RESULT_BYTES, RESULT_JSON, JobState, parse_json_payload
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import state_from_pb, ts_ms


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = sub.add_parser("jobs", help="schedule and inspect jobs")
    jsub = jobs.add_subparsers(dest="jobs_cmd", required=True)

    s = jsub.add_parser("schedule", help="schedule a delayed job; prints its id last")
    s.add_argument("type", help="job type, e.g. demo.echo")
    when = s.add_mutually_exclusive_group(required=True)
    when.add_argument("--in", dest="delay", help="delay, e.g. 2s, 500ms, 5m, 1h30m")
    when.add_argument("--at", help="absolute time, RFC 3339, e.g. 2026-12-01T09:00:00Z")
    s.add_argument("--payload", default="{}", help="JSON payload")
    s.add_argument("--key", default="", help="idempotency key: a repeat returns the same job")
    add_if_exists_option(s)
    s.add_argument(
        "--max-attempts",
        type=whole(0, MAX_INT32, note="0: the type's default"),
        default=0,
        help="attempts before the job is dead (0: the type's default)",
    )
    deadline = s.add_mutually_exclusive_group()
    deadline.add_argument(
        "--deadline",
        help="RFC 3339: no attempt starts after it; not started by then, the job ends expired",
    )
    deadline.add_argument(
        "--deadline-in",
        help="as --deadline, a duration after the job is due (its --in/--at), e.g. 10m",
    )
    s.add_argument(
        "--priority",
        type=whole(0, MAX_PRIORITY),
        default=0,
        help=f"0 (default, lowest) to {MAX_PRIORITY}: higher goes first among due jobs of "
        "its type; a waiting job ages, so it is never starved",
    )
    add_json_option(s, '{"created": true|false, "job": JOB}')
    s.set_defaults(func=cmd_schedule)

    ld = jsub.add_parser(
        "load",
        help="schedule the jobs of a JSON Lines file (- for stdin), in batches; prints what it did",
        description=LOAD_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ld.add_argument("file", help="a JSON Lines file, one job per line; - for stdin")
    ld.add_argument(
        "--batch", type=whole(1, 1000), default=500, help="jobs per ScheduleJobs call (1-1000)"
    )
    keys = ld.add_mutually_exclusive_group()
    keys.add_argument(
        "--key-prefix",
        type=key_prefix,
        default=DEFAULT_KEY_PREFIX,
        help="starts the key derived for a line without one; a new prefix loads the same file "
        "again as new jobs",
    )
    keys.add_argument(
        "--no-derived-keys",
        action="store_true",
        help="a line without a key gets none: every run schedules it again",
    )
    add_if_exists_option(ld)
    add_progress_option(ld)
    add_json_option(ld, "the summary, each line's job and the lines not scheduled")
    ld.set_defaults(func=cmd_load)

    g = jsub.add_parser("get", help="show one job")
    g.add_argument("job_id", help="the job's id")
    add_json_option(g, "JOB")
    g.add_argument(
        "--result",
        action="store_true",
        help="print only what its handler returned: JSON text, or the bytes as they are "
        f"(exit {Exit.JOB_FAILED.value} if the job has not succeeded)",
    )
    g.set_defaults(func=cmd_get)

    w = jsub.add_parser(
        "wait",
        help="wait until jobs are finished; prints each as it finishes",
        description=WAIT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("job_ids", nargs="+", metavar="ID", help="the jobs' ids")
    w.add_argument(
        "--timeout",
        default=None,
        metavar="DURATION",
        help="give up after this long (e.g. 30, 90s, 5m; default: wait as long as it takes)",
    )
    add_json_option(w, "an array of JOB, the jobs finished, in the order they finished")
    w.set_defaults(func=cmd_wait)

    ls = jsub.add_parser(
        "list",
        help="find jobs by type, state, due time, key or schedule; by due time",
        description=LIST_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_list_options(ls)
    add_json_option(ls, "an array of JOB")
    ls.set_defaults(func=cmd_list)

    c = jsub.add_parser(
        "cancel",
        help="cancel a scheduled or running job, or every job --type and filters find",
        description=CANCEL_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("job_id", nargs="?", help="the job's id (or no id, and --type with filters)")
    add_filter_options(c, states=CANCELLABLE, what="jobs")
    c.add_argument(
        "--yes", action="store_true", help="with --type: cancel the jobs (without: count them)"
    )
    add_progress_option(c)
    add_json_option(
        c,
        'JOB, as cancelled; with --type: {"matched", "dry_run", "cancelled": [JOB_ID, ...], '
        '"finished_meanwhile": [JOB_ID, ...]}',
    )
    c.set_defaults(func=cmd_cancel)

    r = jsub.add_parser("reschedule", help="move a scheduled job to another time")
    r.add_argument("job_id", help="the job's id")
    rw = r.add_mutually_exclusive_group(required=True)
    rw.add_argument("--in", dest="delay", help="delay from now, e.g. 2s, 500ms, 5m, 1h30m")
    rw.add_argument("--at", help="absolute time, RFC 3339, e.g. 2026-12-01T09:00:00Z")
    add_json_option(r, "JOB, as rescheduled")
    r.set_defaults(func=cmd_reschedule)


LIST_DESCRIPTION = f"""\
Finds jobs by any mix of filters (a job must match all of them) and lists them in
order: by due time (run_at) unless --sort says otherwise, {DEFAULT_LIMIT} at most unless
--limit or --all says otherwise.

  timeshard jobs list --type mail --state dead
  timeshard jobs list --from now --to now+1h          due within the next hour
  timeshard jobs list --key order-1234                the job scheduled with that key
  timeshard jobs list --key-prefix batch-7:          what jobs load --key-prefix batch-7 made
  timeshard jobs list --schedule nightly --all        every run of a cron schedule

Prints a header and a line per job on stdout, then on stderr how many match,
and a line when the limit cut the list ("no jobs match" when none do). --json
prints the array of jobs alone on stdout.
"""

CANCEL_DESCRIPTION = f"""\
  timeshard jobs cancel JOB_ID        cancel one job (scheduled or running)
  timeshard jobs cancel --type T [--state S] [--from/--to TIME] [--key K |
                        --key-prefix P] [--schedule ID] [--yes]

With --type, every job of that type the filters find (scheduled or running,
unless --state narrows it) is counted first: without --yes that is all it does
(a dry run, nothing cancelled), and it says how to go on. With --yes the jobs
found are cancelled one by one; one that finished meanwhile is counted, not an
error. Exit status: {Exit.OK.value} for a dry run, none found, or every one cancelled; an error
stops the cancelling, says how many were cancelled before it, and exits by its
class (docs/cli.md).
"""

WAIT_DESCRIPTION = f"""\
Waits on the server (WaitJobs) until each job is finished (succeeded, dead,
cancelled or expired), and prints a line for each as it finishes: id, type, state, attempt.
Exit status (docs/cli.md):
  {Exit.OK.value}  every job succeeded
  {Exit.NOT_FOUND.value}  a job id is not known (nothing is waited for)
  {Exit.UNAVAILABLE.value}  --timeout passed first (the jobs not finished are named on stderr), or
     no server answered
  {Exit.JOB_FAILED.value}  every job finished, and some ended dead, cancelled or expired (named on
     stderr)
At most {MAX_BATCH} ids per call of the server; more are waited for in turn.
"""

LOAD_DESCRIPTION = """\
One job per line, e.g.
  {"type": "demo.echo", "payload": {"n": 1}, "in": "30s", "key": "n-1", "max_attempts": 3}

Fields: type (required), payload (any JSON, default {}), exactly one of "in" (a
delay: 2s, 500ms, 1h30m; "0s" runs now) or "at" (RFC 3339), key, max_attempts
(1-1000; 0 or left out: the type's default). A field set to null is as if left
out. Any other field (also the API's names "delay" and "run_at") and a value of
the wrong type ("3" for a number, 5 for a key) are refused, never converted.

The whole file is checked first, with the server's limits and time rules; if any
line is refused, every refused line is named by its line number and nothing is
scheduled. Blank lines are skipped and keep the numbering.

Re-running is safe: a line without a key gets load:<sha256 of its fields>:<n>
(n counts earlier identical lines, so identical lines stay separate jobs), and
a key that names an existing job returns that job. Loading the same file again
after a partial failure therefore schedules only what is missing. To load it
again as new jobs give another --key-prefix (e.g. the date); --no-derived-keys
gives such lines no key at all (faster: a keyed create looks its key up first).

Prints "N lines: C created, E already existed, X not scheduled". A key naming a
cancelled or dead job is not scheduled: its line is named on stderr and the
exit status is 5 (failed precondition). If the server refuses a batch, the error
names its file lines and what was scheduled before it, and the exit status is
that refusal's (docs/cli.md). Progress goes to stderr when it is a terminal
(--progress: also into a file or pipe, as plain lines).
"""


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server)


def _when(args: argparse.Namespace) -> dict[str, Any]:
    if args.at:
        return {"at": to_datetime(parse_time(args.at))}
    return {"delay": parse_duration(args.delay)}


def _deadline(args: argparse.Namespace) -> dict[str, Any]:
    if args.deadline:
        return {"deadline": to_datetime(parse_time(args.deadline, "--deadline"))}
    if args.deadline_in:
        return {"deadline_in": parse_duration(args.deadline_in, "--deadline-in")}
    return {}


def cmd_schedule(args: argparse.Namespace) -> int:
    payload = parse_json_payload(args.payload)
    if args.max_attempts < 0:
        raise InvalidArgument("--max-attempts", "must be positive")
    with _client(args) as c:
        done = c.schedule(
            args.type,
            payload,
            key=args.key,
            max_attempts=args.max_attempts,
            priority=args.priority,
            if_exists=args.if_exists,
            **_when(args),
            **_deadline(args),
        )
    warnings = print_warnings([done])
    line = _scheduled_line(done, args.key)
    if args.json:
        print_json({"created": done.created, "job": job_json(done.job), "warnings": warnings})
    else:
        print(line)
    return 0


def _scheduled_line(done: Scheduled, key: str) -> str:
    """What one schedule call did, its job id last. A key that names a job which will not run
    (cancelled, dead) is an error: nothing was scheduled."""
    job = done.job
    d = job_json(job)
    run_at = when_local(ts_ms(job.run_at))
    if done.created:
        return f"scheduled {job.type} at {run_at}: {job.job_id}"
    why = not_scheduled_why(done, key)
    if why is not None:
        raise FailedPrecondition(why)
    repeat = f"key {key!r} names {job.type} at {run_at}, which is {d['state']}"
    if state_from_pb(job.state) is JobState.SUCCEEDED:
        return f"already ran: {repeat}: {job.job_id}"
    return f"already scheduled: {repeat}: {job.job_id}"


def cmd_get(args: argparse.Namespace) -> int:
    with _client(args) as c:
        job = c.get(args.job_id)
    if args.result:
        return _print_result(job)
    if args.json:
        print_json(job_json(job))
    else:
        print("\n".join(job_lines(job)))
    return 0


def _print_result(job: pb.Job) -> int:
    """The result alone on stdout: JSON text with a newline, bytes exactly as returned."""
    state = state_from_pb(job.state)
    if state is not JobState.SUCCEEDED:
        why = f"; last error: {job.last_error}" if job.last_error else ""
        print(f"error: job {job.job_id} is {state}: it has no result{why}", file=sys.stderr)
        return Exit.JOB_FAILED
    if job.result_encoding == RESULT_BYTES:
        sys.stdout.buffer.write(job.result)
        sys.stdout.flush()
    elif job.result_encoding == RESULT_JSON:
        print(job.result.decode("utf-8"))
    return Exit.OK


def cmd_wait(args: argparse.Namespace) -> int:
    """Each job as it finishes: a line (or, with --json, all of them at the end). An unknown
    id, a timeout or no server is an error of its class; a job that ended dead, cancelled or expired
    is ``Exit.JOB_FAILED``, named on stderr."""
    timeout = None if args.timeout is None else parse_duration(args.timeout, "--timeout")
    if timeout is not None and timeout < 0:
        raise InvalidArgument("--timeout", "must not be negative")
    finished: list[pb.Job] = []
    try:
        with _client(args) as c:
            for job in c.finished(args.job_ids, timeout=timeout):
                finished.append(job)
                if not args.json:
                    print(job_line(job), flush=True)
    except TimeshardError:
        if args.json:
            print_json([job_json(j) for j in finished])
        raise
    if args.json:
        print_json([job_json(j) for j in finished])
    failed = [j for j in finished if state_from_pb(j.state) is not JobState.SUCCEEDED]
    for job in failed:
        why = f": {job.last_error}" if job.last_error else ""
        print(
            f"job {job.job_id} ({job.type}) ended {state_from_pb(job.state)}{why}", file=sys.stderr
        )
    return Exit.JOB_FAILED if failed else Exit.OK


def cmd_cancel(args: argparse.Namespace) -> int:
    if args.job_id and filters_given(args):
        raise InvalidArgument("job_id", "give one job's id, or --type and filters, not both")
    if not args.job_id:
        return cmd_cancel_matching(args)
    with _client(args) as c:
        job = c.cancel(args.job_id)
    _print_job(job, args.json)
    last = job.history[-1] if job.history else None
    if not args.json and last is not None and last.outcome == "cancelled":  # it was running
        if job.start_noticed:
            print(
                f"its handler had started on {last.worker}: it is told to stop at its next "
                "heartbeat, and its result is refused",
                file=sys.stderr,
            )
        elif job.HasField("lease_until") and ts_ms(job.lease_until) > ts_ms(job.finished_at):
            print(
                f"cancelled before its handler started on {last.worker} (a worker stalled with "
                f"it could still start it before {when(ts_ms(job.lease_until))}; its first "
                "heartbeat would stop it)",
                file=sys.stderr,
            )
        else:
            print(f"cancelled: its handler never started on {last.worker}", file=sys.stderr)
    return 0


def cmd_reschedule(args: argparse.Namespace) -> int:
    with _client(args) as c:
        _print_job(c.reschedule(args.job_id, **_when(args)), args.json)
    return 0


def _print_job(job: pb.Job, as_json: bool) -> None:
    if as_json:
        print_json(job_json(job))
    else:
        print(job_line(job))
