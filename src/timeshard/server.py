"""The gRPC server of a node: JobService, WorkerService, AdminService, PeerService (hints
between nodes), health, reflection."""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from timeshard.api.admin import AdminService
from timeshard.api.peers import PeerChannels, PeerService, peer_security
from timeshard.api.servicers import JobService
from timeshard.api.workers import WorkerService
from timeshard.node import Node
from timeshard.observe.rpc import RpcMetrics
from timeshard.security.policy import ServerSecurity
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.health import HealthConfig, HealthWatcher
from timeshard.views.nodelive import AskLive

log = logging.getLogger(__name__)

SERVICE_NAMES = tuple(
    pb.DESCRIPTOR.services_by_name[n].full_name for n in pb.DESCRIPTOR.services_by_name
)
REFLECTION = (reflection.SERVICE_NAME, "grpc.reflection.v1.ServerReflection")


class Server:
    """A node behind a grpc.aio server. ``port=0`` picks a free port (see ``.port``).

    ``security`` adds TLS and role tokens (``timeshard.security``); without either the server
    refuses to listen beyond loopback unless ``security.insecure`` is set."""

    def __init__(
        self,
        node: Node,
        *,
        host: str = "127.0.0.1",
        port: int = 50051,
        advertise: str = "",
        security: ServerSecurity | None = None,
        health_config: HealthConfig | None = None,
    ) -> None:
        self.node = node
        self.security = security or ServerSecurity()
        self.security.check_listen(host, port)
        self._reload_task: asyncio.Task[None] | None = None
        self._grpc = grpc.aio.server(
            # Outermost first: RPC metrics see every call as the client does, refusals included.
            interceptors=[
                RpcMetrics(node.metrics, (*SERVICE_NAMES, health.SERVICE_NAME, *REFLECTION)),
                *self.security.interceptors(),
            ],
            options=[
                ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_JobServiceServicer_to_server(JobService(node, self.security.auth), self._grpc)
        pb_grpc.add_WorkerServiceServicer_to_server(WorkerService(node), self._grpc)
        pb_grpc.add_AdminServiceServicer_to_server(AdminService(node), self._grpc)
        pb_grpc.add_PeerServiceServicer_to_server(PeerService(node), self._grpc)
        self._peers: PeerChannels | None = None
        self._health = health_async.HealthServicer()
        self.health_watcher = HealthWatcher(node, self._set_serving, health_config)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self._grpc
        )
        self.port = self.security.add_port(self._grpc, f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"can not listen on {host}:{port} (in use?)")
        # What other nodes and workers dial (ClusterInfo); a wildcard listen address is not.
        shown = socket.gethostname() if host in ("0.0.0.0", "::", "[::]") else host
        self.address = advertise or f"{shown}:{self.port}"
        if not node.address:
            node.address = self.address

    async def start(self) -> None:
        if not self.node.peers.enabled and not self.node.coordinator.single:
            security = peer_security(self.security)
            if security is not None:
                self._peers = PeerChannels(self.node.node_id, security)
                self.node.peers.use(self._peers.sender())
                self.node.waits.use_peers(self.node.peer_of_job, self._peers.asker())
                self.node.revokes.use(self._peers.revoker())
        await self.node.start()
        await self._grpc.start()
        await self.health_watcher.check()  # the first answer is the truth, not a default
        self.health_watcher.start()
        self._reload_task = asyncio.create_task(
            self.security.reload_periodically(), name="security-reload"
        )
        log.info(
            "timeshard node %s serving on %s (%s)",
            self.node.node_id,
            self.address,
            self.security.describe(),
        )

    def live_asker(self) -> AskLive | None:
        """How the console asks the other nodes for their live numbers (after ``start``);
        None when this node may not call them (``api.peers.peer_security``) or has none."""
        return self._peers.live_asker() if self._peers is not None else None

    async def _set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)

    def reload_security(self) -> None:
        """Re-read certificates and tokens (SIGHUP) without dropping a connection."""
        self.security.reload()

    async def stop(self, grace: float = 2.0) -> None:
        if self._reload_task is not None:
            self._reload_task.cancel()
        await self.health_watcher.stop()
        await self._health.enter_graceful_shutdown()
        self.node.waits.stop_answering()  # peers' long polls: not worth the grace period
        await self._grpc.stop(grace)
        await self.node.stop()
        if self._peers is not None:
            await self._peers.close()

    async def wait(self) -> None:
        await self._grpc.wait_for_termination()
