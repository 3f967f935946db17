"""The ZooKeeper side of shard ownership: the URL, the znode layout, a snapshot of the cluster,
and the admin operations (move, drain) that ``timeshard shards`` and the AdminService use.

Layout under the cluster's PATH::

    config              {"num_shards": N}                  persistent, written by the first node
    members/<node_id>   {"node_id": ..., "address": ...}   ephemeral (the node's session)
    owners/<shard>      {"node_id": ...}                   ephemeral (the owner's session)
    moves/<shard>       {"to": node_id}                    persistent: pins a shard on a node
    draining/<node_id>  {}                                 persistent: the node gets no shard

The admin operations only write ``moves`` and ``draining``; the nodes see the change through their
watches and hand the shards over themselves (the owner releases, the new owner takes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_digest_acl

from timeshard.coordinator.assignment import assign
from timeshard.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    redact_url,
)

DEFAULT_PATH = "/timeshard"
ENV_PASSWORD = "TIMESHARD_ZOOKEEPER_PASSWORD"
DEFAULT_SESSION_TIMEOUT_S = 4.0
NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


class CoordinatorUnavailable(Unavailable):
    def __init__(self, detail: str) -> None:
        super().__init__(f"ZooKeeper unavailable: {detail}; retry with backoff")
        self.detail = detail


def validate_node_id(node_id: str) -> str:
    if not NODE_ID.match(node_id):
        raise InvalidArgument(
            "node_id", f"{node_id!r}: use letters, digits and . _ : @ - (at most 128)"
        )
    return node_id


# -- the URL ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooKeeperConfig:
    hosts: str
    """``host:port[,host:port...]`` (kazoo's ``hosts``)."""
    path: str = DEFAULT_PATH
    """The cluster's root znode; one ZooKeeper can hold several clusters."""
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S
    """A dead node's shards move this long after it stopped answering (ZooKeeper bounds it to
    2-20 of its ticks)."""
    connect_timeout_s: float = 15.0
    username: str | None = None
    """With a user, every znode timeshard creates carries a digest ACL that gives that user
    (and no one else) every permission, and the session authenticates as that user."""
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.hosts:
            raise InvalidArgument("coordinator", "no ZooKeeper host given")
        if not self.path.startswith("/") or self.path.endswith("/") or "//" in self.path:
            raise InvalidArgument("coordinator", f"{self.path!r} is not a znode path like /a/b")
        if not 0 < self.session_timeout_s <= 600:
            raise InvalidArgument("session_timeout", "must be between 0 and 600 seconds")
        if not 0 < self.connect_timeout_s <= 600:
            raise InvalidArgument("connect_timeout", "must be between 0 and 600 seconds")
        if self.username is not None and (not self.username or ":" in self.username):
            raise InvalidArgument("coordinator", "the ZooKeeper user must be non-empty, no ':'")
        if self.username and not self.password:
            raise InvalidArgument(
                "coordinator",
                f"ZooKeeper user {self.username!r} has no password: give it in the URL, with "
                f"?password_file=PATH, or in {ENV_PASSWORD}",
            )

    @property
    def acl(self) -> list[ACL] | None:
        """The ACL of every znode timeshard creates (None: ZooKeeper's open default)."""
        if not self.username:
            return None
        return [make_digest_acl(self.username, self.password or "", all=True)]

    def client(self) -> KazooClient:
        """A kazoo client (not started) that reconnects quickly and forever: a node waits for
        ZooKeeper to come back rather than giving up."""
        auth: dict[str, Any] = {}
        if self.username:
            _hide_auth_in_kazoo_logs()
            # kazoo applies default_acl to every create, ensure_path and transaction.
            auth = {
                "auth_data": [("digest", f"{self.username}:{self.password or ''}")],
                "default_acl": self.acl,
            }
        return KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            command_retry=KazooRetry(max_tries=3, delay=0.05, max_delay=1.0),
            **auth,
        )


