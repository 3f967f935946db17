"""What a command prints and how it exits: one JSON encoder, one time format, progress that
rewrites its line only on a terminal, and the table of exit codes by error class.

Used by the ``timeshard`` command (``timeshard.cli``) and the stack's own command, so it stands in
the kernel and imports only the kernel.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO, overload

import grpc

from timeshard.clock import format_rfc3339
from timeshard.errors import TimeshardError

# -- exit codes -------------------------------------------------------------------------------


class Exit(enum.IntEnum):
    """The exit status of every ``timeshard`` command, by error class (docs/cli.md)."""

    OK = 0
    ERROR = 1
    """Anything else: an internal error, or a command whose check found a problem (``status``
    with a node down, ``stack status`` with a service not running)."""
    USAGE = 2
    """A usage error (argparse) or an invalid argument (``INVALID_ARGUMENT``, ``OUT_OF_RANGE``),
    ours or the server's: fix the command line or the input."""
    NOT_FOUND = 3
    CONFLICT = 4
    """``ALREADY_EXISTS`` (e.g. an idempotency key given with another body), ``ABORTED``."""
    FAILED_PRECONDITION = 5
    """The request is valid but the state does not allow it (cancel a finished job; a key that
    names a cancelled or dead job, so nothing was scheduled)."""
    UNAVAILABLE = 6
    """No server answered, or it timed out (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``): retry."""
    DENIED = 7
    """``UNAUTHENTICATED`` or ``PERMISSION_DENIED``: another token, role or certificate."""
    JOB_FAILED = 8
    """A job waited for ended dead, cancelled or expired (``jobs wait``), or has no result
    because it did not succeed (``jobs get --result``)."""
    INTERRUPTED = 130
    """Ctrl-C (SIGINT), as shells report it."""


EXIT_BY_STATUS: dict[grpc.StatusCode, Exit] = {
    grpc.StatusCode.OK: Exit.OK,
    grpc.StatusCode.INVALID_ARGUMENT: Exit.USAGE,
    grpc.StatusCode.OUT_OF_RANGE: Exit.USAGE,
    grpc.StatusCode.NOT_FOUND: Exit.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: Exit.CONFLICT,
    grpc.StatusCode.ABORTED: Exit.CONFLICT,
    grpc.StatusCode.FAILED_PRECONDITION: Exit.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE: Exit.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: Exit.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: Exit.DENIED,
    grpc.StatusCode.PERMISSION_DENIED: Exit.DENIED,
}
"""The one table from a gRPC status (ours: ``TimeshardError.code``) to an exit code; a status
not in it (``INTERNAL``, ``UNKNOWN``, ``UNIMPLEMENTED``, ``RESOURCE_EXHAUSTED``, ...) exits
``Exit.ERROR``."""


def exit_code(status: grpc.StatusCode) -> Exit:
    return EXIT_BY_STATUS.get(status, Exit.ERROR)


def error_status(exc: TimeshardError) -> grpc.StatusCode:
    """The status an error stands for: a server's answer keeps the code it came with."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.INTERNAL


def report_error(exc: TimeshardError, stream: TextIO | None = None) -> Exit:
    """Print ``error (STATUS): message`` and return the exit code of its class."""
    status = error_status(exc)
    print(f"error ({status.name}): {exc.message}", file=stream or sys.stderr)
    return exit_code(status)


# -- JSON -------------------------------------------------------------------------------------


def json_text(value: Any, *, pretty: bool = False) -> str:
    """The one encoding of ``--json`` output: keys in the order the command built them,
    ASCII only (so any terminal or pipe takes it), one line unless ``pretty``."""
    return json.dumps(value, indent=2 if pretty else None)


def print_json(value: Any, stream: TextIO | None = None) -> None:
    """``value`` as one JSON document on stdout: indented for a terminal, else on one line
    (so the last line of any command's output is the whole document)."""
    out = stream or sys.stdout
    print(json_text(value, pretty=_isatty(out)), file=out, flush=True)


# -- times ------------------------------------------------------------------------------------


@overload
def when(ms: int) -> str: ...
@overload
def when(ms: None) -> None: ...
def when(ms: int | None) -> str | None:
    """A time as people and JSON both get it: RFC 3339 in UTC, e.g. ``2026-12-01T14:30:00Z``
    (milliseconds only when not whole, ``...:00.250Z``); None stays None."""
    return None if ms is None else format_rfc3339(ms)


def when_local(ms: int) -> str:
    """:func:`when`, with this machine's local time beside it when that is not UTC, e.g.
    ``2026-12-01T14:30:00Z (local 2026-12-01T15:30:00+01:00)``."""
    utc = format_rfc3339(ms)
    local = datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone()
    offset = local.utcoffset()
    if offset is None or not offset:
        return utc
    spec = "milliseconds" if ms % 1000 else "seconds"
    return f"{utc} (local {local.isoformat(timespec=spec)})"


# -- progress ---------------------------------------------------------------------------------

PLAIN_EVERY_S = 1.0
"""Off a terminal, at most one progress line this often (and one at the end)."""


class Progress:
    """``done/total <verb>, rate/s`` on ``stream`` (stderr).

    ``shown=None`` (the default of ``--progress``): only when ``stream`` is a terminal. On a
    terminal the line is rewritten in place (``\\r``); anywhere else (``--progress`` into a file
    or pipe) each update is a plain line of its own, at most one a second, so a log holds
    readable lines rather than carriage returns piled up."""

    def __init__(
        self, total: int, stream: TextIO, *, shown: bool | None = None, verb: str = "done"
    ) -> None:
        self.total = total
        self.stream = stream
        self.verb = verb
        self.tty = _isatty(stream)
        self.shown = self.tty if shown is None else shown
        self.started = time.monotonic()
        self._last_plain = float("-inf")
        self._open_line = False

    def __call__(self, done: int) -> None:
        if not self.shown:
            return
        now = time.monotonic()
        if not self.tty and done < self.total and now - self._last_plain < PLAIN_EVERY_S:
            return
        rate = done / max(1e-9, now - self.started)
        text = f"{done:,}/{self.total:,} {self.verb}, {rate:,.0f}/s"
        if self.tty:
            self.stream.write(f"\r{text}")
            self._open_line = True
        else:
            self.stream.write(f"{text}\n")
            self._last_plain = now
        self.stream.flush()

    def end(self) -> None:
        """Finish the line on a terminal."""
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False


def add_progress_option(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` for :class:`Progress` (``args.progress``: None when
    neither is given, i.e. only on a terminal)."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr: by default only when stderr is a terminal; --progress also "
        "into a file or pipe (plain lines, no carriage returns), --no-progress never",
    )


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


# -- help -------------------------------------------------------------------------------------


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, when it has one worth saying (not None,
    False, empty, or already named in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower():
            return text
        default = action.default
        if default is argparse.SUPPRESS or default is None or default is False:
            return text
        if default == "" or default == [] or isinstance(default, bool):
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, "*"):
            return text
        return f"{text} (default: %(default)s)"


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`HelpFormatter` for a command whose description is laid out by hand."""


def use_help_formatter(parsers: list[argparse.ArgumentParser]) -> None:
    """Give each parser :class:`HelpFormatter`, keeping a hand-laid description as it is."""
    for p in parsers:
        raw = issubclass(p.formatter_class, argparse.RawDescriptionHelpFormatter)  # type: ignore[arg-type]
        p.formatter_class = RawDescriptionHelpFormatter if raw else HelpFormatter
