"""The CLI's TLS and token options: ``--tls-dir``/``--token-file`` for every command that dials
a node, and ``--tls-dir``/``--mtls``/``--auth-file``/``--insecure``/``--reload-interval`` for
``timeshard server`` and ``timeshard dev``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from timeshard.cli.common import number
from timeshard.errors import InvalidArgument
from timeshard.security.auth import ENV_TOKEN, Authenticator
from timeshard.security.policy import ServerSecurity
from timeshard.security.tls import ENV_TLS_DIR, ServerTls

ENV_AUTH_FILE = "TIMESHARD_AUTH_FILE"


def add_client_options(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """``--tls-dir`` and ``--token-file``. ``suppress``: on a subcommand, leave the value the
    main parser set unless given here too."""
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parser.add_argument(
        "--tls-dir",
        default=default(os.environ.get(ENV_TLS_DIR, "")),
        help=f"directory of ca.pem (and client.pem, client-key.pem for mTLS) (env {ENV_TLS_DIR})",
    )
    if not suppress:
        parser.add_argument(
            "--token-file",
            default="",
            help=f"file holding the role token (else env {ENV_TOKEN})",
        )


def apply_client_options(args: argparse.Namespace) -> None:
    """Hand ``--tls-dir`` and ``--token-file`` to every client the command makes: the SDK
    reads ``TIMESHARD_TLS_DIR`` and ``TIMESHARD_TOKEN`` when not given them explicitly."""
    if getattr(args, "tls_dir", ""):
        os.environ[ENV_TLS_DIR] = args.tls_dir
    token_file = getattr(args, "token_file", "")
    if token_file:
        try:
            os.environ[ENV_TOKEN] = Path(token_file).read_text().strip()
        except OSError as exc:
            raise InvalidArgument("--token-file", f"{token_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise InvalidArgument("--token-file", f"{token_file}: not UTF-8 text") from None


def add_server_options(parser: argparse.ArgumentParser) -> None:
    add_client_options(parser, suppress=True)
    parser.add_argument(
        "--mtls", action="store_true", help="also require client certificates signed by ca.pem"
    )
    parser.add_argument(
        "--auth-file",
        default=os.environ.get(ENV_AUTH_FILE, ""),
        help=f"role tokens (JSON or TOML, see `timeshard tokens`) (env {ENV_AUTH_FILE})",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow listening beyond loopback without TLS or tokens",
    )
    parser.add_argument(
        "--reload-interval",
        type=number(lo=0, note="seconds; 0: only on SIGHUP"),
        default=0.0,
        help="re-read certificates and tokens every N seconds (SIGHUP always does)",
    )


def server_security(args: argparse.Namespace) -> ServerSecurity:
    tls_dir = getattr(args, "tls_dir", "")
    if args.mtls and not tls_dir:
        raise InvalidArgument("--mtls", "needs --tls-dir (the CA that signs client certificates)")
    if args.reload_interval < 0:
        raise InvalidArgument("--reload-interval", "must not be negative")
    try:
        auth = Authenticator(args.auth_file) if args.auth_file else None
    except UnicodeDecodeError:
        raise InvalidArgument("--auth-file", f"{args.auth_file}: not UTF-8 text") from None
    return ServerSecurity(
        tls=ServerTls(tls_dir, mtls=args.mtls) if tls_dir else None,
        auth=auth,
        insecure=args.insecure,
        reload_interval_s=args.reload_interval,
    )
