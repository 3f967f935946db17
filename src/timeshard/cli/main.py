"""The ``timeshard`` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from timeshard.cli import certs, jobs, schedules, serve, shards, status, tokens
from timeshard.cli.security import add_client_options, apply_client_options
from timeshard.client import DEFAULT_SERVER
from timeshard.errors import TimeshardError
from timeshard.observe import logs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timeshard", description="A distributed scheduler for delayed and cron jobs."
    )
    parser.add_argument(
        "--server",
        default=os.environ.get("TIMESHARD_SERVER", DEFAULT_SERVER),
        help="node address (env TIMESHARD_SERVER; default %(default)s)",
    )
    add_client_options(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=os.environ.get("TIMESHARD_LOG_FORMAT", "text"),
        help="text for a terminal, json for one object per line (env TIMESHARD_LOG_FORMAT)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve.register(sub)
    jobs.register(sub)
    schedules.register(sub)
    shards.register(sub)
    status.register(sub)
    certs.register(sub)
    tokens.register(sub)
    try:
        from timeshard.stack import cli as stack_cli
    except ImportError:  # the stack tools are optional in a slim install
        pass
    else:
        stack_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_format, level=logging.DEBUG if args.verbose else logging.INFO)
    try:
        apply_client_options(args)
        code: int = args.func(args)
    except TimeshardError as exc:
        status = getattr(exc, "code", None)
        name = status.name if status is not None and hasattr(status, "name") else "ERROR"
        print(f"error ({name}): {exc.message}", file=sys.stderr)
        return 2 if name == "INVALID_ARGUMENT" else 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
