"""Health on a real ZooKeeper that this test starts, stops and starts again on its own ports
(never the shared one): NOT_SERVING while the node's session is suspended or lost, SERVING
again once it is back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from timeshard.clock import SystemClock
from timeshard.coordinator.zookeeper import ZooKeeperCoordinator
from timeshard.node import Node
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.services import zookeeper_ensemble
from timeshard.testing.waits import wait_until
from timeshard.views.health import HealthConfig

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def until(stub: health_pb2_grpc.HealthStub, want: int, timeout: float) -> None:
    """Until health says ``want`` (fails after ``timeout``)."""
    await wait_until(
        lambda: stub.Check(health_pb2.HealthCheckRequest(), timeout=5),
        timeout,
        f"health to become {health_pb2.HealthCheckResponse.ServingStatus.Name(want)}",
        until=lambda reply: reply.status == want,
        every=0.1,
    )


async def test_health_follows_a_real_zookeeper_session(tmp_path: Path) -> None:
    ensemble = await asyncio.to_thread(zookeeper_ensemble, 1, tmp_path / "zk")
    try:
        coordinator = ZooKeeperCoordinator.from_url(
            f"zookeeper://{ensemble.hosts}/timeshard-health?session_timeout=3"
        )
        node = Node(
            store=SqliteStore(tmp_path / "n.db", num_shards=4),
            coordinator=coordinator,
            clock=SystemClock(),
            node_id="health-a",
        )
        server = Server(node, port=0, health_config=HealthConfig(every_s=0.2, timeout_s=1.0))
        await server.start()
        channel = grpc.aio.insecure_channel(server.address)
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            await until(stub, SERVING, 10)
            await asyncio.to_thread(ensemble.stop_server, 0)
            await until(stub, NOT_SERVING, 10)  # kazoo: SUSPENDED after 2/3 of the session
            assert not node.metrics.health.coordinator_ok and node.metrics.health.store_ok
            await asyncio.to_thread(ensemble.restart, 0)
            await until(stub, SERVING, 30)
            assert node.coordinator.connected
        finally:
            await channel.close(None)
            await server.stop(0)
    finally:
        await asyncio.to_thread(ensemble.stop)
