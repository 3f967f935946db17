"""What one node holds in memory for the operator console's live view and Workers page
(``PeerService.Live`` carries it between nodes; ``views.console.live`` sums the nodes'). Read
from the node's memory only: its counters since it started, its window of schedule-to-start,
the jobs waiting in its ready queues, the workers connected to it and the retries it recorded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from timeshard.coordinator.base import Member
from timeshard.node import Node
from timeshard.node.connected import WorkerSeen
from timeshard.views.status import TypeWaiting, unclaimed_rows

START_WINDOW_S = 10.0
"""Schedule-to-start is taken over the last 10 s."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeLive:
    node_id: str
    at_ms: int
    serving: bool
    owned: int
    """Shards this node dispatches."""
    ready_due: int
    totals: dict[str, dict[str, int]]
    """Per type, the node's job counters since it started (``NodeMetrics.totals``)."""
    waiting: list[TypeWaiting]
    start_delay: dict[str, tuple[dict[float, int], float]]
    """Per type, schedule-to-start over ``START_WINDOW_S``: its buckets and its largest."""
    workers: list[WorkerSeen]
    dead_letters: int | None
    """The dead-letter queue's size, counted by the owner of shard 0 (None elsewhere)."""
    retrying: dict[str, int] = field(default_factory=dict)
    """Per type, jobs backing off for a retry that this node recorded."""


AskLive = Callable[[Member], Awaitable[NodeLive]]
"""Ask a peer for its ``NodeLive`` (``PeerService.Live``)."""


def node_live(node: Node) -> NodeLive:
    metrics = node.metrics
    return NodeLive(
        node_id=node.node_id,
        at_ms=node.clock.now_ms(),
        serving=metrics.health.serving,
        owned=len(node.dispatching),
        ready_due=node.ready.count(),
        totals=metrics.totals(),
        waiting=unclaimed_rows(node, every=True),
        start_delay={
            t: w.buckets(START_WINDOW_S) for t, w in sorted(metrics.start_windows.items())
        },
        workers=node.workers.rows(),
        dead_letters=metrics.health.dead_letters,
        retrying=metrics.retry_waits.counts(),
    )
