"""``timeshard certs init DIR``: a development CA with a server and a client certificate."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from timeshard.cli.common import add_json_option
from timeshard.console import print_json
from timeshard.errors import needs_extra


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = sub.add_parser("certs", help="development TLS certificates")
    certs_sub = certs.add_subparsers(dest="certs_cmd", required=True)
    init = certs_sub.add_parser(
        "init",
        help="write a development CA, a server and a client certificate into DIR",
        description="Writes ca.pem, ca-key.pem, server.pem, server-key.pem, client.pem and "
        "client-key.pem. Nodes read ca.pem, server.pem and server-key.pem (--tls-dir); clients "
        "read ca.pem and, for --mtls, client.pem and client-key.pem. Keep ca-key.pem off the "
        "nodes: it signs new certificates.",
    )
    init.add_argument("dir", help="the directory to write (made if missing)")
    init.add_argument(
        "--hosts",
        nargs="+",
        default=None,
        help="names and IPs the server certificate is valid for (default: localhost, "
        "127.0.0.1, ::1 and this machine's name); commas also separate",
    )
    init.add_argument("--force", action="store_true", help="replace existing files")
    add_json_option(init, '{"dir", "written": [PATH, ...], "hosts": [HOST, ...]}')
    init.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    with needs_extra("`timeshard certs init`"):
        from timeshard.security.certs import default_hosts, init_dir

    hosts = (
        [h for item in args.hosts for h in item.split(",") if h] if args.hosts else default_hosts()
    )
    directory = Path(args.dir)
    written = init_dir(directory, hosts=hosts, now=dt.datetime.now(dt.UTC), force=args.force)
    if args.json:
        print_json({"dir": str(directory), "written": [str(p) for p in written], "hosts": hosts})
        return 0
    for path in written:
        print(f"wrote {path}")
    print(f"server certificate valid for: {', '.join(hosts)}")
    print(f"node:   timeshard server --tls-dir {directory} [--mtls]")
    print(f"client: TIMESHARD_TLS_DIR={directory} timeshard jobs list")
    return 0
