"""The one place a command's errors become its exit status and a message (no traceback): our
errors and a server's gRPC status by ``timeshard.console.EXIT_BY_STATUS``, a file the command
was given named with what went wrong, Ctrl-C as 130."""

from __future__ import annotations

import argparse
import sys

import grpc

from timeshard.cli.security import apply_client_options
from timeshard.console import Exit, report_error
from timeshard.errors import TimeshardError, needs_extra
from timeshard.wire import translate


def run_command(args: argparse.Namespace) -> int:
    """``args.func(args)`` with the credentials options applied; every error it raises on
    purpose is printed on stderr as ``error (STATUS): message`` and exits with its class's
    code."""
    try:
        apply_client_options(args)
        # A server feature reached in an install without the server extra, where no edge
        # named it more precisely: say which extra to install, not a traceback.
        command = getattr(args, "command", None)
        with needs_extra(f"`timeshard {command}`" if command else "this command"):
            code: int = args.func(args)
    except TimeshardError as exc:
        return report_error(exc)
    except grpc.RpcError as exc:  # a call made without the client's translation
        return report_error(translate(exc))
    except OSError as exc:  # a file the command was given: say which
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return Exit.ERROR
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    return code
