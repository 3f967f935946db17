"""The ZooKeeper coordinator (kazoo): nodes register ephemerally, each shard has one owner.

How ownership works (the znodes are described in ``zkstate.py``):

- A node registers ``members/<node_id>`` on its session and computes, like every other node,
  the assignment of shards to the sorted live members (``assignment.assign``).
- It takes a shard assigned to it only when the shard has no owner znode: it creates the
  ephemeral ``owners/<shard>`` first, then reports the gain (the node takes the shard's epoch in
  the store, invariant 7). It releases a shard no longer assigned to it by reporting the loss
  first (the dispatcher stops), then deleting the owner znode; the new owner's watch fires.
- When an owner's session dies, ZooKeeper deletes its znodes and the node assigned the shard in
  the new membership takes it.
- When this node's connection is SUSPENDED or LOST it reports the loss of every shard at once:
  kazoo declares SUSPENDED after 2/3 of the session timeout without an answer, before the server
  expires the session and another node may take over. On reconnection with the same session it
  takes its shards back (a new epoch); with a new session it registers again.

kazoo calls back on its own threads; every callback only hands an event to the event loop
(``call_soon_threadsafe``), and one task, ``zookeeper-coordinator``, does all the work, so the
``on_change`` calls are serialized.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from timeshard.coordinator.assignment import assign
from timeshard.coordinator.base import Coordinator, Member, ShardsChanged, ShardsNotTaken
from timeshard.coordinator.kazoo_bridge import ConnectionDropped, LoopBridge
from timeshard.coordinator.zkstate import (
    PARENT_ACL,
    CoordinatorUnavailable,
    Layout,
    ShardAdmin,
    ZooKeeperConfig,
    decode,
    encode,
    open_acl_warning,
    parse_url,
    shard_names,
    validate_node_id,
)
from timeshard.errors import FailedPrecondition, TimeshardError

log = logging.getLogger(__name__)
T = TypeVar("T")

RESYNC_S = 10.0
"""Re-read the cluster this often even without a watch firing (a safety net)."""
DEBOUNCE_S = 0.02
"""Gather the burst of watch events one change causes into one pass."""
RETRY_S = 1.0
"""After a failed pass (ZooKeeper or store error), try again this soon."""
RELEARN_S = 1.0
"""After a call to a peer failed (``forget_peer``), read the members' addresses this soon."""
JOIN_POLL_S = 0.1
"""While joining, look this often whether a dropped connection came back."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Cluster:
    """What one pass reads: live members, draining marks, pins, and the shards with an owner."""

    members: frozenset[str]
    draining: frozenset[str]
    moves: dict[int, str]
    owned: frozenset[int]


class ZooKeeperCoordinator(Coordinator):
    def __init__(self, config: ZooKeeperConfig) -> None:
        self.config = config
        self.layout = Layout(config.path)
        self._client: KazooClient | None = None
        self._bridge: LoopBridge | None = None
        self._me = Member(node_id="", address="")
        self._num_shards = 0
        self._on_change: ShardsChanged | None = None
        self._owned: frozenset[int] = frozenset()  # reported to on_change as gained
        self._held: set[int] = set()  # owner znodes that may exist under our session
        self._session: int | None = None  # the session our member znode belongs to
        self._connected = False
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._assigned: dict[int, str] = {}  # shard -> node id, by the last pass
        self._addresses: dict[str, str] = {}  # node id -> address, of the live members

    @classmethod
    def from_url(cls, url: str) -> ZooKeeperCoordinator:
        return cls(parse_url(url))

    # -- the contract ---------------------------------------------------------------------

    async def start(self, me: Member, num_shards: int, on_change: ShardsChanged) -> None:
        validate_node_id(me.node_id)
        self._me, self._num_shards, self._on_change = me, num_shards, on_change
        loop = asyncio.get_running_loop()
        self._bridge = LoopBridge(loop)
        client = self.config.client()
        client.add_listener(self._state_listener)
        self._client = client
        try:
            await loop.run_in_executor(None, client.start, self.config.connect_timeout_s)
        except (KazooTimeoutError, KazooException) as exc:
            await self._close_client()
            raise CoordinatorUnavailable(
                f"no session with {self.config.hosts} within "
                f"{self.config.connect_timeout_s:g} s ({type(exc).__name__})"
            ) from None
        self._set_connected(True)
        try:
            await self._joining(self._prepare)
            # The server may grant a longer session than asked (2-20 of its ticks): be patient.
            register_wait_s = 3 * self.config.session_timeout_s + 10
            await self._joining(lambda: self._register(wait_s=register_wait_s))
            await self._joining(self._reconcile)
        except BaseException:
            await self._close_client()
            raise
        self._task = asyncio.create_task(self._run(), name="zookeeper-coordinator")
        log.info(
            "node %s joined %s%s (session timeout %gs); owns %d shard(s)",
            me.node_id,
            self.config.hosts,
            self.config.path,
            self.config.session_timeout_s,
            len(self._owned),
        )

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                async with asyncio.timeout(10.0):
                    await asyncio.shield(self._task)
            except TimeoutError:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._lose(self._owned)
        await self._close_client()  # closing the session deletes our znodes at once

    def owned(self) -> frozenset[int]:
        return self._owned

    @property
    def connected(self) -> bool:
        """False while the session is suspended or lost (kazoo's state), or before joining."""
        return self._connected and self._client is not None

    async def members(self) -> list[Member]:
        names = await self._read(lambda c: c.get_children_async(self.layout.members))
        raws = await asyncio.gather(*(self._data(self.layout.member(n)) for n in names))
        return [
            Member(node_id=n, address=str(decode(raw).get("address", "")))
            for n, raw in sorted(zip(names, raws, strict=True))
            if raw is not None
        ]

    async def owners(self) -> dict[int, str]:
        names = await self._read(lambda c: c.get_children_async(self.layout.owners))
        shards = sorted(shard_names(names))
        raws = await asyncio.gather(*(self._data(self.layout.owner(s)) for s in shards))
        return {
            s: str(decode(raw).get("node_id", ""))
            for s, raw in zip(shards, raws, strict=True)
            if raw is not None
        }

    async def move_shard(self, shard: int, to_node: str) -> None:
        await self._admin(lambda admin: admin.move(shard, to_node))

    async def drain_node(self, node_id: str) -> list[int]:
        return await self._admin(lambda admin: admin.drain(node_id))

    # -- kazoo's threads -> the event loop --------------------------------------------------

    @property
    def bridge(self) -> LoopBridge:
        if self._bridge is None:
            raise CoordinatorUnavailable("this node has not joined the cluster")
        return self._bridge

    def _state_listener(self, state: str) -> None:
        """kazoo's connection thread; must not block."""
        self.bridge.call_soon(self._set_connected, state == KazooState.CONNECTED)

    def _watch(self, event: Any) -> None:
        """kazoo's callback thread; one watch function for every path (kazoo keeps a set per
        path, so setting it again on each pass does not pile up)."""
        self.bridge.call_soon(self._wake.set)

    def _set_connected(self, connected: bool) -> None:
        if connected != self._connected:
            log.log(
                logging.INFO if connected else logging.WARNING,
                "node %s: ZooKeeper connection %s",
                self._me.node_id,
                "up" if connected else "suspended or lost: releasing every shard",
            )
        self._connected = connected
        if connected:
            self.bridge.dropped.clear()
        else:
            self.bridge.dropped.set()
        self._wake.set()

    async def _zk(self, request: Any) -> Any:
        return await self.bridge.result(request)

    async def _read(self, call: Any) -> Any:
        """One request for the contract's read methods: errors become ``CoordinatorUnavailable``."""
        if self._client is None:
            raise CoordinatorUnavailable("this node has not joined the cluster")
        try:
            return await self._zk(call(self._client))
        except ConnectionDropped:
            raise CoordinatorUnavailable("the connection dropped") from None
        except KazooException as exc:
            raise CoordinatorUnavailable(f"{type(exc).__name__} {exc}".strip()) from exc

    async def _data(self, path: str) -> bytes | None:
        try:
            raw, _ = await self._read(lambda c: c.get_async(path))
        except CoordinatorUnavailable as exc:
            if isinstance(exc.__cause__, NoNodeError):
                return None
            raise
        return bytes(raw)

    async def _admin(self, op: Callable[[ShardAdmin], T]) -> T:
        """Run a blocking ``ShardAdmin`` operation on our client in an executor thread."""
        if self._client is None:
            raise CoordinatorUnavailable("this node has not joined the cluster")
        admin = ShardAdmin(self._client, self.layout)
        return await asyncio.get_running_loop().run_in_executor(None, op, admin)

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        client.remove_listener(self._state_listener)
        loop = asyncio.get_running_loop()

        def close() -> None:
            client.stop()
            client.close()

        await loop.run_in_executor(None, close)
        self._connected = False
        self.bridge.dropped.set()

    # -- joining --------------------------------------------------------------------------

    @property
    def _kazoo(self) -> KazooClient:
        if self._client is None:
            raise ConnectionDropped()
        return self._client

    def _session_id(self) -> int | None:
        client_id = self._client.client_id if self._client is not None else None
        return int(client_id[0]) if client_id else None

    async def _joining(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run one step of joining, again after the connection comes back: a node started
        while its ZooKeeper server is busy (a leader election, a pause) waits through a drop
        instead of exiting. Each step is safe to repeat. Gives up with
        ``CoordinatorUnavailable`` when no connection returns within the connect timeout."""
        while True:
            try:
                await step()
                return
            except (
                ConnectionDropped,
                ConnectionLoss,
                OperationTimeoutError,
                SessionExpiredError,
            ) as exc:
                log.info(
                    "node %s: ZooKeeper connection dropped while joining (%s); waiting for it",
                    self._me.node_id,
                    type(exc).__name__,
                )
            deadline = time.monotonic() + self.config.connect_timeout_s
            while not self._connected or self._session_id() is None:
                if time.monotonic() >= deadline:
                    raise CoordinatorUnavailable(
                        f"the connection to {self.config.hosts} dropped while joining and did "
                        f"not come back within {self.config.connect_timeout_s:g} s"
                    )
                await asyncio.sleep(JOIN_POLL_S)

    async def _prepare(self) -> None:
        """Create the layout (with the configured ACL), and record or check the cluster's
        shard count."""
        parent = self.layout.root.rsplit("/", 1)[0]
        if parent:
            await self._zk(self._kazoo.ensure_path_async(parent, acl=PARENT_ACL))
        for path in self.layout.folders:
            await self._zk(self._kazoo.ensure_path_async(path))
        if self.config.acl:
            acls, _ = await self._zk(self._kazoo.get_acls_async(self.layout.root))
            warning = open_acl_warning(acls, self.layout.root)
            if warning:
                log.warning("%s", warning)
        config = encode({"num_shards": self._num_shards})
        try:
            await self._zk(self._kazoo.create_async(self.layout.config, config))
        except NodeExistsError:
            raw, _ = await self._zk(self._kazoo.get_async(self.layout.config))
            found = decode(raw).get("num_shards")
            if found != self._num_shards:
                raise FailedPrecondition(
                    f"the cluster at {self.config.path} has {found} shards; this node was "
                    f"started with {self._num_shards} (--shards must match the cluster)"
                ) from None

    async def _register(self, *, wait_s: float = 0.0) -> None:
        """Create our member znode. A znode of the same node id left by an earlier session
        (a restart after a crash) expires within the session timeout: wait up to ``wait_s``."""
        path = self.layout.member(self._me.node_id)
        data = encode({"node_id": self._me.node_id, "address": self._me.address})
        deadline = time.monotonic() + wait_s
        while True:
            session = self._session_id()
            try:
                await self._zk(self._kazoo.create_async(path, data, ephemeral=True))
                break
            except NodeExistsError:
                stat = await self._zk(self._kazoo.exists_async(path))
                if stat is not None and stat.ephemeralOwner == session:
                    break  # ours: created by a request whose answer was lost
                if stat is not None and time.monotonic() >= deadline:
                    raise FailedPrecondition(
                        f"node id {self._me.node_id!r} is already registered by another live "
                        "session; give each node its own --node-id"
                    ) from None
                await asyncio.sleep(0.2)
        self._session = session
        self._held.clear()

    # -- the loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._next_wake()
            if self._stopping:
                return
            try:
                await self._reconcile()
            except ConnectionDropped:
                pass  # woken by the state change: the next pass reports the loss
            except (KazooException, TimeshardError) as exc:
                log.warning(
                    "node %s: coordination pass failed (%s: %s); retrying",
                    self._me.node_id,
                    type(exc).__name__,
                    exc,
                )
                self._wake_later(RETRY_S)
            except Exception:
                log.exception("node %s: coordination pass failed", self._me.node_id)
                self._wake_later(RETRY_S)

    async def _next_wake(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RESYNC_S):
                await self._wake.wait()
        if self._connected and not self._stopping:
            await asyncio.sleep(DEBOUNCE_S)
        self._wake.clear()

    def _wake_later(self, delay: float) -> None:
        self.bridge.loop.call_later(delay, self._wake.set)

    async def _reconcile(self) -> None:
        """One pass: bring this node's shards in line with the assignment."""
        if not self._connected or self._session_id() is None:
            await self._lose(self._owned)
            return
        if self._session_id() != self._session:
            # A new session: the znodes of the old one are gone, and maybe our shards with them.
            await self._lose(self._owned)
            self._session = None
            self._held.clear()
            await self._register()
        cluster = await self._read_cluster()
        assigned = assign(
            self._num_shards, cluster.members, draining=cluster.draining, moves=cluster.moves
        )
        await self._learn_addresses(cluster.members)
        self._assigned = assigned
        target = {s for s, node in assigned.items() if node == self._me.node_id}
        log.debug(
            "node %s: pass: members %s, draining %s, moves %s; target %s, held %s, owned %s",
            self._me.node_id,
            sorted(cluster.members),
            sorted(cluster.draining),
            cluster.moves,
            _brief(target),
            _brief(self._held),
            _brief(self._owned),
        )
        vanished = self._held - cluster.owned  # deleted under us (by an operator?)
        await self._lose(self._owned & vanished)
        self._held -= vanished
        await self._release(self._held - target)
        await self._adopt((target - self._held) & cluster.owned)
        idle = target & self._held - self._owned  # ours in ZooKeeper, not dispatching (after a
        free = sorted(target - self._held - cluster.owned)  # suspension), and those nobody holds
        claimed = await asyncio.gather(*(self._claim(s) for s in free))
        # All taken at once: a node that takes over a dead one's hundreds of shards must not
        # take its epochs one store round trip after another.
        await self._gain(idle | {s for s, ok in zip(free, claimed, strict=True) if ok})

    def peer_for(self, shard: int) -> Member | None:
        node = self._assigned.get(shard)
        if node is None or node == self._me.node_id or shard in self._owned:
            return None
        address = self._addresses.get(node)
        return Member(node_id=node, address=address) if address else None

    def forget_peer(self, node_id: str) -> None:
        # No hints to it until a pass has read its address again: one pass per failure at most.
        if self._addresses.pop(node_id, None) is not None:
            self._wake_later(RELEARN_S)

    async def _learn_addresses(self, members: frozenset[str]) -> None:
        """The addresses of the live members (``peer_for``): read once per member that
        (re)joined, forgotten when it leaves."""
        for gone in set(self._addresses) - members:
            del self._addresses[gone]
        for node in sorted(members - set(self._addresses) - {self._me.node_id}):
            try:
                raw, _ = await self._zk(self._kazoo.get_async(self.layout.member(node)))
            except NoNodeError:
                continue
            address = str(decode(raw).get("address", ""))
            if address:
                self._addresses[node] = address

    async def _read_cluster(self) -> _Cluster:
        zk, layout, watch = self._kazoo, self.layout, self._watch
        members, owners, moved, draining = await asyncio.gather(
            self._zk(zk.get_children_async(layout.members, watch)),
            self._zk(zk.get_children_async(layout.owners, watch)),
            self._zk(zk.get_children_async(layout.moves, watch)),
            self._zk(zk.get_children_async(layout.draining, watch)),
        )
        moves: dict[int, str] = {}
        for shard in sorted(shard_names(moved)):
            try:
                raw, _ = await self._zk(zk.get_async(layout.move(shard), watch))
            except NoNodeError:
                continue
            moves[shard] = str(decode(raw).get("to", ""))
        return _Cluster(
            members=frozenset(members),
            draining=frozenset(draining),
            moves=moves,
            owned=frozenset(shard_names(owners)),
        )

    async def _adopt(self, shards: set[int]) -> None:
        """Owner znodes of shards assigned to us that our own session created (a create whose
        answer was lost) are ours; the rest belong to owners still handing over."""
        session = self._session_id()
        order = sorted(shards)
        stats = await asyncio.gather(
            *(self._zk(self._kazoo.exists_async(self.layout.owner(s))) for s in order)
        )
        for shard, stat in zip(order, stats, strict=True):
            if stat is not None and stat.ephemeralOwner == session:
                self._held.add(shard)

    async def _claim(self, shard: int) -> bool:
        data = encode({"node_id": self._me.node_id})
        try:
            await self._zk(self._kazoo.create_async(self.layout.owner(shard), data, ephemeral=True))
        except NodeExistsError:
            return False  # someone else got there first; its release will wake us
        self._held.add(shard)
        return True

    async def _release(self, shards: set[int]) -> None:
        """Stop dispatching first, then let the new owner in."""
        if not shards:
            return
        await self._lose(self._owned & shards)
        await self._delete_owners(shards)
        log.info("node %s: released shard(s) %s", self._me.node_id, _brief(shards))

    async def _gain(self, shards: set[int]) -> None:
        if not shards:
            return
        if not self._connected or self._stopping:
            raise ConnectionDropped()  # end the pass: the next one sees why
        gained = frozenset(shards)
        try:
            await self._report(gained, frozenset())
            failed: dict[int, BaseException] = {}
        except ShardsNotTaken as exc:
            failed = {s: e for s, e in exc.failed.items() if s in gained}
        except Exception as exc:
            failed = dict.fromkeys(gained, exc)
        self._owned |= gained - failed.keys()
        if not failed:
            return
        # The node could not take them (its store is down?): give their znodes back and try
        # again on a later pass. on_change is told of the loss so nothing half-started keeps
        # running.
        first = min(failed)
        log.warning(
            "node %s: could not take shard(s) %s: %s",
            self._me.node_id,
            _brief(set(failed)),
            failed[first],
        )
        try:
            await self._report(frozenset(), frozenset(failed))
        except Exception:
            log.exception(
                "node %s: cleaning up shards %s failed", self._me.node_id, _brief(set(failed))
            )
        await self._delete_owners(set(failed))
        self._wake_later(RETRY_S)

    async def _delete_owners(self, shards: set[int]) -> None:
        """Give back our owner znodes of ``shards`` (all at once: ZooKeeper pipelines them)."""

        async def delete(shard: int) -> None:
            with contextlib.suppress(NoNodeError):
                await self._zk(self._kazoo.delete_async(self.layout.owner(shard)))
            self._held.discard(shard)

        await asyncio.gather(*(delete(s) for s in sorted(shards)))

    async def _lose(self, shards: frozenset[int] | set[int]) -> None:
        lost = frozenset(shards) & self._owned
        if not lost:
            return
        self._owned -= lost
        try:
            await self._report(frozenset(), lost)
        except Exception:
            log.exception("node %s: stopping shards %s failed", self._me.node_id, _brief(lost))

    async def _report(self, gained: frozenset[int], lost: frozenset[int]) -> None:
        assert self._on_change is not None
        await self._on_change(gained, lost)


def _brief(shards: frozenset[int] | set[int]) -> str:
    items = sorted(shards)
    return ", ".join(map(str, items[:12])) + (f" (+{len(items) - 12})" if len(items) > 12 else "")
