"""When a pushed job may start, on this worker's own clock (``ClaimedJob.starts_in``).

A node may push a job it claimed ahead before the job is due, with ``starts_in``: the handler
starts no earlier than the time the push was received plus ``starts_in``, on this process's
monotonic clock, so the push's transit only makes the start later, never earlier, whatever the
wall clocks of the two machines say. It starts no later than the push's base (the time the
request it names was sent, plus ``held``: never after the node took the job) plus ``starts_in``
plus ``START_GRACE_MS``; past that it is given back unstarted, so a cancel through the node
that pushed it waits for this worker's answer no longer than that bound. Until the handler
starts, the node may revoke the job (its cancel): it is then never started.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from timeshard.clock import Clock, sleep_or_wake, wake
from timeshard.limits import START_GRACE_MS


@dataclass(kw_only=True, slots=True)
class StartAt:
    not_before: float
    """This worker's monotonic time before which the handler must not start."""
    by: float
    """Its monotonic time after which the handler must not start any more."""
    revoked: bool = False
    waker: asyncio.Future[None] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, base: float, received: float, starts_in_s: float) -> StartAt:
        return cls(not_before=received + starts_in_s, by=base + starts_in_s + START_GRACE_MS / 1000)

    def too_late(self, deadline: float) -> str:
        """Why the job can not start in time at all ("" if it can): its start would come after
        the bound, or after its lease's deadline."""
        if self.not_before > self.by:
            late = self.not_before - self.by + START_GRACE_MS / 1000
            return f"its push arrived {late:.3f}s after it was sent (more than the start's grace)"
        if self.not_before >= deadline:
            return f"it was to start {self.not_before - deadline:.3f}s past its lease"
        return ""

    async def wait(self, clock: Clock) -> None:
        """Until ``not_before`` on ``clock``, or a revoke."""
        delay = self.not_before - clock.monotonic()
        if delay <= 0 or self.revoked:
            return
        self.waker = asyncio.get_running_loop().create_future()
        try:
            await sleep_or_wake(clock, delay, self.waker)
        finally:
            self.waker = None

    def late(self, clock: Clock) -> bool:
        return clock.monotonic() > self.by

    def revoke(self) -> None:
        self.revoked = True
        if self.waker is not None:
            wake(self.waker)
