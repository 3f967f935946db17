"""What the console shows live, at a bounded cost: one sampler per node, whatever the number
of open consoles. Once a second it reads the node's own memory (its counters, its windows of
schedule-to-start, its ready queues) — never the store — and keeps ten minutes of per-type
points for the plots. Each open console's event stream (server-sent events) renders the latest
sample; so an open console costs no store read at all, and the sampler reads nothing while no
console has been open for a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from timeshard.node import Node
from timeshard.views.status import TypeWaiting, unclaimed_rows

log = logging.getLogger(__name__)

EVERY_S = 1.0
KEEP = 600
"""Points kept per type for the plots: ten minutes at one a second."""
IDLE_S = 60.0
"""The sampler sleeps once no console has asked for a sample for this long."""
WINDOW_S = 10.0
"""Schedule-to-start is taken over the last 10 s at each point."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeLive:
    job_type: str
    totals: dict[str, int]
    fire_rate: float
    """Jobs handed to workers per second over the last sample interval."""
    start_p50_ms: float
    start_p99_ms: float
    waiting: TypeWaiting | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    at_ms: int
    types: list[TypeLive]
    ready_due: int
    owned: int
    num_shards: int
    dead_letters: int | None
    serving: bool


@dataclass(slots=True)
class Series:
    """Per type: (at_ms, fire rate, p99 schedule-to-start ms), oldest first."""

    points: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=KEEP))

    def rates(self) -> list[tuple[int, float]]:
        return [(at, rate) for at, rate, _ in self.points]

    def lateness(self) -> list[tuple[int, float]]:
        return [(at, late) for at, _, late in self.points]


class Sampler:
    def __init__(self, node: Node) -> None:
        self._node = node
        self.latest: Sample | None = None
        self.series: dict[str, Series] = {}
        self._claimed: dict[str, int] = {}
        self._last_ms = 0
        self._wanted_at = -IDLE_S
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._stopping = False
        self.samples_taken = 0

    def want(self) -> Sample:
        """A console wants samples: (re)start the sampler; the latest sample, taken now if
        there is none yet."""
        self._wanted_at = self._node.clock.monotonic()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="console-sampler")
        if self.latest is None:
            self.sample()
        assert self.latest is not None
        return self.latest

    def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        clock = self._node.clock
        while clock.monotonic() - self._wanted_at < IDLE_S and not self._stopping:
            await clock.sleep(EVERY_S)
            try:
                self.sample()
            except Exception:  # a sample that failed must not end the live view
                log.exception("console: a live sample failed")
            async with self._changed:
                self._changed.notify_all()

    def sample(self) -> Sample:
        node = self._node
        now = node.clock.now_ms()
        seconds = max(0.001, (now - self._last_ms) / 1000) if self._last_ms else EVERY_S
        totals = node.metrics.totals()
        waiting = {w.job_type: w for w in unclaimed_rows(node, every=True)}
        windows = node.metrics.start_windows
        names = sorted({*totals, *waiting, *node.config.types, *node.type_policies.flows()})
        types = []
        for t in names:
            counts = totals.get(t, {})
            claimed = counts.get("claimed", 0)
            rate = max(0, claimed - self._claimed.get(t, claimed)) / seconds
            self._claimed[t] = claimed
            window = windows.get(t)
            start = window.percentiles(WINDOW_S) if window is not None else None
            live = TypeLive(
                job_type=t,
                totals=counts,
                fire_rate=rate,
                start_p50_ms=start.p50_ms if start else 0.0,
                start_p99_ms=start.p99_ms if start else 0.0,
                waiting=waiting.get(t),
            )
            types.append(live)
            self.series.setdefault(t, Series()).points.append((now, rate, live.start_p99_ms))
        self._last_ms = now
        self.latest = Sample(
            at_ms=now,
            types=types,
            ready_due=node.ready.count(),
            owned=len(node.dispatching),
            num_shards=node.num_shards,
            dead_letters=node.metrics.health.dead_letters,
            serving=node.metrics.health.serving,
        )
        self.samples_taken += 1
        return self.latest

    async def stream(self) -> AsyncIterator[Sample]:
        """Each new sample, until the sampler stops (the HTTP server's shutdown)."""
        yield self.want()
        while not self.stopped():
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5 * EVERY_S):
                        await self._changed.wait()
            if self.stopped():
                return
            yield self.want()

    def stopped(self) -> bool:
        return self._stopping
