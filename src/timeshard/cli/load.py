"""``timeshard jobs load FILE``: schedule the jobs of a JSON Lines file, one job per line.

The whole file is read and checked before anything is sent: every line must parse into a job
the server would accept (the fields of a line, their types, and the limits and time rules the
server applies, checked with the same functions), and every refused line is named by its file
line number. Only then are the jobs sent, ``--batch`` per ``ScheduleJobs`` call.

A line without a key of its own gets one derived from what it says (``LoadKeys``), so running
the same file again after a partial failure returns the jobs made the first time instead of
making them twice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import grpc

from timeshard.cli.common import parse_duration, parse_time
from timeshard.client.options import IF_EXISTS, Delay, NewJob, payload_bytes
from timeshard.client.proto import ProtoClient as Client
from timeshard.client.proto import Scheduled
from timeshard.clock import SystemClock, to_datetime
from timeshard.console import Exit, Progress, print_json
from timeshard.errors import InvalidArgument, TimeshardError
from timeshard.limits import MAX_IDEMPOTENCY_KEY_BYTES, check_attempts, check_bytes, shown
from timeshard.model import JobState, validate_job_type, validate_payload
from timeshard.wire import run_at_of, state_from_pb

FIELDS = ("type", "payload", "in", "at", "key", "max_attempts")
API_NAMES = {
    "delay": 'use "in" (a delay, e.g. "1h")',
    "run_at": 'use "at" (an RFC 3339 time, e.g. "2026-12-01T09:00:00Z")',
    "idempotency_key": 'use "key"',
    "job_type": 'use "type"',
}
"""The API's names for a line's fields: refused with the line's name for them, so a line written
with them is not read as "no time given"."""
_WIRE_FIELDS = {"delay": "in", "run_at": "at", "idempotency_key": "key"}
SHOWN_LINES = 20
"""Refused lines listed in one error; the count of the rest follows."""
DEFAULT_KEY_PREFIX = "load"
MAX_KEY_PREFIX_BYTES = 100
"""Leaves room in a derived key (``MAX_IDEMPOTENCY_KEY_BYTES``) for the digest and the count."""
_BATCH_INDEX = re.compile(r"jobs\[(\d+)\]")
_NOTHING_WRITTEN = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}
"""Refusals that come before the server writes anything of a batch."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Line:
    """One job of the file and the file line it came from."""

    number: int
    job: NewJob


@dataclass(frozen=True, slots=True)
class LoadKeys:
    """The key a line without one gets: ``<prefix>:<sha256 of its fields>:<n>``, where ``n``
    counts the earlier lines with the same fields (0 for the first). The same file loaded again
    derives the same keys, and a line added or removed elsewhere changes no other line's key;
    two identical lines are two jobs. ``prefix=None``: no derived keys."""

    prefix: str | None = DEFAULT_KEY_PREFIX

    def key(self, fields: dict[str, Any], seen: dict[str, int]) -> str:
        if self.prefix is None:
            return ""
        said = {k: v for k, v in fields.items() if k != "key"}
        text = json.dumps(said, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        n = seen.get(digest, 0)
        seen[digest] = n + 1
        return f"{self.prefix}:{digest}:{n}"


def key_prefix(text: str) -> str:
    """``--key-prefix``: 1-100 bytes (an argparse type)."""
    try:
        return check_bytes("--key-prefix", text, MAX_KEY_PREFIX_BYTES, required=True)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def add_if_exists_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--if-exists",
        choices=sorted(IF_EXISTS),
        default="check",
        help="when a key already names a job: check (the default) gets that job only if "
        "this asks for the same type, payload, max attempts, priority and time (a delay "
        f"counts from the key's first request), else exit {Exit.CONFLICT.value}; return gets "
        "it whatever this asks for",
    )


def print_warnings(results: Sequence[Scheduled]) -> list[str]:
    """Print on stderr what the server noticed, once per job type (a type no worker asked
    for lately); returns what was printed."""
    said: dict[str, str] = {}
    for done in results:
        for text in done.warnings:
            said.setdefault(done.job.type, text)
    for text in said.values():
        print(f"warning: {text}", file=sys.stderr)
    return list(said.values())


def cmd_load(args: argparse.Namespace) -> int:
    name = "stdin" if args.file == "-" else args.file
    keys = LoadKeys(None if args.no_derived_keys else args.key_prefix)
    returning = args.if_exists == "return"
    lines = parse_file(
        name, read_lines(args.file), SystemClock().now_ms(), keys, one_job_per_key=not returning
    )
    if returning:
        lines = [replace(line, job=replace(line.job, if_exists="return")) for line in lines]
    progress = Progress(len(lines), sys.stderr, shown=args.progress, verb="scheduled")
    try:
        with Client(args.server) as client:
            results = schedule_in_batches(client, name, lines, args.batch, progress)
    finally:
        progress.end()
    warnings = print_warnings(results)
    return report(name, lines, results, as_json=args.json, warnings=warnings)


