"""Unit-test helpers: a node on the fake clock and the embedded store, moved on by the test
(waiting on a condition with a deadline is ``timeshard.testing.waits.wait_until``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from timeshard.clock import Clock, FakeClock, SystemClock
from timeshard.coordinator.base import Coordinator, Member, ShardsChanged
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import BucketEntry, Job
from timeshard.node import Node, NodeConfig, TypePolicy
from timeshard.node.dispatcher import DispatchConfig
from timeshard.server import Server
from timeshard.sharding import minute_of
from timeshard.store.base import Store
from timeshard.store.sqlite import SqliteStore

START_MS = 1_800_000_000_000  # a minute boundary: 2027-01-15T08:00:00Z


async def stopped_with_time_running(clock: FakeClock, stop: Awaitable[None]) -> None:
    """Await ``stop`` (a node's or server's) while the fake clock keeps moving: a part of the
    stop that sleeps on the node's clock must not wait for ever on a clock the test no longer
    advances. After 60 s, print what every task of the loop waits for, and fail."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            clock.advance(0.05)

    ticker = asyncio.create_task(tick(), name="fake-clock-during-stop")
    try:
        await asyncio.wait_for(stop, 60)
    except TimeoutError:
        print_tasks()
        raise
    finally:
        ticker.cancel()


def print_tasks(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """What each task of ``loop`` (the running one by default) waits for, a line each, on
    stderr: for a test that timed out waiting on a node."""
    for task in asyncio.all_tasks(loop):
        frames: list[str] = []
        coro: Any = task.get_coro()
        while coro is not None and len(frames) < 20:  # the chain of awaits, outermost first
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is None:
                frames.append(type(coro).__name__)
                break
            frames.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        print(f"{task.get_name()}: {' -> '.join(frames)}", file=sys.stderr)


async def settle(node: Node) -> None:
    """Let every dispatcher finish reacting to the current (fake) time: a store round trip
    through the single writer thread, twice, orders us after anything they queued."""
    for _ in range(3):
        await node.store.get_shard(0)
        await asyncio.sleep(0.002)


async def advance(node: Node, clock: FakeClock, seconds: float, step: float = 0.5) -> None:
    """Move the fake clock in steps, letting the node react after each."""
    remaining = seconds
    while remaining > 1e-9:
        d = min(step, remaining)
        clock.advance(d)
        remaining -= d
        await settle(node)


def make_node(
    path: Path | str = ":memory:",
    clock: FakeClock | None = None,
    shards: int = 4,
    types: dict[str, TypePolicy] | None = None,
    **cfg: object,
) -> tuple[Node, FakeClock]:
    clock = clock or FakeClock(START_MS)
    config = NodeConfig(dispatch=DispatchConfig(**cfg), types=types or {})  # type: ignore[arg-type]
    node = Node(
        store=SqliteStore(path, num_shards=shards),
        coordinator=LocalCoordinator(),
        clock=clock,
        config=config,
        node_id="test-node",
    )
    return node, clock


@asynccontextmanager
async def running(
    path: Path | str = ":memory:",
    clock: FakeClock | None = None,
    types: dict[str, TypePolicy] | None = None,
    **cfg: object,
) -> AsyncIterator[tuple[Node, FakeClock]]:
    node, clock = make_node(path, clock, types=types, **cfg)
    await node.start()
    try:
        yield node, clock
    finally:
        await node.stop()


@asynccontextmanager
async def node_with(
    store: Store | None = None, **config: object
) -> AsyncIterator[tuple[Node, FakeClock]]:
    """A started node on the fake clock (at ``START_MS``) and ``store`` (else a fresh embedded
    store in memory, 4 shards); ``config`` are ``NodeConfig`` fields (``types``, ``max_ready``),
    the dispatch config the default (``running`` instead takes ``DispatchConfig`` fields)."""
    clock = FakeClock(START_MS)
    node = Node(
        store=store or SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=clock,
        config=NodeConfig(dispatch=DispatchConfig(), **config),  # type: ignore[arg-type]
        node_id="test-node",
    )
    await node.start()
    try:
        yield node, clock
    finally:
        await node.stop()


LEASE_S = 5
"""The lease ``claim_one`` takes."""


async def claim_one(node: Node, clock: FakeClock, worker: str = "w1") -> tuple[str, int]:
    """Half a second on, ``worker`` claims the one due job of type ``t``: its id and fence."""
    await advance(node, clock, 0.5)
    (c,) = await node.claims.claim(worker=worker, types=["t"], limit=1, wait_s=0, lease_s=LEASE_S)
    return c.job.job_id, c.job.fence


async def all_entries(node: Node, job: Job) -> list[BucketEntry]:
    """Every bucket entry of ``job`` in its shard from its cursor on (test-only full scan)."""
    state = await node.store.get_shard(job.shard)
    out: list[BucketEntry] = []
    now_minute = minute_of(node.clock.now_ms())
    for minute in range(state.cursor, now_minute + 60):
        page = await node.store.read_bucket(job.shard, minute, due_from=0, due_to=2**62)
        out.extend(e for e in page if e.job_id == job.job_id)
    return out


class FixedCoordinator(Coordinator):
    """Owns the given shards for ever (not the embedded coordinator: the node re-reads as a
    node of a cluster does)."""

    def __init__(self, shards: Iterable[int]) -> None:
        self._owned = frozenset(shards)

    async def start(self, me: Member, num_shards: int, on_change: ShardsChanged) -> None:
        await on_change(self._owned, frozenset())

    async def stop(self) -> None:
        pass

    def owned(self) -> frozenset[int]:
        return self._owned

    async def members(self) -> list[Member]:
        return []

    async def owners(self) -> dict[int, str]:
        return {}


@asynccontextmanager
async def owner_and_writer(
    db: Path,
    clock: FakeClock,
    writer_store: Store,
    writer_clock: Clock | None = None,
    owner_store: Store | None = None,
) -> AsyncIterator[tuple[Node, Node]]:
    """Two nodes on one SQLite file: ``a`` owns every shard and re-reads like a node of a
    cluster (through ``owner_store`` if given); ``b`` owns none and writes through
    ``writer_store`` (on ``writer_clock``)."""
    config = NodeConfig(dispatch=DispatchConfig(lookahead_s=5, refresh_s=1, reread_s=5))
    a = Node(
        store=owner_store or SqliteStore(db, num_shards=4),
        coordinator=FixedCoordinator(range(4)),
        clock=clock,
        config=config,
        node_id="a",
    )
    b = Node(
        store=writer_store,
        coordinator=FixedCoordinator(()),
        clock=writer_clock or clock,
        config=config,
        node_id="b",
    )
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await b.stop()
        await a.stop()


@asynccontextmanager
async def embedded_server(node_id: str | None = None) -> AsyncIterator[Server]:
    """A real gRPC server (``server.node`` its node) on the in-memory embedded store and the
    system clock, on a free port; stopped at the end."""
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        node_id=node_id,
    )
    server = Server(node, port=0)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)
