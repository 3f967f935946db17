"""``PeerService``: the hints nodes send each other (``timeshard.node.peers``), the waits
they ask of each other (``timeshard.node.waits``), the revokes of leases one cancelled and
another delivered (``timeshard.node.revokes``) and what a console asks of each node (``Live``:
``timeshard.views.nodelive``), both ends.

The receiving end checks each entry and hands it to the node (``Node.landed``), or waits for
the jobs named (``JobWaits.finished_of``); the sending end keeps one channel per peer address.
A node calls its peers with the security of its own port: plaintext when it has neither TLS nor
tokens; otherwise with ``TIMESHARD_PEER_TOKEN`` (a token with the ``worker`` role, or
``admin``) and, when its port has TLS, the client files in ``TIMESHARD_PEER_TLS_DIR`` (as
``TIMESHARD_TLS_DIR`` for a client). Without what its port requires the node sends no hints
and asks no waits, says so once, and its peers find the jobs it writes at their next read (and
its cancels of jobs another node delivered wait out their latest start, unrevoked)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

from timeshard.api.live import live_from_pb, live_to_pb
from timeshard.api.servicers import Ctx, rpc, wait_ids
from timeshard.coordinator.base import Member
from timeshard.errors import InvalidArgument
from timeshard.model import BucketEntry, validate_job_id
from timeshard.node import Node
from timeshard.node.peers import MAX_LAND, Send
from timeshard.node.revokes import AskRevoke
from timeshard.node.waits import AskPeer
from timeshard.security.channel import ClientSecurity
from timeshard.security.policy import ServerSecurity
from timeshard.security.tls import ClientTls
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.nodelive import AskLive, NodeLive, node_live
from timeshard.wire import dur, dur_s, ts, ts_ms

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import PeerServiceAsyncStub as PeerStub

log = logging.getLogger(__name__)

ENV_PEER_TOKEN = "TIMESHARD_PEER_TOKEN"
ENV_PEER_TLS_DIR = "TIMESHARD_PEER_TLS_DIR"
LAND_TIMEOUT_S = 2.0
MAX_PEER_WAIT_S = 60.0
"""The longest ``WaitFinished`` a node serves (the asker asks again after it), and the
longest wait for a start notice a ``Revoke`` asks for."""
WAIT_MARGIN_S = 5.0
"""Beyond the wait asked, how long the asker lets a ``WaitFinished`` call take."""
LIVE_TIMEOUT_S = 0.8
"""A peer's ``Live`` answer after this long is left for the next sample (one a second)."""
_ANSWERS = {
    None: pb.REVOKE_ANSWER_UNKNOWN,
    False: pb.REVOKE_ANSWER_NOT_STARTED,
    True: pb.REVOKE_ANSWER_STARTED,
}
_STARTED: dict[int, bool | None] = {int(v): k for k, v in _ANSWERS.items()}


def entries_to_pb(node_id: str, entries: Sequence[BucketEntry]) -> pb.LandRequest:
    return pb.LandRequest(
        from_node=node_id,
        entries=[
            pb.LandedEntry(
                shard=e.shard,
                minute=e.minute,
                due_at=ts(e.due_at),
                job_id=e.job_id,
                home=e.home or 0,
            )
            for e in entries
        ],
    )


def entries_from_pb(request: pb.LandRequest, num_shards: int) -> list[BucketEntry]:
    """The request's entries, each checked: a bad one refuses the whole call."""
    if len(request.entries) > MAX_LAND:
        raise InvalidArgument("entries", f"at most {MAX_LAND} per call, got {len(request.entries)}")
    out: list[BucketEntry] = []
    for n, e in enumerate(request.entries):
        field = f"entries[{n}]"
        if not 0 <= e.shard < num_shards:
            raise InvalidArgument(f"{field}.shard", f"must be 0-{num_shards - 1}, got {e.shard}")
        if e.minute < 0 or e.home < 0:
            raise InvalidArgument(f"{field}", "minute and home must not be negative")
        try:
            validate_job_id(e.job_id)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{field}.job_id", exc.problem) from None
        out.append(
            BucketEntry(
                shard=e.shard,
                minute=e.minute,
                due_at=ts_ms(e.due_at),
                job_id=e.job_id,
                home=e.home or None,
            )
        )
    return out


