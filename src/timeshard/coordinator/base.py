"""The coordinator contract: who is in the cluster and which node owns which shard.

A shard's owner is its only sub-scheduler. The coordinator decides ownership; the node makes
it safe by taking the shard's epoch in the store (invariant 7) before dispatching, so two nodes
that briefly both believe they own a shard can not both change it.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from timeshard.errors import FailedPrecondition, TimeshardError


@dataclass(frozen=True, kw_only=True, slots=True)
class Member:
    node_id: str
    address: str  # host:port of the node's gRPC server


ShardsChanged = Callable[[frozenset[int], frozenset[int]], Awaitable[None]]
"""Called with (gained, lost) shards. Lost shards must stop dispatching before it returns.
Gained ones are taken together; ``ShardsNotTaken`` names those it could not take (the others
are dispatching), any other error means none of them is."""


class ShardsNotTaken(TimeshardError):
    """``on_change`` took the shards gained but these (each with why)."""

    def __init__(self, failed: Mapping[int, BaseException]) -> None:
        shown = "; ".join(f"{shard}: {exc}" for shard, exc in sorted(failed.items())[:3])
        more = f" (+{len(failed) - 3} more)" if len(failed) > 3 else ""
        super().__init__(f"{len(failed)} shard(s) not taken: {shown}{more}")
        self.failed = dict(failed)


class Coordinator(abc.ABC):
    @abc.abstractmethod
    async def start(self, me: Member, num_shards: int, on_change: ShardsChanged) -> None:
        """Join the cluster. ``on_change`` is awaited, one call at a time, whenever this
        node's set of shards changes (including the first assignment, and losing every shard
        when the coordination session is suspended or lost)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Leave the cluster: release every shard (``on_change`` reports the loss) and
        deregister."""

    @abc.abstractmethod
    def owned(self) -> frozenset[int]:
        """Shards this node owns right now."""

    @property
    def single(self) -> bool:
        """This node is the cluster's only one by construction (``local``): it has no peers."""
        return False

    @property
    def connected(self) -> bool:
        """Whether this node's coordination session is live now (health checks read it). A
        coordinator without a session (``local``) is always connected."""
        return True

    @abc.abstractmethod
    async def members(self) -> list[Member]:
        """Live nodes, this one included."""

    @abc.abstractmethod
    async def owners(self) -> dict[int, str]:
        """shard -> owning node id, for the shards that have an owner."""

    def peer_for(self, shard: int) -> Member | None:
        """The other node this one believes dispatches ``shard`` now (by the last assignment it
        computed), to hint about entries written for it; None for this node's own shards, or
        when unknown. A belief, not a fence: the hinted node checks what it dispatches."""
        return None

    def forget_peer(self, node_id: str) -> None:
        """A call to ``node_id``, at the address ``peer_for`` gave, failed: read its address
        again before the next hint to it (it may have restarted elsewhere under the same id).
        A coordinator that keeps no addresses has nothing to forget."""
        return None

    async def move_shard(self, shard: int, to_node: str) -> None:
        """Pin ``shard`` on live node ``to_node``: its owner releases it and ``to_node`` takes
        it (asynchronously; ``owners()`` shows when it is done)."""
        raise FailedPrecondition(f"{type(self).__name__} can not move shards")

    async def drain_node(self, node_id: str) -> list[int]:
        """Move every shard off ``node_id`` and keep it without shards; returns the shards it
        owned when asked."""
        raise FailedPrecondition(f"{type(self).__name__} can not drain nodes")
