"""Clock skew between this node and the store: invariant 4 holds only while node clocks are
within ``max_skew_s`` of each other, so each node measures its own offset and says so loudly.

Nodes compare wall clocks in two places: a late write is found only if its writer's clock is
within ``DispatchConfig.max_skew_s`` of the owner's (the re-read window covers that much), and
a lease expires by the owner's clock while the claiming node set ``lease_until`` by its own (the
worker's safety margin must cover the difference). Every node measures its offset from one
reference, the store's clock, so two nodes within the bound of it are within twice the bound of
each other; a node off by more is logged loudly, with the figure, every check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from timeshard.clock import Clock
from timeshard.errors import TimeshardError
from timeshard.store.base import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class SkewReading:
    offset_ms: float
    """The store's clock minus ours, at the middle of the round trip."""
    uncertainty_ms: float
    """Half the round trip: the true offset is within this of ``offset_ms``."""

    def beyond(self, bound_s: float) -> bool:
        return abs(self.offset_ms) - self.uncertainty_ms > bound_s * 1000


async def measure(store: Store, clock: Clock) -> SkewReading | None:
    """None when the store has no clock of its own (the embedded store runs on this
    machine) or can not be asked now."""
    before = clock.now_ms()
    try:
        reference = await store.clock_ms()
    except TimeshardError:
        return None
    after = clock.now_ms()
    if reference is None:
        return None
    return SkewReading(
        offset_ms=reference - (before + after) / 2, uncertainty_ms=(after - before) / 2
    )


async def check(store: Store, clock: Clock, bound_s: float, node_id: str) -> SkewReading | None:
    reading = await measure(store, clock)
    if reading is not None and reading.beyond(bound_s):
        log.warning(
            "node %s: clock is off by %.0f ms (+-%.0f) from the store's, beyond the %.1f s "
            "the design tolerates: late writes of other nodes may be missed and leases may "
            "expire early; fix this machine's time sync (NTP/chrony)",
            node_id,
            -reading.offset_ms,
            reading.uncertainty_ms,
            bound_s,
        )
    return reading