class _RedactAuth(logging.Filter):
    """kazoo logs each request at DEBUG, the digest ``Auth`` one with ``user:password``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "Auth(" in str(record.msg) or any("Auth(" in str(a) for a in record.args or ()):
            record.msg = re.sub(r"auth='[^']*'", "auth='***'", record.getMessage())
            record.args = ()
        return True


def _hide_auth_in_kazoo_logs() -> None:
    logger = logging.getLogger("kazoo.client")
    if not any(isinstance(f, _RedactAuth) for f in logger.filters):
        logger.addFilter(_RedactAuth())


def parse_url(url: str) -> ZooKeeperConfig:
    """``zookeeper://[user[:password]@]HOST:PORT[,HOST:PORT...]/PATH[?session_timeout=4]``.

    Options: ``session_timeout`` and ``connect_timeout`` in seconds; ``password_file``, a file
    holding the user's password (better than the URL, which ``ps`` shows). A user without a
    password in the URL or a file takes ``TIMESHARD_ZOOKEEPER_PASSWORD``. With a user, every
    znode is created with a digest ACL that only that user may read or change.
    """
    shown = redact_url(url)
    if not url.startswith("zookeeper://"):
        raise InvalidArgument("coordinator", f"{shown!r} is not a zookeeper:// URL")
    rest, _, query = url.removeprefix("zookeeper://").partition("?")
    netloc, slash, path = rest.partition("/")
    creds, _, hosts = netloc.rpartition("@")
    for item in hosts.split(","):
        host, _, port = item.partition(":")
        if not host or not port.isdigit():
            raise InvalidArgument("coordinator", f"{shown!r}: bad host {item!r}, want HOST:PORT")
    opts = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(opts) - {"session_timeout", "connect_timeout", "password_file"}
    if unknown:
        raise InvalidArgument("coordinator", f"{shown!r}: unknown option(s) {sorted(unknown)}")
    user, has_password, password = creds.partition(":")
    if "password_file" in opts and not creds:
        raise InvalidArgument("password_file", "give the user too: zookeeper://USER@HOST:PORT/...")
    if creds and not has_password:
        password = _password_from(opts.get("password_file", ""))
    return ZooKeeperConfig(
        hosts=hosts,
        path=f"/{path.strip('/')}" if slash and path.strip("/") else DEFAULT_PATH,
        session_timeout_s=_seconds(opts, "session_timeout", DEFAULT_SESSION_TIMEOUT_S),
        connect_timeout_s=_seconds(opts, "connect_timeout", 15.0),
        username=unquote(user) if creds else None,
        password=unquote(password) if creds and has_password else (password or None),
    )


def _password_from(password_file: str) -> str:
    if password_file:
        try:
            return Path(password_file).read_text().strip()
        except OSError as exc:
            raise InvalidArgument("password_file", f"{password_file}: {exc.strerror}") from None
    return os.environ.get(ENV_PASSWORD, "")


def open_acl_warning(acls: list[ACL], path: str) -> str | None:
    """A warning when ``acls`` let anyone (``world:anyone``) read or change ``path``."""
    for acl in acls:
        if acl.id.scheme == "world" and acl.perms & (Permissions.READ | Permissions.WRITE):
            return (
                f"znode {path} is readable or writable by anyone (it was created without "
                "credentials); restrict it, e.g. zkCli.sh setAcl -R "
                f"{path} digest:USER:HASH:cdrwa"
            )
    return None


PARENT_ACL = OPEN_ACL_UNSAFE
"""The ACL of the parents of a cluster's root that timeshard creates: they are shared
namespaces (other clusters live beside ours), and an open parent exposes nothing of ours: our
root, with its own ACL and its persistent children, can be neither read nor deleted through it."""


def _seconds(opts: dict[str, str], key: str, default: float) -> float:
    if key not in opts:
        return default
    try:
        return float(opts[key])
    except ValueError:
        raise InvalidArgument(key, f"{opts[key]!r} is not a number of seconds") from None


# -- the layout ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    root: str

    @property
    def config(self) -> str:
        return f"{self.root}/config"

    @property
    def members(self) -> str:
        return f"{self.root}/members"

    @property
    def owners(self) -> str:
        return f"{self.root}/owners"

    @property
    def moves(self) -> str:
        return f"{self.root}/moves"

    @property
    def draining(self) -> str:
        return f"{self.root}/draining"

    @property
    def folders(self) -> tuple[str, ...]:
        return (self.members, self.owners, self.moves, self.draining)

    def member(self, node_id: str) -> str:
        return f"{self.members}/{node_id}"

    def owner(self, shard: int) -> str:
        return f"{self.owners}/{shard}"

    def move(self, shard: int) -> str:
        return f"{self.moves}/{shard}"

    def drain(self, node_id: str) -> str:
        return f"{self.draining}/{node_id}"


def encode(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes | None) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def shard_names(children: list[str]) -> set[int]:
    """The shard numbers among znode names (anything else is ignored)."""
    return {int(c) for c in children if c.isdigit()}


# -- a snapshot of the cluster ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterView:
    num_shards: int
    members: dict[str, str]
    """node id -> address, live nodes only."""
    owners: dict[int, str]
    """shard -> owning node id, for shards that have an owner."""
    draining: frozenset[str]
    moves: dict[int, str]

    def assignment(self) -> dict[int, str]:
        return assign(self.num_shards, self.members, draining=self.draining, moves=self.moves)

    def pending(self) -> dict[int, tuple[str, str]]:
        """shard -> (owner now or "", owner to be), for shards not where they should be."""
        target = self.assignment()
        return {
            s: (self.owners.get(s, ""), node)
            for s, node in sorted(target.items())
            if self.owners.get(s) != node
        }


class ShardAdmin:
    """Blocking admin operations on a started kazoo client (the CLI's, or a node's own from an
    executor thread). Every ZooKeeper error becomes ``CoordinatorUnavailable``."""

    def __init__(self, client: KazooClient, layout: Layout) -> None:
        self.client = client
        self.layout = layout

    def num_shards(self) -> int:
        with _translated():
            try:
                raw, _ = self.client.get(self.layout.config)
            except NoNodeError:
                raise FailedPrecondition(
                    f"no timeshard cluster at {self.layout.root}: no node has joined it yet"
                ) from None
        value = decode(raw).get("num_shards")
        if not isinstance(value, int):
            raise FailedPrecondition(f"{self.layout.config} holds no shard count")
        return value

    def view(self) -> ClusterView:
        num_shards = self.num_shards()
        with _translated():
            members = {
                node: str(decode(raw).get("address", ""))
                for node in self._children(self.layout.members)
                if (raw := self._get(self.layout.member(node))) is not None
            }
            owners = {
                s: str(decode(raw).get("node_id", ""))
                for s in shard_names(self._children(self.layout.owners))
                if (raw := self._get(self.layout.owner(s))) is not None
            }
            moves = {
                s: str(decode(raw).get("to", ""))
                for s in shard_names(self._children(self.layout.moves))
                if (raw := self._get(self.layout.move(s))) is not None
            }
            draining = frozenset(self._children(self.layout.draining))
        return ClusterView(
            num_shards=num_shards, members=members, owners=owners, draining=draining, moves=moves
        )

    def move(self, shard: int, node_id: str) -> ClusterView:
        """Pin ``shard`` on live node ``node_id``; returns the view before the move."""
        if not node_id:
            raise InvalidArgument("to_node", "name the node to move the shard to")
        view = self.view()
        if not 0 <= shard < view.num_shards:
            raise InvalidArgument("shard", f"{shard} is not in 0-{view.num_shards - 1}")
        if node_id not in view.members:
            raise NotFound("node", node_id)
        if node_id in view.draining:
            raise FailedPrecondition(f"node {node_id!r} is draining; undrain it first")
        self._put(self.layout.move(shard), encode({"to": node_id}))
        return view

    def clear_moves(self) -> list[int]:
        """Drop every pin: shards go back to the even computed assignment."""
        with _translated():
            cleared = sorted(shard_names(self._children(self.layout.moves)))
            for s in cleared:
                with contextlib.suppress(NoNodeError):
                    self.client.delete(self.layout.move(s))
        return cleared

    def drain(self, node_id: str) -> list[int]:
        """Mark ``node_id`` draining; returns the shards it owned (they move away)."""
        if not node_id:
            raise InvalidArgument("node_id", "name the node to drain")
        view = self.view()
        if node_id not in view.members:
            raise NotFound("node", node_id)
        if len(set(view.members) - view.draining - {node_id}) == 0:
            raise FailedPrecondition(f"node {node_id!r} is the last node not draining")
        self._put(self.layout.drain(node_id), encode({}))
        with _translated():
            for s, pinned in view.moves.items():  # a pin would keep shards on it
                if pinned == node_id:
                    with contextlib.suppress(NoNodeError):
                        self.client.delete(self.layout.move(s))
        return sorted(s for s, owner in view.owners.items() if owner == node_id)

    def undrain(self, node_id: str) -> bool:
        """Let ``node_id`` own shards again; False if it was not draining."""
        with _translated():
            try:
                self.client.delete(self.layout.drain(node_id))
            except NoNodeError:
                return False
        return True

    def wait_settled(self, timeout_s: float) -> ClusterView:
        """Wait until every shard is owned by the node the assignment names."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.view()
            pending = view.pending()
            if not pending:
                return view
            if time.monotonic() > deadline:
                some = list(pending.items())[:5]
                raise Unavailable(
                    f"{len(pending)} shard(s) still moving after {timeout_s:g} s, e.g. "
                    + ", ".join(f"{s}: {a or '-'} -> {b}" for s, (a, b) in some)
                )
            time.sleep(0.1)

    def _children(self, path: str) -> list[str]:
        try:
            children: list[str] = self.client.get_children(path)
        except NoNodeError:
            return []
        return children

    def _get(self, path: str) -> bytes | None:
        try:
            raw, _ = self.client.get(path)
        except NoNodeError:
            return None
        return bytes(raw)

    def _put(self, path: str, value: bytes) -> None:
        with _translated():
            try:
                self.client.create(path, value, makepath=True)
            except NodeExistsError:
                self.client.set(path, value)


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except KazooTimeoutError as exc:
        raise CoordinatorUnavailable(f"timed out ({exc})") from exc
    except KazooException as exc:
        raise CoordinatorUnavailable(f"{type(exc).__name__} {exc}".strip()) from exc


@contextlib.contextmanager
def connect(url: str) -> Iterator[ShardAdmin]:
    """A ``ShardAdmin`` on its own short-lived ZooKeeper session."""
    config = parse_url(url)
    client = config.client()
    try:
        client.start(timeout=config.connect_timeout_s)
    except KazooTimeoutError:
        client.close()
        raise CoordinatorUnavailable(
            f"no answer from {config.hosts} within {config.connect_timeout_s:g} s"
        ) from None
    try:
        yield ShardAdmin(client, Layout(config.path))
    finally:
        client.stop()
        client.close()
