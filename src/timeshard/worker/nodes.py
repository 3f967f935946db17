"""The nodes a worker takes jobs from: who they are (the cluster's members, asked of any node
that answers, ``AdminService.ClusterInfo``), one gRPC channel each, and one ``NodeLink`` each
(its worker stream, or its unary claim loops: ``stream``). A node that leaves is no longer
claimed from, but its channel stays open for the heartbeats and results of the jobs it
handed out. The ``Worker`` makes one ``Nodes`` per run and says how a node's link is made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from timeshard.clock import Clock
from timeshard.limits import MAX_REPLY_BYTES
from timeshard.security.channel import ClientSecurity
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.worker.stream import NodeLink

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub

log = logging.getLogger("timeshard.worker")  # part of the worker SDK: its logger, as before

Link = Callable[["WorkerStub", str], NodeLink]
"""How the worker makes a node's link: ``link(stub, address)``."""


class Nodes:
    """The nodes a worker takes jobs from: one channel and one ``NodeLink`` each (its worker
    stream, or its unary claim loops)."""

    def __init__(self, security: ClientSecurity, clock: Clock, link: Link) -> None:
        self._security = security
        self._clock = clock
        self._link = link
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.links: dict[str, NodeLink] = {}
        self._dropped: set[NodeLink] = set()
        self.stubs: dict[str, NodeLink] = {}
        """The live nodes: where results and heartbeats may go."""

    def add(self, address: str) -> None:
        if address in self.links:
            return
        stub = pb_grpc.WorkerServiceStub(self._channel(address))
        self.links[address] = self.stubs[address] = self._link(stub, address)

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = self._security.aio_channel(
                address, options=[("grpc.max_receive_message_length", MAX_REPLY_BYTES)]
            )
        return self.channels[address]

    def drop(self, address: str) -> None:
        """Stop claiming from a node that left; its channel stays open for the heartbeats
        and reports of jobs it handed out (its link, on the unary calls once its stream is
        gone)."""
        link = self.links.pop(address, None)
        self.stubs.pop(address, None)
        if link is not None:
            self._dropped.add(link)
            link.leave()

    async def discover(self, seeds: list[str], every_s: float) -> None:
        while True:
            members = await self._members(seeds)
            if members:
                for address in members - set(self.links):
                    log.info("worker: node %s joined; claiming from it", address)
                    self.add(address)
                for address in set(self.links) - members:
                    log.info("worker: node %s left; no longer claiming from it", address)
                    self.drop(address)
            await self._clock.sleep(every_s)

    async def _members(self, seeds: list[str]) -> set[str]:
        """Live nodes' addresses, from the first node that answers."""
        for address in [*self.links, *seeds]:
            channel = self._channel(address)
            try:
                info = await pb_grpc.AdminServiceStub(channel).ClusterInfo(
                    pb.ClusterInfoRequest(), timeout=5
                )
            except grpc.RpcError:
                continue
            return {n.address for n in info.nodes if n.address}
        return set()

    async def stop_claiming(self) -> None:
        """Every node: no more jobs (a stream says ``stop`` and its node confirms)."""
        await asyncio.gather(*(link.stop_claiming() for link in self.links.values()))

    async def close(self) -> None:
        links = [*self.links.values(), *self._dropped]
        await asyncio.gather(*(link.close() for link in links))
        for channel in self.channels.values():
            await channel.close(None)