class PeerService(pb_grpc.PeerServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    @rpc
    async def Land(self, request: pb.LandRequest, context: Ctx) -> pb.LandResponse:
        entries = entries_from_pb(request, self.node.num_shards)
        taken = self.node.landed(entries)
        self.node.metrics.peer_hints_received(taken, len(entries) - taken)
        return pb.LandResponse(taken=taken, not_owned=len(entries) - taken)

    @rpc
    async def WaitFinished(
        self, request: pb.WaitFinishedRequest, context: Ctx
    ) -> pb.WaitFinishedResponse:
        job_ids = wait_ids(request.job_ids)
        if request.timeout.seconds < 0 or request.timeout.nanos < 0:
            raise InvalidArgument("timeout", "must not be negative")
        timeout_s = min(dur_s(request.timeout), MAX_PEER_WAIT_S)
        return pb.WaitFinishedResponse(
            job_ids=await self.node.waits.finished_of(job_ids, timeout_s)
        )

    @rpc
    async def Live(self, request: pb.LiveRequest, context: Ctx) -> pb.LiveResponse:
        return live_to_pb(node_live(self.node))

    @rpc
    async def Revoke(self, request: pb.RevokeRequest, context: Ctx) -> pb.RevokeResponse:
        job_id = validate_job_id(request.job_id)
        if request.fence < 1:
            raise InvalidArgument(
                "fence", f"must be 1 or more (a running job's), got {request.fence}"
            )
        if request.wait.seconds < 0 or request.wait.nanos < 0:
            raise InvalidArgument("wait", "must not be negative")
        wait_s = min(dur_s(request.wait), MAX_PEER_WAIT_S)
        started = await self.node.revokes.answer(job_id, request.fence, wait_s)
        return pb.RevokeResponse(answer=_ANSWERS[started])


def peer_security(server: ServerSecurity) -> ClientSecurity | None:
    """How this node calls its peers (module docstring); None: it may not."""
    token = os.environ.get(ENV_PEER_TOKEN, "").strip()
    if server.auth is not None and not token:
        log.warning(
            "no hints to other nodes: this node's port needs a token and %s is not set "
            "(each node finds the jobs others write for its shards at its next bucket read)",
            ENV_PEER_TOKEN,
        )
        return None
    tls: ClientTls | None = None
    if server.tls is not None:
        directory = os.environ.get(ENV_PEER_TLS_DIR, "")
        if not directory:
            log.warning(
                "no hints to other nodes: this node's port has TLS and %s is not set "
                "(each node finds the jobs others write for its shards at its next bucket read)",
                ENV_PEER_TLS_DIR,
            )
            return None
        try:
            tls = ClientTls.from_dir(directory)
        except InvalidArgument as exc:  # named by the variable the operator set, not a flag
            raise InvalidArgument(ENV_PEER_TLS_DIR, exc.problem) from None
    return ClientSecurity(tls=tls, token=token)


class PeerChannels:
    """One channel per peer address, opened on the first hint to it."""

    def __init__(self, node_id: str, security: ClientSecurity) -> None:
        self._node_id = node_id
        self._security = security
        self._stubs: dict[str, tuple[grpc.aio.Channel, PeerStub]] = {}

    def sender(self) -> Send:
        async def send(peer: Member, entries: Sequence[BucketEntry]) -> int:
            stub = self._stub(peer.address)
            reply = await stub.Land(entries_to_pb(self._node_id, entries), timeout=LAND_TIMEOUT_S)
            return int(reply.taken)

        return send

    def asker(self) -> AskPeer:
        async def ask(peer: Member, job_ids: Sequence[str], timeout_s: float) -> list[str]:
            stub = self._stub(peer.address)
            reply = await stub.WaitFinished(
                pb.WaitFinishedRequest(
                    from_node=self._node_id,
                    job_ids=list(job_ids),
                    timeout=dur(round(timeout_s * 1000)),
                ),
                timeout=timeout_s + WAIT_MARGIN_S,
            )
            return list(reply.job_ids)

        return ask

    def live_asker(self) -> AskLive:
        async def ask(peer: Member) -> NodeLive:
            stub = self._stub(peer.address)
            reply = await stub.Live(pb.LiveRequest(from_node=self._node_id), timeout=LIVE_TIMEOUT_S)
            return live_from_pb(reply)

        return ask

    def revoker(self) -> AskRevoke:
        async def ask(
            peer: Member, job_id: str, fence: int, wait_s: float, timeout_s: float
        ) -> bool | None:
            stub = self._stub(peer.address)
            request = pb.RevokeRequest(
                from_node=self._node_id, job_id=job_id, fence=fence, wait=dur(round(wait_s * 1000))
            )
            reply = await stub.Revoke(request, timeout=timeout_s)
            return _STARTED.get(int(reply.answer))

        return ask

    def _stub(self, address: str) -> PeerStub:
        found = self._stubs.get(address)
        if found is None:
            channel = self._security.aio_channel(address)
            stub: PeerStub = pb_grpc.PeerServiceStub(channel)
            found = self._stubs[address] = (channel, stub)
        return found[1]

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close(None)
        self._stubs.clear()
