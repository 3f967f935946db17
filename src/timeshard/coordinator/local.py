"""The in-process coordinator of the embedded mode: one node owns every shard."""

from __future__ import annotations

from timeshard.coordinator.base import Coordinator, Member, ShardsChanged


class LocalCoordinator(Coordinator):
    def __init__(self) -> None:
        self._me: Member | None = None
        self._owned: frozenset[int] = frozenset()
        self._on_change: ShardsChanged | None = None

    async def start(self, me: Member, num_shards: int, on_change: ShardsChanged) -> None:
        self._me = me
        self._on_change = on_change
        self._owned = frozenset(range(num_shards))
        await on_change(self._owned, frozenset())

    async def stop(self) -> None:
        lost, self._owned = self._owned, frozenset()
        if self._on_change is not None and lost:
            await self._on_change(frozenset(), lost)

    def owned(self) -> frozenset[int]:
        return self._owned

    @property
    def single(self) -> bool:
        return True

    async def members(self) -> list[Member]:
        return [self._me] if self._me is not None else []

    async def owners(self) -> dict[int, str]:
        node = self._me.node_id if self._me is not None else ""
        return dict.fromkeys(self._owned, node)
