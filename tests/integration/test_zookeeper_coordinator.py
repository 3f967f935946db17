"""The ZooKeeper coordinator against a real ZooKeeper: even assignment, takeover when a session
dies, loss of every shard while the session is suspended, explicit moves and drains.

Every test records each node's ``on_change`` calls in a ``Ledger`` that fails the test if two
nodes ever own one shard at once or if one node's calls overlap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from timeshard.coordinator.base import Member, ShardsNotTaken
from timeshard.coordinator.zkstate import CoordinatorUnavailable, ShardAdmin, connect
from timeshard.coordinator.zookeeper import ZooKeeperCoordinator
from timeshard.errors import FailedPrecondition, InvalidArgument, NotFound
from timeshard.testing.services import TcpProxy
from timeshard.testing.waits import wait_until

pytestmark = pytest.mark.timeout(60)

SHARDS = 16


class Ledger:
    """Who owns what according to the ``on_change`` calls, checked at every call."""

    def __init__(self) -> None:
        self.owner: dict[int, str] = {}
        self.violations: list[str] = []
        self.busy: set[str] = set()
        self.deposed: set[str] = set()
        self.log: list[tuple[float, str, frozenset[int], frozenset[int]]] = []
        self.fail_next_take: dict[str, int] = {}

    def callback(self, node: str) -> Callable[[frozenset[int], frozenset[int]], Any]:
        async def on_change(gained: frozenset[int], lost: frozenset[int]) -> None:
            if node in self.busy:
                self.violations.append(f"{node}: on_change called while a call was running")
            self.busy.add(node)
            try:
                await asyncio.sleep(0)  # let a concurrent call show itself
                self.log.append((time.monotonic(), node, gained, lost))
                for s in lost:
                    if self.owner.get(s) == node:
                        del self.owner[s]
                failed: dict[int, BaseException] = {}
                for s in gained:
                    if self.fail_next_take.get(node, -1) == s:  # as a node does: the others
                        del self.fail_next_take[node]  # are taken, this one is named
                        failed[s] = RuntimeError(f"store down while taking shard {s}")
                        continue
                    if s in self.owner:
                        self.violations.append(f"{node} took {s} while {self.owner[s]} owns it")
                    self.owner[s] = node
                if failed:
                    raise ShardsNotTaken(failed)
            finally:
                self.busy.discard(node)

        return on_change

    def depose(self, node: str) -> None:
        """``node`` lost its session without hearing it (the store's epoch would fence it)."""
        self.deposed.add(node)
        self.owner = {s: n for s, n in self.owner.items() if n != node}

    def shards_of(self, node: str) -> set[int]:
        return {s for s, n in self.owner.items() if n == node}


class Cluster:
    def __init__(self, hosts: str, path: str, session_timeout: float = 2.0) -> None:
        self.hosts = hosts
        self.path = path
        self.session_timeout = session_timeout
        self.ledger = Ledger()
        self.nodes: dict[str, ZooKeeperCoordinator] = {}

    def url(self, hosts: str | None = None, session_timeout: float | None = None) -> str:
        timeout = session_timeout or self.session_timeout
        return f"zookeeper://{hosts or self.hosts}{self.path}?session_timeout={timeout}"

    async def add(
        self, node: str, *, hosts: str | None = None, shards: int = SHARDS, name: str = ""
    ) -> ZooKeeperCoordinator:
        """Start a coordinator for ``node``; ``name`` is its name in the ledger (default the
        node id)."""
        coordinator = ZooKeeperCoordinator.from_url(self.url(hosts))
        await coordinator.start(
            Member(node_id=node, address=f"addr-{node}"),
            shards,
            self.ledger.callback(name or node),
        )
        if not name:
            self.nodes[node] = coordinator
        return coordinator

    async def stop_all(self) -> None:
        for c in self.nodes.values():
            await c.stop()

    def even(self) -> bool:
        """Every shard owned, by a live node, evenly, and the coordinators agree."""
        live = [n for n, c in self.nodes.items() if c._client is not None]
        counts = [len(self.ledger.shards_of(n)) for n in live]
        return (
            len(self.ledger.owner) == SHARDS
            and set(self.ledger.owner.values()) <= set(live)
            and max(counts) - min(counts) <= 1
            and all(self.nodes[n].owned() == self.ledger.shards_of(n) for n in live)
        )

    def check(self) -> None:
        assert self.ledger.violations == []

    def admin(self) -> Any:
        return connect(self.url())


@asynccontextmanager
async def cluster(hosts: str, path: str, session_timeout: float = 2.0) -> AsyncIterator[Cluster]:
    c = Cluster(hosts, path, session_timeout)
    try:
        yield c
    finally:
        await c.stop_all()
    c.check()


async def test_three_nodes_spread_shards_evenly(zookeeper_hosts: str, zk_path: str) -> None:
    async with cluster(zookeeper_hosts, zk_path) as c:
        for node in ("a", "b", "c"):
            await c.add(node)
        await wait_until(c.even, 10, "an even spread over a, b, c")
        assert sorted(len(c.ledger.shards_of(n)) for n in "abc") == [5, 5, 6]
        owners = await c.nodes["a"].owners()
        assert owners == c.ledger.owner
        members = await c.nodes["b"].members()
        assert [(m.node_id, m.address) for m in members] == [
            ("a", "addr-a"),
            ("b", "addr-b"),
            ("c", "addr-c"),
        ]


async def test_a_joining_node_gets_its_share_without_overlap(
    zookeeper_hosts: str, zk_path: str
) -> None:
    async with cluster(zookeeper_hosts, zk_path) as c:
        await c.add("a")
        await wait_until(lambda: c.nodes["a"].owned() == set(range(SHARDS)), 5, "a owns all")
        await c.add("b")
        await wait_until(c.even, 10, "a and b to split the shards")
        await c.add("c")
        await wait_until(c.even, 10, "a, b and c to split the shards")
        c.check()


async def test_a_stopped_node_hands_its_shards_over(zookeeper_hosts: str, zk_path: str) -> None:
    async with cluster(zookeeper_hosts, zk_path) as c:
        for node in ("a", "b", "c"):
            await c.add(node)
        await wait_until(c.even, 10, "an even spread")
        had = c.ledger.shards_of("a")
        await c.nodes["a"].stop()
        assert c.nodes["a"].owned() == frozenset()
        await wait_until(c.even, 5, "b and c to take a's shards")
        assert had <= c.ledger.shards_of("b") | c.ledger.shards_of("c")


async def test_expired_session_shards_are_taken_by_others_then_rebalanced(
    zookeeper_hosts: str, zk_path: str
) -> None:
    async with cluster(zookeeper_hosts, zk_path) as c:
        for node in ("a", "b", "c"):
            await c.add(node)
        await wait_until(c.even, 10, "an even spread")
        had = c.ledger.shards_of("a")
        victim = c.nodes["a"]
        assert victim._client is not None
        session_id, password = victim._client.client_id
        # The classic way to expire a session: another client attaches to it and closes it.
        c.ledger.depose("a")
        thief = KazooClient(hosts=zookeeper_hosts, client_id=(session_id, password))
        await asyncio.get_running_loop().run_in_executor(None, thief.start, 10)
        await asyncio.get_running_loop().run_in_executor(None, thief.stop)
        thief.close()
        await wait_until(
            lambda: had <= c.ledger.shards_of("b") | c.ledger.shards_of("c"),
            5,
            "b and c to take the expired node's shards",
        )
        # a hears of the expiry, reports the loss, joins again on a new session and gets
        # its share back.
        await wait_until(lambda: victim.owned() and c.even(), 10, "a to rejoin with a new session")
        assert victim._client is not None
        assert victim._client.client_id[0] != session_id


async def test_partition_stops_the_owner_before_others_take_over(
    zookeeper_hosts: str, zk_path: str
) -> None:
    proxy = TcpProxy(_first(zookeeper_hosts))
    try:
        async with cluster(zookeeper_hosts, zk_path) as c:
            await c.add("a", hosts=proxy.address)
            await c.add("b")
            await c.add("c")
            await wait_until(c.even, 10, "an even spread")
            had = c.ledger.shards_of("a")
            blocked_at = time.monotonic()
            proxy.block()
            await wait_until(
                lambda: not c.nodes["a"].owned(), 5, "a to report the loss of all shards"
            )
            lost_at = time.monotonic()
            await wait_until(
                lambda: had <= c.ledger.shards_of("b") | c.ledger.shards_of("c"),
                10,
                "b and c to take a's shards after its session expired",
            )
            # The ledger proves the order (a let go before anyone took over); the times say
            # why: a gives up after 2/3 of the session timeout, the server expires it after 1.
            assert lost_at - blocked_at < c.session_timeout
            proxy.unblock()
            await wait_until(lambda: c.nodes["a"].owned() and c.even(), 15, "a to rejoin")
    finally:
        proxy.close()


async def test_a_short_suspension_gives_the_shards_back_to_the_same_session(
    zookeeper_hosts: str, zk_path: str
) -> None:
    proxy = TcpProxy(_first(zookeeper_hosts))
    try:
        async with cluster(zookeeper_hosts, zk_path, session_timeout=4.0) as c:
            await c.add("a", hosts=proxy.address)
            await c.add("b")
            await wait_until(c.even, 10, "an even spread")
            had = c.ledger.shards_of("a")
            victim = c.nodes["a"]
            assert victim._client is not None
            session_id = victim._client.client_id[0]
            proxy.block()
            # owned() drops first, then on_change reports the loss: wait for both (the node
            # must not count a shard as its own while it is stopping it).
            await wait_until(
                lambda: not victim.owned() and not c.ledger.shards_of("a"),
                6,
                "a to report the loss while suspended",
            )
            proxy.unblock()  # before the server expires the session
            await wait_until(lambda: victim.owned() == had, 5, "a to take its shards back")
            assert victim._client.client_id[0] == session_id
            assert c.ledger.shards_of("b").isdisjoint(had), "b must not have taken a's shards"
    finally:
        proxy.close()


async def test_move_and_drain(zookeeper_hosts: str, zk_path: str) -> None:
    async with cluster(zookeeper_hosts, zk_path) as c:
        for node in ("a", "b", "c"):
            await c.add(node)
        await wait_until(c.even, 10, "an even spread")
        shard = min(c.ledger.shards_of("a"))
        with c.admin() as admin:
            admin.move(shard, "b")
            await wait_until(lambda: c.ledger.owner.get(shard) == "b", 5, "the move to b")
            view = await asyncio.to_thread(
                admin.wait_settled, 5
            )  # the pin counts in b's share: others shift too
            assert view.moves == {shard: "b"} and view.owners[shard] == "b"
            assert sorted(len(c.ledger.shards_of(n)) for n in "abc") == [5, 5, 6]

            with pytest.raises(NotFound):
                admin.move(shard, "nobody")
            with pytest.raises(InvalidArgument):
                admin.move(SHARDS, "b")
            with pytest.raises(NotFound):
                admin.drain("nobody")

            assert admin.clear_moves() == [shard]
            assert (await asyncio.to_thread(admin.wait_settled, 5)).moves == {}

            had = c.ledger.shards_of("a")
            moved = admin.drain("a")
            assert set(moved) == had
            await wait_until(
                lambda: not c.ledger.shards_of("a") and len(c.ledger.owner) == SHARDS,
                5,
                "a to be drained",
            )
            assert sorted(len(c.ledger.shards_of(n)) for n in "bc") == [8, 8]
            with pytest.raises(FailedPrecondition, match="draining"):
                admin.move(shard, "a")

            admin.move(shard, "b")
            admin.drain("b")  # drops the pin to b too
            assert admin.view().moves == {}
            with pytest.raises(FailedPrecondition, match="last node"):
                admin.drain("c")
            await wait_until(lambda: len(c.ledger.shards_of("c")) == SHARDS, 5, "c to own all")

            assert admin.undrain("a") and admin.undrain("b")
            assert not admin.undrain("a")
            await asyncio.to_thread(admin.wait_settled, 10)
            await wait_until(c.even, 5, "the even spread to come back")


async def test_move_and_drain_through_the_coordinator(zookeeper_hosts: str, zk_path: str) -> None:
    """What the AdminService MoveShard/DrainNode RPCs call."""
    async with cluster(zookeeper_hosts, zk_path) as c:
        for node in ("a", "b"):
            await c.add(node)
        await wait_until(c.even, 10, "an even spread")
        shard = min(c.ledger.shards_of("a"))
        await c.nodes["a"].move_shard(shard, "b")
        await wait_until(lambda: c.ledger.owner.get(shard) == "b", 5, "the move")
        moved = await c.nodes["b"].drain_node("a")
        assert moved and set(moved) <= set(range(SHARDS))
        await wait_until(lambda: len(c.ledger.shards_of("b")) == SHARDS, 5, "b to own every shard")


async def test_a_failed_take_is_given_back_and_retried(zookeeper_hosts: str, zk_path: str) -> None:
    async with cluster(zookeeper_hosts, zk_path) as c:
        c.ledger.fail_next_take["a"] = 3
        await c.add("a")
        assert c.nodes["a"].owned() == set(range(SHARDS)) - {3}  # the others are kept
        await wait_until(lambda: c.nodes["a"].owned() == set(range(SHARDS)), 5, "the retry of 3")
        assert c.ledger.shards_of("a") == set(range(SHARDS))
        c.check()


async def test_a_node_takes_the_shards_it_gains_in_one_call(
    zookeeper_hosts: str, zk_path: str
) -> None:
    """Not one store round trip after another: a node taking over hundreds of shards of a
    dead one would take seconds or minutes to dispatch the last of them."""
    async with cluster(zookeeper_hosts, zk_path) as c:
        await c.add("a")
        assert c.nodes["a"].owned() == set(range(SHARDS))
        [(_, node, gained, lost)] = c.ledger.log
        assert (node, gained, lost) == ("a", frozenset(range(SHARDS)), frozenset())
        c.check()


async def test_a_node_with_another_shard_count_is_refused(
    zookeeper_hosts: str, zk_path: str
) -> None:
    async with cluster(zookeeper_hosts, zk_path) as c:
        await c.add("a")
        with pytest.raises(FailedPrecondition, match="has 16 shards"):
            await c.add("b", shards=32)


async def test_a_second_node_with_the_same_id_is_refused(
    zookeeper_hosts: str, zk_path: str
) -> None:
    async with cluster(zookeeper_hosts, zk_path, session_timeout=1.0) as c:
        await c.add("a")
        other = ZooKeeperCoordinator.from_url(c.url())
        with pytest.raises(FailedPrecondition, match="already registered"):
            await other.start(Member(node_id="a", address="x"), SHARDS, c.ledger.callback("a2"))


async def test_a_restarted_node_waits_for_its_old_session_to_expire(
    zookeeper_hosts: str, zk_path: str
) -> None:
    proxy = TcpProxy(_first(zookeeper_hosts))
    try:
        async with cluster(zookeeper_hosts, zk_path, session_timeout=1.0) as c:
            old = await c.add("a", hosts=proxy.address, name="old-a")
            proxy.block()  # the old process "died": its session lingers until it expires
            c.ledger.depose("old-a")
            await c.add("a")  # waits, then registers
            await wait_until(lambda: c.nodes["a"].owned() == set(range(SHARDS)), 5, "the new a")
            proxy.unblock()
            await old.stop()
    finally:
        proxy.close()


def _first(hosts: str) -> tuple[str, int]:
    host, port = hosts.split(",")[0].split(":")
    return host, int(port)


_ = ShardAdmin  # re-exported for readers: the admin API these tests drive


async def test_a_user_in_the_url_protects_the_znodes(zookeeper_hosts: str, zk_path: str) -> None:
    url = f"zookeeper://ops:s3cret@{zookeeper_hosts}{zk_path}?session_timeout=2"
    ledger = Ledger()
    coordinator = ZooKeeperCoordinator.from_url(url)
    await coordinator.start(Member(node_id="a", address="x"), SHARDS, ledger.callback("a"))
    try:
        assert coordinator.owned() == set(range(SHARDS))
        stranger = KazooClient(hosts=zookeeper_hosts)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, stranger.start, 10)
        try:
            with pytest.raises(NoAuthError):
                stranger.get_children(f"{zk_path}/members")
        finally:
            await loop.run_in_executor(None, stranger.stop)
            stranger.close()
        with connect(url) as admin:  # the same user may
            assert set(admin.view().members) == {"a"}
    finally:
        await coordinator.stop()


