"""Health on a real Cassandra that this test starts, stops and starts again on its own ports
(never the shared one): NOT_SERVING while the store does not answer, SERVING once it is back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc

from tests.integration.test_health_zookeeper import NOT_SERVING, SERVING, until
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.factory import make_store
from timeshard.node import Node
from timeshard.server import Server
from timeshard.testing.services import cassandra_node
from timeshard.views.health import HealthConfig

pytestmark = pytest.mark.timeout(900)


async def test_health_follows_a_real_cassandra_down_and_back(tmp_path: Path) -> None:
    cassandra = await asyncio.to_thread(cassandra_node, tmp_path / "cassandra")
    try:
        node = Node(
            store=make_store(f"cassandra://{cassandra.address}/health?rf=1", num_shards=4),
            coordinator=LocalCoordinator(),
            clock=SystemClock(),
            node_id="health-c",
        )
        server = Server(node, port=0, health_config=HealthConfig(every_s=0.5, timeout_s=2.0))
        await server.start()
        channel = grpc.aio.insecure_channel(server.address)
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            await until(stub, SERVING, 30)
            await asyncio.to_thread(cassandra.stop)
            await until(stub, NOT_SERVING, 60)
            health = node.metrics.health
            assert not health.store_ok and health.coordinator_ok and health.store_error
            await asyncio.to_thread(cassandra.start, 300)
            await until(stub, SERVING, 120)
        finally:
            await channel.close(None)
            await server.stop(0)
    finally:
        await asyncio.to_thread(cassandra.stop)
