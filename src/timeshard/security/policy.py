"""What a node's listening port requires, and the rule for where it may listen.

With neither TLS nor tokens a node listens only on loopback, unless it is told ``insecure``
explicitly (and then it says so in its log): anyone who reaches a bare port may schedule, cancel,
purge the dead-letter queue and move shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from dataclasses import dataclass

import grpc

from timeshard.errors import InvalidArgument, TimeshardError
from timeshard.security.auth import Authenticator, AuthInterceptor
from timeshard.security.decoding import DecodeGuard
from timeshard.security.tls import ServerTls

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(kw_only=True)
class ServerSecurity:
    tls: ServerTls | None = None
    auth: Authenticator | None = None
    insecure: bool = False
    """Listen beyond loopback without TLS or tokens (logged)."""
    reload_interval_s: float = 0.0
    """Re-read certificates and tokens this often (0: only on ``reload()``, i.e. SIGHUP)."""

    def describe(self) -> str:
        parts = []
        if self.tls is not None:
            parts.append("mutual TLS" if self.tls.mtls else "TLS")
        if self.auth is not None:
            parts.append(f"{len(self.auth.table)} role token(s)")
        return ", ".join(parts) or "plaintext, no tokens"

    def check_listen(self, host: str, port: int) -> None:
        """Refuse a bare port beyond loopback; warn about a half-protected one."""
        if is_loopback(host):
            return
        where = f"{host}:{port}"
        if self.tls is None and self.auth is None:
            if not self.insecure:
                raise InvalidArgument(
                    "--host",
                    f"refusing to listen on {where} without TLS or tokens: anyone who reaches it "
                    "could schedule, cancel, purge dead letters and move shards. Give --tls-dir "
                    "(and --mtls) and/or --auth-file, or --insecure to accept that",
                )
            log.warning(
                "listening on %s WITHOUT TLS OR TOKENS (--insecure): anyone who reaches this "
                "port may call every RPC",
                where,
            )
        elif self.tls is None:
            log.warning(
                "listening on %s without TLS: tokens and jobs cross the network in plaintext", where
            )
        elif self.auth is None and not self.tls.mtls:
            log.warning(
                "listening on %s with TLS but neither --mtls nor --auth-file: any "
                "client that reaches it may call every RPC",
                where,
            )

    def interceptors(self) -> list[AuthInterceptor | DecodeGuard]:
        """Tokens are checked first, so a denied request is never decoded."""
        auth = [AuthInterceptor(self.auth)] if self.auth is not None else []
        return [*auth, DecodeGuard()]

    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        if self.tls is not None:
            return server.add_secure_port(address, self.tls.credentials())
        return server.add_insecure_port(address)

    def reload(self) -> None:
        """Re-read certificates and tokens; a bad file is logged and the current one kept, so
        a mistake during rotation never takes the node down."""
        for what, item in (("certificates", self.tls), ("tokens", self.auth)):
            if item is None:
                continue
            try:
                changed = item.reload()
            except TimeshardError as exc:
                log.error("reload of %s failed, keeping the current ones: %s", what, exc.message)
                continue
            except Exception:
                log.exception("reload of %s failed, keeping the current ones", what)
                continue
            log.info("reload: %s %s", what, "replaced" if changed else "unchanged")

    async def reload_periodically(self) -> None:
        if self.reload_interval_s <= 0 or (self.tls is None and self.auth is None):
            return
        while True:
            await asyncio.sleep(self.reload_interval_s)
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(None, self.reload)