def read_lines(file: str) -> list[str]:
    try:
        source = sys.stdin if file == "-" else open(file, encoding="utf-8")  # noqa: SIM115
        with source:
            return list(source)
    except OSError as exc:
        raise InvalidArgument("file", f"{file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument("file", f"{file}: not UTF-8 text ({exc.reason})") from None


# -- checking the file ------------------------------------------------------------------------


def parse_file(
    name: str, texts: Sequence[str], now_ms: int, keys: LoadKeys, *, one_job_per_key: bool = True
) -> list[Line]:
    """Every non-blank line as a job, or InvalidArgument naming every refused line.
    ``one_job_per_key``: lines with one key must say the same (else the server would refuse
    the later one; not with ``--if-exists=return``, where it returns the first's job)."""
    lines: list[Line] = []
    refused: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    bodies: dict[str, tuple[int, _Body]] = {}
    for number, text in enumerate(texts, 1):
        if not text.strip():
            continue
        try:
            job = line_job(text, now_ms, keys, seen)
            if one_job_per_key:
                _same_body_per_key(number, job, bodies)
        except InvalidArgument as exc:
            refused.append((number, exc.problem if exc.field == "line" else exc.message))
        else:
            lines.append(Line(number=number, job=job))
    if refused:
        total = len(lines) + len(refused)
        rows = [f"  line {n}: {why}" for n, why in refused[:SHOWN_LINES]]
        if len(refused) > SHOWN_LINES:
            rows.append(f"  ... and {len(refused) - SHOWN_LINES} more lines")
        raise InvalidArgument(
            name,
            f"{len(refused)} of {total} lines refused; nothing was scheduled\n" + "\n".join(rows),
        )
    return lines


def line_job(text: str, now_ms: int, keys: LoadKeys, seen: dict[str, int]) -> NewJob:
    """One line as a job, checked as the server would check it (InvalidArgument naming the
    line's field)."""
    item = _json_object(text)
    for field in item:
        if field in API_NAMES:
            raise InvalidArgument(
                f'"{field}"', f"not a field of a line (it is the API's name); {API_NAMES[field]}"
            )
        if field not in FIELDS:
            raise InvalidArgument(
                f'"{field}"', f"unknown field; a line's fields are {', '.join(FIELDS)}"
            )
    fields = {k: v for k, v in item.items() if v is not None}  # null: as if left out
    job_type = validate_job_type(_of_type(fields, "type", str, "a string") or "")
    payload = validate_payload(payload_bytes(fields.get("payload", {})))
    max_attempts = check_attempts(_of_type(fields, "max_attempts", int, "a whole number") or 0)
    key = _of_type(fields, "key", str, "a string") or ""
    check_bytes("key", key, MAX_IDEMPOTENCY_KEY_BYTES)
    job = NewJob(
        job_type=job_type,
        payload=payload,
        key=key or keys.key(fields, seen),
        max_attempts=max_attempts,
        **_when(fields),
    )
    try:
        run_at_of(job.request(), now_ms, required=True, whose_now="this machine's time")
    except InvalidArgument as exc:
        raise InvalidArgument(_WIRE_FIELDS.get(exc.field, exc.field), exc.problem) from None
    return job


def _json_object(text: str) -> dict[str, Any]:
    try:
        item = json.loads(
            text.rstrip(),
            object_pairs_hook=_no_repeats,
            parse_constant=_no_constant,
            parse_float=_finite,
        )
    except json.JSONDecodeError as exc:  # its own "line 1" would read as a line of the file
        raise InvalidArgument("line", f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError as exc:
        raise InvalidArgument("line", f"not valid JSON: {exc}") from None
    if not isinstance(item, dict):
        raise InvalidArgument("line", 'must be an object, e.g. {"type": "demo.echo", "in": "1s"}')
    return item


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"{name!r} is given twice in one object")
        out[name] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (only finite numbers are)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a JSON number")
    return value


def _of_type(fields: dict[str, Any], name: str, kind: type, what: str) -> Any:
    """The field's value if it is of ``kind`` (a bool is not a number), else refused: a value
    of another type is never converted."""
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgument(name, f"must be {what}, got {shown(json.dumps(value))}")
    return value


def _when(fields: dict[str, Any]) -> dict[str, Any]:
    delay = _of_type(fields, "in", str, 'a string, a delay such as "30s" or "1h30m"')
    at = _of_type(fields, "at", str, 'a string, an RFC 3339 time such as "2026-12-01T09:00:00Z"')
    if delay is not None and at is not None:
        raise InvalidArgument("in", 'give "in" or "at", not both')
    if at is not None:
        return {"at": to_datetime(parse_time(at, field="at"))}
    if delay is not None:
        return {"delay": parse_duration(delay, field="in")}
    raise InvalidArgument(
        "in", 'a time is required: "in" (a delay; "0s" runs now) or "at" (an RFC 3339 time)'
    )


_Body = tuple[str, Any, int, Delay | None, datetime | None]


def _same_body_per_key(number: int, job: NewJob, bodies: dict[str, tuple[int, _Body]]) -> None:
    """A key given twice names one job: the lines must agree on what it is and when (the
    server would refuse the later one's batch, ALREADY_EXISTS)."""
    if not job.key:
        return
    body = (job.job_type, job.payload, job.max_attempts, job.delay, job.at)
    first, first_body = bodies.setdefault(job.key, (number, body))
    if first_body != body:
        raise InvalidArgument(
            "key",
            f"{job.key!r} is also the key of line {first}, with another type, "
            "payload, max_attempts or time: one key names one job",
        )


# -- scheduling -------------------------------------------------------------------------------


class LoadStopped(TimeshardError):
    """The server refused (or failed) one batch; the message says which file lines and what was
    scheduled before it. ``code`` is the server's status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def schedule_in_batches(
    client: Client, name: str, lines: Sequence[Line], batch: int, progress: Progress
) -> list[Scheduled]:
    done: list[Scheduled] = []
    for start in range(0, len(lines), batch):
        chunk = lines[start : start + batch]
        try:
            done += client.schedule_many([line.job for line in chunk], batch_size=len(chunk))
        except TimeshardError as exc:
            raise _stopped(exc, name, lines, start, chunk, done) from None
        progress(len(done))
    return done


def _stopped(
    exc: TimeshardError,
    name: str,
    lines: Sequence[Line],
    start: int,
    chunk: Sequence[Line],
    done: Sequence[Scheduled],
) -> LoadStopped:
    first, last = chunk[0].number, chunk[-1].number
    code = exc.code

    def file_line(m: re.Match[str]) -> str:  # the server names an item of the batch
        i = int(m.group(1))
        return f"line {chunk[i].number}" if i < len(chunk) else m.group(0)

    detail = _BATCH_INDEX.sub(file_line, exc.message)
    if code in _NOTHING_WRITTEN:
        what = f"none of lines {first}-{last} was scheduled"
    else:
        what = f"whether lines {first}-{last} were scheduled is not known"
    created = sum(d.created for d in done)
    before = (
        f"the {len(done)} lines before line {first} were scheduled ({created} created, "
        f"{len(done) - created} already existed)"
        if done
        else f"no line before line {first} was scheduled"
    )
    rest = lines[start + len(chunk) :]
    after = f"lines {rest[0].number}-{rest[-1].number} were not sent" if rest else ""
    again = (
        "fix it and run the same command again: what was scheduled is not scheduled twice"
        if all(line.job.key for line in lines)
        else "lines without a key are scheduled again by a re-run (--no-derived-keys)"
    )
    parts = [f"{name} lines {first}-{last}: {detail}", what, before, after, again]
    return LoadStopped(code, "; ".join(p for p in parts if p))


# -- the summary ------------------------------------------------------------------------------


def report(
    name: str,
    lines: Sequence[Line],
    results: Sequence[Scheduled],
    *,
    as_json: bool = False,
    warnings: Sequence[str] = (),
) -> int:
    """Print what the load did; ``Exit.FAILED_PRECONDITION`` if a line's key named a job that
    will not run (as ``jobs schedule --key`` exits for one)."""
    created = existed = 0
    refused: list[dict[str, Any]] = []
    for line, done in zip(lines, results, strict=True):
        if done.created:
            created += 1
            continue
        why = not_scheduled_why(done, line.job.key)
        if why is None:
            existed += 1
        else:
            refused.append({"line": line.number, "job_id": done.job.job_id, "why": why})
    for row in refused:
        print(f"{name} line {row['line']}: {row['why']}", file=sys.stderr)
    if as_json:
        print_json(
            {
                "file": name,
                "lines": len(lines),
                "created": created,
                "already_existed": existed,
                "not_scheduled": refused,
                "warnings": list(warnings),
                "jobs": [
                    {"line": line.number, "job_id": done.job.job_id, "created": done.created}
                    for line, done in zip(lines, results, strict=True)
                ],
            }
        )
    else:
        counted = f"{len(lines)} line{'' if len(lines) == 1 else 's'}"
        print(
            f"{counted}: {created} created, {existed} already existed, {len(refused)} not scheduled"
        )
    return Exit.FAILED_PRECONDITION if refused else Exit.OK


def not_scheduled_why(done: Scheduled, key: str) -> str | None:
    """Why a repeat of ``key`` scheduled nothing: it names a job that will not run (cancelled
    or dead); None when that job is still to run or already ran."""
    job = done.job
    state = state_from_pb(job.state)
    named = f"key {key!r} names job {job.job_id}, which is {state.value if state else 'unknown'}"
    if state is JobState.CANCELLED:
        return f"not scheduled: {named}; a new job needs a new key"
    if state is JobState.DEAD:
        return (
            f"not scheduled: {named}; replay it (timeshard dlq replay {job.job_id}) or use a "
            "new key"
        )
    return None
