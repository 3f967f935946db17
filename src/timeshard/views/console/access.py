"""Who may do what in the console.

Without tokens (a node with no ``--auth-file``) the console is open to whoever reaches it, as
the gRPC port is, and everyone is ``admin``: the port is then bound to loopback. With tokens
the console needs one, given once on its sign-in form (kept in a signed, HttpOnly,
SameSite=Strict session cookie as the token's hash, so revoking the token in the auth file
ends the session at the next reload) or as ``Authorization: Bearer`` on each request:

- ``viewer``: reads every page;
- ``operator``: also acts on jobs, schedules and dead letters (cancel, run now, replay, purge,
  bulk actions, pause and trigger a schedule);
- ``admin``: also edits job types (pause, resume, rate, burst, concurrency).

A ``client`` or ``worker`` token alone does not open the console. Every form that changes
something is a POST carrying the session's CSRF token; no GET changes anything.
"""

from __future__ import annotations

import enum
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from timeshard.errors import InvalidArgument
from timeshard.security.auth import Authenticator, Role, TokenEntry, hash_token


class Level(enum.IntEnum):
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3


ROLE_LEVELS = {Role.VIEWER: Level.VIEWER, Role.OPERATOR: Level.OPERATOR, Role.ADMIN: Level.ADMIN}


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    level: Level

    @property
    def role(self) -> str:
        return self.level.name.lower()


NOBODY_CHECKS = Operator("local", Level.ADMIN)


def level_of(entry: TokenEntry) -> Level | None:
    levels = [ROLE_LEVELS[r] for r in entry.roles if r in ROLE_LEVELS]
    return max(levels) if levels else None


class Access:
    """The console's view of the node's tokens (``auth``: None when the node has none)."""

    def __init__(self, auth: Authenticator | None) -> None:
        self.auth = auth

    @property
    def checks(self) -> bool:
        return self.auth is not None

    def by_token(self, token: str) -> tuple[Operator | None, str]:
        """The operator a presented token is, or None and why not."""
        if self.auth is None:
            return NOBODY_CHECKS, ""
        return self._of(self.auth.table.find(token.strip()))

    def by_hash(self, token_hash: str) -> Operator | None:
        """The operator of a session's token hash, while the token is still in the table."""
        if self.auth is None:
            return NOBODY_CHECKS
        found = None
        for entry in self.auth.table.entries:
            if hmac.compare_digest(entry.hash, token_hash):
                found = entry
        return self._of(found)[0]

    @staticmethod
    def _of(entry: TokenEntry | None) -> tuple[Operator | None, str]:
        if entry is None:
            return None, "this node does not know that token"
        level = level_of(entry)
        if level is None:
            roles = ", ".join(sorted(r.value for r in entry.roles))
            return None, (
                f"token {entry.name!r} has the roles {roles}, which do not open the console: "
                "it needs viewer, operator or admin"
            )
        return Operator(entry.name, level), ""


MIN_SECRET_CHARS = 32


def session_secret(path: Path, *, create: bool) -> str:
    """The key that signs console sessions, from ``path`` (``create``: made there, readable by
    its owner only, when it does not exist yet). A key that is too short to resist guessing is
    refused, naming the file."""
    try:
        if create and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(48) + "\n")
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument("--console-secret-file", f"can not read {path}: {exc}") from None
    if len(secret) < MIN_SECRET_CHARS:
        raise InvalidArgument(
            "--console-secret-file",
            f"{path} holds {len(secret)} characters: give at least {MIN_SECRET_CHARS} random "
            "ones (e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(48))')",
        )
    return secret


def token_hash(token: str) -> str:
    return hash_token(token.strip())


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def same(a: str, b: str) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())
