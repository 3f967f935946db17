"""The ``timeshard`` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import metadata
from typing import Any

import argcomplete

from timeshard.cli import (
    audit,
    certs,
    completion,
    jobs,
    jobtypes,
    schedules,
    serve,
    shards,
    status,
    tokens,
    why,
)
from timeshard.cli.exits import run_command
from timeshard.console import use_help_formatter
from timeshard.observe import logs
from timeshard.security.auth import ENV_TOKEN
from timeshard.security.channel import server_from_env
from timeshard.security.tls import ENV_TLS_DIR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timeshard", description="A distributed scheduler for delayed and cron jobs."
    )
    parser.add_argument(
        "--version", action="version", version=f"timeshard {version()}", help="print the version"
    )
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(sub)
    jobs.register(sub)
    schedules.register(sub)
    why.register(sub)
    shards.register(sub)
    status.register(sub)
    jobtypes.register(sub)
    certs.register(sub)
    tokens.register(sub)
    audit.register(sub)
    try:
        from timeshard.stack import cli as stack_cli
    except ImportError:  # the stack tools are optional in a slim install
        pass
    else:
        stack_cli.register(sub)
    completion.register(sub)
    # `timeshard worker app:worker --server X` as well as `timeshard --server X worker ...`.
    for command in subcommands(parser):
        add_global_options(command, suppress=True)
    use_help_formatter([parser, *subcommands(parser)])
    return parser


def version() -> str:
    """The installed package's version."""
    try:
        return metadata.version("timeshard")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


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
    """Run one command; its exit status follows ``timeshard.console.Exit`` (docs/cli.md)."""
    parser = build_parser()
    argcomplete.autocomplete(parser)  # only acts when the shell asks for completions
    args = parser.parse_args(argv)
    logs.configure(args.log_format, level=logging.DEBUG if args.verbose else logging.INFO)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