class DropsWhileJoining(ZooKeeperCoordinator):
    """Partitions its own connection (through ``proxy``) just as it starts creating the
    layout, and heals it ``heal_after_s`` later."""

    proxy: TcpProxy
    heal_after_s: float

    async def _prepare(self) -> None:
        if not getattr(self, "dropped_once", False):
            self.dropped_once = True
            self.proxy.block()
            asyncio.get_running_loop().call_later(self.heal_after_s, self.proxy.unblock)
        await super()._prepare()


async def test_a_connection_that_drops_while_joining_is_waited_for(
    zookeeper_hosts: str, zk_path: str
) -> None:
    proxy = TcpProxy(_first(zookeeper_hosts))
    ledger = Ledger()
    url = f"zookeeper://{proxy.address}{zk_path}?session_timeout=4"
    coordinator = DropsWhileJoining.from_url(url)
    assert isinstance(coordinator, DropsWhileJoining)
    coordinator.proxy, coordinator.heal_after_s = proxy, 3.5
    try:
        await coordinator.start(Member(node_id="a", address="addr-a"), SHARDS, ledger.callback("a"))
        try:
            assert coordinator.dropped_once
            assert coordinator.owned() == set(range(SHARDS))
            assert ledger.shards_of("a") == set(range(SHARDS))
        finally:
            await coordinator.stop()
    finally:
        proxy.close()
    assert ledger.violations == []


async def test_a_connection_that_never_comes_back_while_joining_is_a_clear_error(
    zookeeper_hosts: str, zk_path: str
) -> None:
    proxy = TcpProxy(_first(zookeeper_hosts))
    url = f"zookeeper://{proxy.address}{zk_path}?session_timeout=4&connect_timeout=3"
    coordinator = DropsWhileJoining.from_url(url)
    assert isinstance(coordinator, DropsWhileJoining)
    coordinator.proxy, coordinator.heal_after_s = proxy, 60.0
    try:
        with pytest.raises(CoordinatorUnavailable, match="did not come back within 3 s"):
            await coordinator.start(
                Member(node_id="a", address="addr-a"), SHARDS, Ledger().callback("a")
            )
        assert coordinator._client is None
    finally:
        proxy.close()
