"""Hints to the other nodes of a cluster: the bucket entries this node wrote for shards another
node dispatches go to that node at once (``PeerService.Land``), so a job due soon does not wait
for its owner's next read of the shard's buckets (``refresh_s``, a second by default: with
several nodes and clients spread over them, most jobs are written by a node that does not
dispatch them).

A hint only, never what correctness rests on: the entries are durable before they are sent, the
receiver takes only the entries of shards it dispatches (``Node.landed``), and a hint that is
lost, refused or sent to a node that no longer owns the shard costs the wait it was meant to
save. Only entries that may come due before the owner's next refresh has read them are sent:
due within one ``refresh_s`` and ``HINT_MARGIN_S`` (a refresh reads ``lookahead_s`` ahead, so
a later entry is in memory there before it is due); the rest cost nothing more than before.
Batched per peer (``GroupCommit``: one call in flight to each peer, the next one filling), and
sent in the background: the caller's answer never waits for a peer, so a slow or dead one
delays nobody. No gRPC types here:
``send`` is the transport (``timeshard.api.peers``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from timeshard.batching import GroupCommit
from timeshard.clock import Clock
from timeshard.coordinator.base import Coordinator, Member
from timeshard.model import BucketEntry
from timeshard.observe.logs import Quieted

log = logging.getLogger(__name__)

HINT_MARGIN_S = 0.5
"""Added to the owner's refresh interval for the entries hinted: the time a refresh takes to
read, and a little clock difference between the nodes (with more, an entry not hinted may wait
up to that difference past its due time, as every entry did before hints)."""
MAX_LAND = 1000
"""Entries in one ``Land`` call (the receiver refuses more)."""
QUIET_S = 60.0
"""A peer that keeps refusing or failing hints is logged at most this often."""

Send = Callable[[Member, Sequence[BucketEntry]], Awaitable[int]]
"""Send entries to a peer; returns how many it took (of the shards it dispatches)."""


class PeerHints:
    """``hint(entries)`` after a write: those due soon, of shards another node dispatches,
    go to that node. ``send`` None: no transport (a single node, or peers this node may not
    call), nothing is sent. ``horizon_ms()``: how far ahead of now an entry is still hinted."""

    def __init__(
        self,
        *,
        coordinator: Coordinator,
        clock: Clock,
        send: Send | None,
        horizon_ms: Callable[[], int],
        counted: Callable[[str, int], None] = lambda outcome, n: None,
    ) -> None:
        self._coordinator = coordinator
        self._clock = clock
        self._send = send
        self._horizon_ms = horizon_ms
        self._counted = counted
        self._batcher: GroupCommit[str, tuple[Member, BucketEntry]] = GroupCommit(
            self._run, max_items=MAX_LAND, fail=self._failed, name="peer-hints"
        )
        self.counts: Counter[str] = Counter()
        """Entries by outcome: ``taken`` (by a node dispatching their shard), ``not_owned``
        (the peer no longer dispatches it), ``failed`` (the call failed); each also goes to
        ``counted(outcome, n)`` (the node's metrics)."""
        self._quiet = Quieted(log, QUIET_S, " (its jobs are found at the owner's next read)")

    @property
    def enabled(self) -> bool:
        return self._send is not None

    def use(self, send: Send) -> None:
        """Send hints with ``send`` from now on (the server sets its transport)."""
        self._send = send

    def hint(self, entries: Sequence[BucketEntry]) -> None:
        if self._send is None or not entries:
            return
        soon = self._clock.now_ms() + self._horizon_ms()
        for e in entries:
            if e.due_at > soon:
                continue
            peer = self._coordinator.peer_for(e.shard)
            if peer is not None:
                self._batcher.submit(peer.address, (peer, e))

    async def close(self) -> None:
        await self._batcher.close()

    async def _run(self, address: str, items: list[tuple[Member, BucketEntry]]) -> None:
        assert self._send is not None
        peer = items[0][0]
        try:
            taken = await self._send(peer, [e for _, e in items])
        except Exception as exc:  # a hint: a failure costs the owner's next read, no more
            self._count("failed", len(items))
            self._coordinator.forget_peer(peer.node_id)
            self._quiet.info(address, f"hints to {peer.node_id} at {address} failed: {exc}")
            return
        taken = max(0, min(taken, len(items)))
        self._count("taken", taken)
        self._count("not_owned", len(items) - taken)

    def _failed(self, item: tuple[Member, BucketEntry], exc: BaseException) -> None:
        self._count("failed", 1)

    def _count(self, outcome: str, n: int) -> None:
        if n:
            self.counts[outcome] += n
            self._counted(outcome, n)
