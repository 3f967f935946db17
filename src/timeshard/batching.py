"""Group commit per key (a store partition; a node the worker sends results to): while one
batch for a key is in flight, the items that arrive for it wait and go out together in the next
one (at most ``max_items`` each). A lone item goes at once (or after ``linger_s``, when given:
the items that come meanwhile join it); under load, each key has one batch in flight and the
next one filling. Used by the Cassandra store and the worker SDK
alike, so it stands in the kernel and imports nothing of timeshard."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class GroupCommit(Generic[K, T]):
    """``submit(key, item)`` queues ``item`` for partition ``key``; ``run(key, items)`` writes
    a batch and must settle every item (each item carries its own future)."""

    def __init__(
        self,
        run: Callable[[K, list[T]], Awaitable[None]],
        *,
        max_items: int,
        fail: Callable[[T, BaseException], None],
        name: str,
        linger_s: float = 0.0,
    ) -> None:
        self._run = run
        self._linger_s = linger_s
        self._max = max_items
        self._fail = fail
        self._name = name
        self._queues: dict[K, list[T]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, key: K, item: T) -> None:
        queue = self._queues.get(key)
        if queue is not None:
            queue.append(item)  # a flusher for this partition is running: it takes it
            return
        self._queues[key] = [item]
        task = asyncio.create_task(self._flush(key), name=f"{self._name}-{key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def waiting(self, key: K) -> bool:
        """Items of ``key`` are queued for a batch still to go (they join its next one)."""
        return bool(self._queues.get(key))

    async def _flush(self, key: K) -> None:
        await asyncio.sleep(self._linger_s)  # let the items of this loop turn (or of the
        # linger) join the first batch
        try:
            while True:
                queue = self._queues[key]
                if not queue:
                    return
                items, self._queues[key] = queue[: self._max], queue[self._max :]
                try:
                    await self._run(key, items)
                except BaseException as exc:
                    for item in items:
                        self._fail(item, exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
        finally:
            for item in self._queues.pop(key, []):
                self._fail(item, asyncio.CancelledError())

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
