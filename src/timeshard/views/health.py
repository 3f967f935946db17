"""Health that tells the truth: the watcher behind a node's gRPC health status.

A node can do its work only while its store answers and, with ZooKeeper, while its session is
live (without it the node has let go of every shard). The watcher checks both every
``every_s`` seconds — the store with a cheap read (``get_shard(0)``) that must answer within
``timeout_s``, the coordinator by its session state — and reports SERVING or NOT_SERVING to
``set_serving`` whenever the answer changes, so load balancers and Kubernetes readiness stop
sending traffic to a node that can only answer UNAVAILABLE, and send it again when it recovers.

The same task keeps the dead-letter queue's size for the metrics and the status page. Only the
node that owns shard 0 counts it (one count per cluster), every ``dead_letters_every_s``
seconds, or a second after a job died on this node, and never more often than ten times the
last count took: ``Store.dead_letters`` reads the dead jobs only (on Cassandra from their
index, ``dead_letters``; a scan of every job there cost a node a core for a minute at a
million stored jobs, and grew with them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from timeshard.errors import TimeshardError
from timeshard.model import Job
from timeshard.node import Node

log = logging.getLogger(__name__)

SetServing = Callable[[bool], Awaitable[None]]


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthConfig:
    every_s: float = 1.0
    timeout_s: float = 2.0
    dead_letters_every_s: float = 60.0
    dead_letters_max: int = 100_000
    """Stop counting past this many (the gauge then shows at least this many)."""
    latest_dead: int = 10


class HealthWatcher:
    def __init__(
        self, node: Node, set_serving: SetServing, config: HealthConfig | None = None
    ) -> None:
        self._node = node
        self._set_serving = set_serving
        self.config = config or HealthConfig()
        self._serving: bool | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._next_count_ms = 0
        self._soonest_ms = 0
        """A dead letter written by this node makes the next count due this soon."""

    @property
    def serving(self) -> bool:
        return self._node.metrics.health.serving

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="health-watch"),
            asyncio.create_task(self._count_loop(), name="dead-letter-count"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _watch(self) -> None:
        while True:
            await self.check()
            await self._node.clock.sleep(self.config.every_s)

    async def check(self) -> bool:
        """Probe the store and the coordinator once; report a change. Returns serving."""
        node, health = self._node, self._node.metrics.health
        store_ok, error = await self._probe_store()
        health.store_ok, health.store_error = store_ok, error
        health.coordinator_ok = node.coordinator.connected
        health.checked_at_ms = node.clock.now_ms()
        serving = health.serving
        if serving != self._serving:
            if self._serving is not None or not serving:
                self._log_change(serving)
            self._serving = serving
            await self._set_serving(serving)
        return serving

    async def _probe_store(self) -> tuple[bool, str]:
        try:
            async with asyncio.timeout(self.config.timeout_s):
                await self._node.store.get_shard(0)
        except TimeoutError:
            return False, f"no answer within {self.config.timeout_s:g} s"
        except TimeshardError as exc:
            return False, exc.message
        except Exception as exc:  # a driver error the store did not translate: still down
            return False, f"{type(exc).__name__}: {exc}"
        return True, ""

    def _log_change(self, serving: bool) -> None:
        health = self._node.metrics.health
        if serving:
            log.info("health: SERVING (store and coordinator reachable again)")
            return
        why = []
        if not health.store_ok:
            why.append(f"store unreachable ({health.store_error})")
        if not health.coordinator_ok:
            why.append("coordinator session suspended or lost")
        log.warning("health: NOT_SERVING: %s", "; ".join(why), extra={"event": "health.down"})

    # -- the dead-letter queue's size -----------------------------------------------------

    async def _count_loop(self) -> None:
        while True:
            await self.count_dead_letters()
            await self._node.clock.sleep(self.config.every_s)

    async def count_dead_letters(self, *, force: bool = False) -> None:
        """Count the dead-letter queue if this node owns shard 0 and the count is due."""
        node, health = self._node, self._node.metrics.health
        now = node.clock.now_ms()
        if 0 not in node.coordinator.owned():
            health.dead_letters = None  # another node counts
            return
        dead = self._node.metrics.dead
        fresh = bool(dead) and dead[0].at_ms > health.dead_letters_at_ms  # one died here since
        if not force and now < (self._soonest_ms if fresh else self._next_count_ms):
            return
        started = node.clock.monotonic()
        try:
            count, latest = await self._count()
        except TimeshardError as exc:
            log.info("dead letters not counted: %s", exc.message)
            self._next_count_ms = now + round(self.config.every_s * 1000)
            return
        took_ms = (node.clock.monotonic() - started) * 1000
        health.dead_letters, health.latest_dead = count, latest
        health.dead_letters_at_ms = now
        every_ms = self.config.dead_letters_every_s * 1000
        self._next_count_ms = now + round(max(every_ms, 10 * took_ms))
        self._soonest_ms = now + round(max(self.config.every_s * 1000, 10 * took_ms))

    async def _count(self) -> tuple[int, list[Job]]:
        cfg = self.config
        return await self._node.store.dead_letters(
            limit=cfg.dead_letters_max, latest=cfg.latest_dead
        )
