"""Role tokens: who may call which RPC.

A token is a random secret (``ts_`` + 256 bits, URL-safe base64) that a client sends as
``authorization: Bearer <token>`` metadata. A node keeps only the SHA-256 of each token, in an
auth file (JSON or TOML) that maps the hash to a name and roles::

    {"tokens": {"sha256:9f86d0...": {"name": "billing-api", "roles": ["client"]}}}

    [tokens."sha256:9f86d0..."]
    name = "billing-api"
    roles = ["client"]

A plain hash (no salt, no slow KDF) is enough because the tokens are 256-bit random: there is
nothing to guess from a dictionary. A presented token is hashed and compared with every stored
hash in constant time (``hmac.compare_digest``, no early exit).

Roles (``admin`` may call everything, including RPCs a later version adds before this table
names them):

- ``client``: JobService: jobs (schedule, get, list, cancel, reschedule), schedules (create,
  get, list, update, pause, resume, delete, preview; their revisions: list, get, rollback)
  and listing dead letters;
- ``worker``: WorkerService (the worker stream, claim, heartbeat, complete, fail, finish),
  AdminService.ClusterInfo (workers discover the nodes) and AdminService.SetTypePolicies (a
  worker declares its tasks' retry and concurrency);
- ``admin``: the above and dead-letter replay/purge, shard owners, move shard, drain node,
  node status, a type's rate and pause (``SetTypeFlows``, ``ListTypes``).

Health checking and reflection stay open: load balancers and service managers probe health
without credentials, and reflection describes only the public ``timeshard.v1`` schema (no data).
Both are still behind TLS/mTLS when the node has it.

No token, or one the node does not know: UNAUTHENTICATED. A known token without the role:
PERMISSION_DENIED. Both are logged with the peer, the method and the token's name (never the
token).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from timeshard.errors import InvalidArgument

log = logging.getLogger(__name__)

ENV_TOKEN = "TIMESHARD_TOKEN"
TOKEN_PREFIX = "ts_"
HASH_PREFIX = "sha256:"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


class Role(enum.StrEnum):
    CLIENT = "client"
    WORKER = "worker"
    ADMIN = "admin"
    VIEWER = "viewer"
    """The operator console only: read its pages (no RPC)."""
    OPERATOR = "operator"
    """The operator console only: act on jobs, schedules and dead letters (no RPC)."""


_JOBS = "/timeshard.v1.JobService/"
_WORKERS = "/timeshard.v1.WorkerService/"
_ADMIN = "/timeshard.v1.AdminService/"
_PEERS = "/timeshard.v1.PeerService/"

METHOD_ROLES: dict[str, Role] = {
    **{
        _JOBS + m: Role.CLIENT
        for m in (
            "ScheduleJob",
            "ScheduleJobs",
            "GetJob",
            "ListJobs",
            "CancelJob",
            "RescheduleJob",
            "CreateSchedule",
            "GetSchedule",
            "ListSchedules",
            "UpdateSchedule",
            "PauseSchedule",
            "ResumeSchedule",
            "DeleteSchedule",
            "PreviewSchedule",
            "ListDeadLetters",
            "WaitJobs",
            "ListScheduleRevisions",
            "GetScheduleRevision",
            "RollbackSchedule",
            "ExplainOccurrence",
        )
    },
    _JOBS + "ReplayDeadLetters": Role.ADMIN,
    _JOBS + "PurgeDeadLetters": Role.ADMIN,
    **{
        _WORKERS + m: Role.WORKER
        for m in ("Claim", "Heartbeat", "Complete", "Fail", "Finish", "Work")
    },
    _ADMIN + "ClusterInfo": Role.WORKER,
    _ADMIN + "SetTypePolicies": Role.WORKER,
    _ADMIN + "ShardOwners": Role.ADMIN,
    _ADMIN + "MoveShard": Role.ADMIN,
    _ADMIN + "DrainNode": Role.ADMIN,
    _ADMIN + "NodeStatus": Role.ADMIN,
    _ADMIN + "SetTypeFlows": Role.ADMIN,
    _ADMIN + "ListTypes": Role.ADMIN,
    _ADMIN + "ListAudit": Role.ADMIN,
    # Between nodes: a hint that changes nothing stored (``timeshard.api.peers``).
    _PEERS + "Land": Role.WORKER,
    _PEERS + "WaitFinished": Role.WORKER,
    _PEERS + "Live": Role.WORKER,
    # Acts only on a lease the store shows cancelled (``timeshard.node.revokes``).
    _PEERS + "Revoke": Role.WORKER,
}
"""Each RPC of ``timeshard.v1`` and the role it needs (``admin`` passes every check)."""

OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def required_role(method: str) -> Role | None:
    """The role ``method`` needs; None for the open services; ``admin`` for anything unknown
    (fail closed)."""
    if method.startswith(OPEN_SERVICES):
        return None
    return METHOD_ROLES.get(method, Role.ADMIN)


def may_call(roles: Iterable[Role], method: str) -> bool:
    needed = required_role(method)
    held = set(roles)
    return needed is None or Role.ADMIN in held or needed in held


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return HASH_PREFIX + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenEntry:
    hash: str
    name: str
    roles: frozenset[Role]

    def __post_init__(self) -> None:
        if not _HASH.match(self.hash):
            raise InvalidArgument("auth file", f"{self.hash[:80]!r} is not sha256:<64 hex>")
        validate_name(self.name)
        if not self.roles:
            raise InvalidArgument("auth file", f"token {self.name!r} has no role")


def validate_name(name: str) -> str:
    if not NAME.match(name):
        raise InvalidArgument(
            "name", f"{name[:80]!r}: use letters, digits and . _ @ - (at most 64)"
        )
    return name


def parse_roles(values: Sequence[str], where: str) -> frozenset[Role]:
    try:
        return frozenset(Role(v) for v in values)
    except ValueError:
        raise InvalidArgument(
            where, f"unknown role in {list(values)!r}; use {[r.value for r in Role]}"
        ) from None


class TokenTable:
    """The tokens a node accepts, by hash."""

    def __init__(self, entries: Iterable[TokenEntry] = ()) -> None:
        self.entries: tuple[TokenEntry, ...] = tuple(entries)
        names = [e.name for e in self.entries]
        duplicate = {n for n in names if names.count(n) > 1}
        if duplicate:
            raise InvalidArgument("auth file", f"token names used twice: {sorted(duplicate)}")

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, token: str) -> TokenEntry | None:
        """The entry of ``token``; every stored hash is compared, in constant time each."""
        candidate = hash_token(token)
        found = None
        for entry in self.entries:
            if hmac.compare_digest(entry.hash, candidate):
                found = entry
        return found

    def by_name(self, name: str) -> TokenEntry | None:
        return next((e for e in self.entries if e.name == name), None)


# -- the auth file ------------------------------------------------------------------------


def _is_toml(path: Path) -> bool:
    return path.suffix.lower() == ".toml"


def load_table(path: Path | str) -> TokenTable:
    """The tokens of an auth file (``.toml`` is TOML, anything else JSON)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidArgument("--auth-file", f"can not read {path}: {exc.strerror}") from None
    try:
        raw: Any = tomllib.loads(text) if _is_toml(path) else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument("--auth-file", f"{path}: {exc}") from None
    tokens = raw.get("tokens", {}) if isinstance(raw, dict) else None
    if not isinstance(tokens, dict):
        raise InvalidArgument("--auth-file", f"{path}: expected a 'tokens' table")
    entries = []
    for digest, item in tokens.items():
        if not isinstance(item, dict) or not isinstance(item.get("roles"), list):
            raise InvalidArgument("--auth-file", f"{path}: {digest[:80]!r}: want name and roles")
        entries.append(
            TokenEntry(
                hash=str(digest),
                name=str(item.get("name", "")),
                roles=parse_roles([str(r) for r in item["roles"]], "--auth-file"),
            )
        )
    return TokenTable(entries)


