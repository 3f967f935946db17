"""The ``timeshard`` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from timeshard.cli import certs, jobs, schedules, serve, shards, status, tokens
from timeshard.cli.security import apply_client_options
from timeshard.errors import TimeshardError
from timeshard.observe import logs
from timeshard.security.auth import ENV_TOKEN
from timeshard.security.channel import server_from_env
from timeshard.security.tls import ENV_TLS_DIR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timeshard", description="A distributed scheduler for delayed and cron jobs."
    )
    add_global_options(parser)
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
    # `timeshard worker app:worker --server X` as well as `timeshard --server X worker ...`.
    for command in subcommands(parser):
        add_global_options(command, suppress=True)
    return parser


def add_global_options(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """--server, --tls-dir, --token-file, -v, --log-format. ``suppress``: on a subcommand, where
    they may be given again; a value given there wins, else the one given before it stays."""
    group = parser.add_argument_group("global options (before or after the command)")

    def add(*flags: str, default: object, **kw: Any) -> None:
        if any(f in parser._option_string_actions for f in flags):
            return  # the command has its own (e.g. server's --tls-dir)
        group.add_argument(*flags, default=argparse.SUPPRESS if suppress else default, **kw)

    server = server_from_env()
    add(
        "--server",
        default=server,
        help=f"node address(es), comma-separated (env TIMESHARD_SERVER; default {server})",
    )
    add(
        "--tls-dir",
        default=os.environ.get(ENV_TLS_DIR, ""),
        help=f"directory of ca.pem (and client.pem, client-key.pem for mTLS) (env {ENV_TLS_DIR})",
    )
    add("--token-file", default="", help=f"file holding the role token (else env {ENV_TOKEN})")
    add("-v", "--verbose", default=False, action="store_true", help="debug logging")
    add(
        "--log-format",
        default=os.environ.get("TIMESHARD_LOG_FORMAT", "text"),
        choices=logs.FORMATS,
        help="text for a terminal, json for one object per line (env TIMESHARD_LOG_FORMAT)",
    )


def subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``parser`` (``jobs``, ``jobs list``, ...), each once."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += [child, *subcommands(child)]
    return found


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
    except OSError as exc:  # a file or port the command was given: say which, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
