"""``timeshard tokens add|list|remove --file FILE``: the role tokens a node accepts
(``--auth-file``). Only each token's hash is stored; ``add`` prints the token once, as its last
line. Nodes read the file again on SIGHUP (or every ``--reload-interval``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from timeshard.cli.common import add_json_option
from timeshard.cli.security import ENV_AUTH_FILE
from timeshard.console import print_json
from timeshard.errors import InvalidArgument, NotFound
from timeshard.security.auth import Role, add_token, load_table, remove_token

T = TypeVar("T")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tokens = sub.add_parser("tokens", help="role tokens of an auth file", description=__doc__)
    tokens_sub = tokens.add_subparsers(dest="tokens_cmd", required=True)

    add = tokens_sub.add_parser("add", help="create a token; prints it once")
    add.add_argument("name", help="who holds it, e.g. billing-api or worker-mail")
    add.add_argument(
        "--role",
        action="append",
        required=True,
        choices=[r.value for r in Role],
        help="client, worker or admin; viewer or operator for the console only (repeat "
        "for several)",
    )
    _file_option(add)
    add_json_option(add, '{"name", "roles", "file", "token"}')
    add.set_defaults(func=cmd_add)

    ls = tokens_sub.add_parser("list", help="names and roles (never the tokens)")
    _file_option(ls)
    add_json_option(ls, '[{"name", "roles", "hash_prefix"}, ...]')
    ls.set_defaults(func=cmd_list)

    rm = tokens_sub.add_parser("remove", help="revoke a token by name")
    rm.add_argument("name", help="the token's name, as given to `tokens add`")
    _file_option(rm)
    add_json_option(rm, '{"removed": NAME, "file": FILE}')
    rm.set_defaults(func=cmd_remove)


def _file_option(p: argparse.ArgumentParser) -> None:
    default = os.environ.get(ENV_AUTH_FILE, "")
    p.add_argument(
        "--file",
        default=default,
        required=not default,
        help=f"the auth file (.toml for TOML, else JSON) (env {ENV_AUTH_FILE})",
    )


def cmd_add(args: argparse.Namespace) -> int:
    token = _utf8(args.file, lambda: add_token(args.file, args.name, args.role))
    roles = ", ".join(sorted(set(args.role)))
    if args.json:
        print(
            f"added token {args.name!r} to {args.file}; only its hash is stored, so copy it now",
            file=sys.stderr,
        )
        print_json(
            {"name": args.name, "roles": sorted(set(args.role)), "file": args.file, "token": token}
        )
        return 0
    print(
        f"added token {args.name!r} ({roles}) to {args.file}; only its hash is stored, so copy "
        "it now. Send SIGHUP to the nodes (or wait for --reload-interval) to load it.",
        file=sys.stderr,
    )
    print(token, flush=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    entries = _utf8(args.file, lambda: load_table(args.file)).entries
    if args.json:
        print_json(
            [
                {
                    "name": e.name,
                    "roles": sorted(r.value for r in e.roles),
                    "hash_prefix": e.hash[:19],
                }
                for e in entries
            ]
        )
        return 0
    for entry in entries:
        roles = ",".join(sorted(r.value for r in entry.roles))
        print(f"{entry.name:<24} {roles:<20} {entry.hash[:19]}…")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    if not _utf8(args.file, lambda: remove_token(args.file, args.name)):
        raise NotFound("token", args.name)
    if args.json:
        print_json({"removed": args.name, "file": args.file})
        return 0
    print(f"removed token {args.name!r}; nodes refuse it once they reload (SIGHUP)")
    return 0


def _utf8(path: str, call: Callable[[], T]) -> T:
    """``call``, with a file that is not text (JSON and TOML are UTF-8) refused by name."""
    try:
        return call()
    except UnicodeDecodeError:
        raise InvalidArgument("--file", f"{path}: not UTF-8 text") from None