def _render(table: TokenTable, toml: bool) -> str:
    items = {
        e.hash: {"name": e.name, "roles": sorted(r.value for r in e.roles)} for e in table.entries
    }
    if not toml:
        return json.dumps({"tokens": items}, indent=2) + "\n"
    out = ["# timeshard tokens: sha256 of each token -> name and roles (see `timeshard tokens`)"]
    for digest, item in items.items():
        # Names, roles and hashes are restricted to characters that need no TOML escaping.
        roles = ", ".join(f'"{r}"' for r in item["roles"])
        out += ["", f'[tokens."{digest}"]', f'name = "{item["name"]}"', f"roles = [{roles}]"]
    return "\n".join(out) + "\n"


def save_table(path: Path | str, table: TokenTable) -> None:
    """Write the auth file atomically (a new file renamed over the old one), mode 0600."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_render(table, _is_toml(path)))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def add_token(path: Path | str, name: str, roles: Sequence[str]) -> str:
    """Create a token for ``name`` with ``roles`` in the auth file (created if missing);
    returns the token, which is stored nowhere."""
    path = Path(path)
    validate_name(name)
    parsed = parse_roles(roles, "--role")
    table = load_table(path) if path.exists() else TokenTable()
    if table.by_name(name) is not None:
        raise InvalidArgument("name", f"{name!r} already has a token; remove it first")
    token = new_token()
    save_table(
        path,
        TokenTable([*table.entries, TokenEntry(hash=hash_token(token), name=name, roles=parsed)]),
    )
    return token


def remove_token(path: Path | str, name: str) -> bool:
    table = load_table(path)
    kept = [e for e in table.entries if e.name != name]
    if len(kept) == len(table.entries):
        return False
    save_table(path, TokenTable(kept))
    return True


# -- the server side ----------------------------------------------------------------------


class Authenticator:
    """The token table a node checks calls against, re-read from its file on ``reload``."""

    def __init__(self, path: Path | str | None = None, table: TokenTable | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.table = table if table is not None else TokenTable()
        self._ephemeral: list[TokenEntry] = []
        if self.path is not None:
            self.table = load_table(self.path)

    def reload(self) -> bool:
        """Re-read the auth file; True if it changed. Raises (and keeps the current tokens)
        when the file is unusable."""
        if self.path is None:
            return False
        table = load_table(self.path)
        entries = (*table.entries, *self._ephemeral)
        if set(entries) == set(self.table.entries):
            return False
        self.table = TokenTable(entries)
        return True

    def add_ephemeral(self, name: str, roles: Iterable[Role]) -> str:
        """A token held only in this process (``timeshard dev``'s own worker)."""
        token = new_token()
        entry = TokenEntry(hash=hash_token(token), name=name, roles=frozenset(roles))
        self._ephemeral.append(entry)
        self.table = TokenTable([*self.table.entries, entry])
        return token

    def check(self, method: str, metadata: Sequence[tuple[str, Any]] | None) -> Denial | None:
        """None if the call may go on, else why not."""
        needed = required_role(method)
        if needed is None:
            return None
        token, problem = bearer_token(metadata)
        if token is None:
            return Denial(grpc.StatusCode.UNAUTHENTICATED, problem, problem)
        entry = self.table.find(token)
        if entry is None:
            return Denial(
                grpc.StatusCode.UNAUTHENTICATED,
                "the bearer token is not known to this server (mistyped or revoked?)",
                "unknown token",
            )
        if may_call(entry.roles, method):
            return None
        held = sorted(r.value for r in entry.roles)
        return Denial(
            grpc.StatusCode.PERMISSION_DENIED,
            f"token {entry.name!r} has role(s) {held}; {method.rsplit('/', 1)[-1]} needs "
            f"{needed.value}",
            f"token {entry.name!r} (roles {held}) lacks {needed.value}",
        )


@dataclass(frozen=True, slots=True)
class Denial:
    code: grpc.StatusCode
    message: str
    """Told to the caller."""
    reason: str
    """Logged (never the token)."""


def bearer_token(metadata: Sequence[tuple[str, Any]] | None) -> tuple[str | None, str]:
    """The token of an ``authorization: Bearer`` header, or None and what is wrong."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, "the authorization metadata must be 'Bearer <token>'"
        return token.strip(), ""
    return None, "no bearer token: send 'authorization: Bearer <token>' (TIMESHARD_TOKEN)"


Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
if TYPE_CHECKING:  # the stubs' classes are generic, grpc's are not
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler]]


class AuthInterceptor(_ServerInterceptor):
    """Checks every call's token against the role its method needs, before the servicer."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        method: str = handler_call_details.method
        denial = self.auth.check(method, handler_call_details.invocation_metadata)
        # None (no such method: the server answers UNIMPLEMENTED) despite the stubs' type.
        handler: Handler | None = await continuation(handler_call_details)
        if denial is None:
            return handler  # type: ignore[return-value]
        return _denying(handler, method, denial)


def _who(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The peer's address, and under mutual TLS the common name of its certificate."""
    names = list(context.auth_context().get("x509_common_name") or [])
    cn = names[0].decode("utf-8", "replace") if names else ""
    return f"{context.peer()} (certificate {cn!r})" if cn else str(context.peer())


def _denying(handler: Handler | None, method: str, denial: Denial) -> Handler:
    """A handler of the same shape as ``handler`` that logs and aborts with ``denial``."""

    async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        log.warning("denied %s to %s: %s", method, _who(context), denial.reason)
        await context.abort(denial.code, denial.message)

    # The request of a denied call is never parsed: its bytes come from an unchecked peer.
    if handler is None or (not handler.request_streaming and not handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(
            deny, response_serializer=handler.response_serializer if handler else None
        )
    factory = {
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(deny, response_serializer=handler.response_serializer)
