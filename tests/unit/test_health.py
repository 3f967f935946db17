"""Health that tells the truth: gRPC health is NOT_SERVING while the store does not answer or
the coordinator's session is lost, and SERVING again when they are back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.unit.helpers import START_MS, stopped_with_time_running
from tests.unit.test_metrics import scrape
from timeshard.clock import FakeClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import StoreUnavailable
from timeshard.model import ShardState
from timeshard.node import Node
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.views.health import HealthConfig, HealthWatcher
from timeshard.views.http import serve_node

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class StoppableStore(SqliteStore):
    """The embedded store with a switch: stopped, every call fails as an unreachable store
    does (``StoreUnavailable``); hung, calls never answer."""

    stopped = False
    hung = False

    async def get_shard(self, shard: int) -> ShardState:
        if self.hung:
            await asyncio.Event().wait()
        if self.stopped:
            raise StoreUnavailable("connection refused (stopped by the test)")
        return await super().get_shard(shard)


class SessionCoordinator(LocalCoordinator):
    """The local coordinator with a session that a test can lose."""

    live = True

    @property
    def connected(self) -> bool:
        return self.live


@asynccontextmanager
async def serving(
    store: SqliteStore, coordinator: LocalCoordinator, clock: FakeClock
) -> AsyncIterator[tuple[Server, health_pb2_grpc.HealthStub]]:
    node = Node(store=store, coordinator=coordinator, clock=clock, node_id="n1")
    server = Server(node, port=0, health_config=HealthConfig(every_s=1.0, timeout_s=0.2))
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    try:
        yield server, health_pb2_grpc.HealthStub(channel)
    finally:
        await channel.close(None)
        await stopped_with_time_running(clock, server.stop(0))


async def status(stub: health_pb2_grpc.HealthStub, service: str = "") -> int:
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


async def flips_to(stub: health_pb2_grpc.HealthStub, clock: FakeClock, want: int) -> None:
    """Let the watcher's loop run (one probe per fake second) until health says ``want``."""
    for _ in range(50):
        if await status(stub) == want:
            return
        clock.advance(1.0)
        await asyncio.sleep(0.02)
    raise AssertionError(f"health never became {want}")


async def test_health_follows_the_store_down_and_back() -> None:
    store = StoppableStore(":memory:", num_shards=4)
    clock = FakeClock(START_MS)
    async with serving(store, LocalCoordinator(), clock) as (server, stub):
        http = await serve_node(server.node, host="127.0.0.1", port=0)
        try:
            assert await status(stub) == SERVING
            assert await status(stub, "timeshard.v1.WorkerService") == SERVING
            assert (await scrape(http.port, "/readyz"))[0] == 200

            store.stopped = True
            await flips_to(stub, clock, NOT_SERVING)
            assert await status(stub, "timeshard.v1.JobService") == NOT_SERVING
            health = server.node.metrics.health
            assert not health.store_ok and "connection refused" in health.store_error
            assert (await scrape(http.port, "/readyz"))[0] == 503  # the kubelet's probe
            assert (await scrape(http.port, "/livez"))[0] == 200

            store.stopped = False
            await flips_to(stub, clock, SERVING)
            assert await status(stub, "timeshard.v1.JobService") == SERVING
            assert (await scrape(http.port, "/readyz"))[0] == 200
        finally:
            await http.stop()


async def test_a_store_that_does_not_answer_in_time_is_down() -> None:
    store = StoppableStore(":memory:", num_shards=4)
    async with serving(store, LocalCoordinator(), FakeClock(START_MS)) as (server, stub):
        store.hung = True
        assert await server.health_watcher.check() is False  # the probe's 0.2 s timeout
        assert await status(stub) == NOT_SERVING
        assert "no answer within 0.2 s" in server.node.metrics.health.store_error
        store.hung = False
        assert await server.health_watcher.check() is True
        assert await status(stub) == SERVING


async def test_health_follows_the_coordinator_session() -> None:
    coordinator = SessionCoordinator()
    clock = FakeClock(START_MS)
    async with serving(SqliteStore(":memory:", num_shards=4), coordinator, clock) as (_, stub):
        assert await status(stub) == SERVING
        coordinator.live = False
        await flips_to(stub, clock, NOT_SERVING)
        coordinator.live = True
        await flips_to(stub, clock, SERVING)


async def test_a_node_that_starts_without_its_session_is_not_serving_from_the_start() -> None:
    coordinator = SessionCoordinator()
    coordinator.live = False
    clock = FakeClock(START_MS)
    async with serving(SqliteStore(":memory:", num_shards=4), coordinator, clock) as (s, stub):
        assert await status(stub) == NOT_SERVING
        await wait_until(lambda: not s.node.metrics.health.serving, what="health recorded")


async def test_the_watch_stops_when_cancelled_just_as_the_store_answers() -> None:
    """A stop that cancels the watch after the store's answer is in, before the watch has
    taken it, must still end the watch. Python 3.11's ``asyncio.wait_for`` returned the answer
    and dropped the cancellation: the watch went back to sleep and ``Server.stop`` waited for
    it for ever (a test's embedded server hung at teardown about once in 300 stops)."""
    node = Node(
        store=SqliteStore(":memory:", num_shards=1),
        coordinator=LocalCoordinator(),
        clock=FakeClock(START_MS),
    )
    answer: asyncio.Future[ShardState] = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    def get_shard(shard: int) -> asyncio.Future[ShardState]:
        asked.set()
        return answer

    node.store.get_shard = get_shard  # type: ignore[method-assign,assignment]

    async def set_serving(serving: bool) -> None:
        pass

    watcher = HealthWatcher(node, set_serving, HealthConfig(every_s=3600, timeout_s=3600))
    watcher.start()
    async with asyncio.timeout(5):
        await asked.wait()
    answer.set_result(ShardState(shard=0))  # the answer is in; the watch has not run since
    try:
        async with asyncio.timeout(5):
            await watcher.stop()
    except TimeoutError:
        raise AssertionError("the watch took the answer and went on: stop never ended") from None
