"""One timer for the due times of every shard dispatcher of a node.

A node owns up to ``DEFAULT_NUM_SHARDS`` (128) shard dispatchers; each waits for its next due
time (an entry coming due, a lease ending, a deadline, a refresh). With a timer of its own per
wait, the event loop held a timer per shard, created and cancelled at every step. Here they
share one: the waits sit in a heap by time, the loop holds a single timer for the earliest, and
each wait ends by its waker (``clock.wake``) as before.

It also keeps each dispatcher's earliest held entry (``note_due``), so a claim that lingers for
jobs coming due (``Claims._linger``) asks one heap rather than every dispatcher.

On a clock other than the system's (a fake one in tests) a wait is ``clock.sleep_or_wake``.
"""

from __future__ import annotations

import asyncio
import heapq

from timeshard.clock import Clock, SystemClock, sleep_or_wake, wake

SLACK = 256
"""Waits ended early that the heap keeps before it is rebuilt without them."""


class DueTimer:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._waits: list[tuple[float, int, asyncio.Future[None]]] = []  # (loop time, seq, waker)
        self._seq = 0
        self._handle: asyncio.TimerHandle | None = None
        self._armed_for = float("inf")
        self._due: dict[int, int] = {}  # shard -> due time (ms) of its earliest held entry
        self._due_heap: list[tuple[int, int]] = []  # (due ms, shard); stale ones skipped

    async def sleep(self, delay: float, waker: asyncio.Future[None]) -> None:
        """Sleep ``delay`` seconds, or less if ``waker`` completes first (``clock.wake``)."""
        if type(self._clock) is not SystemClock:
            await sleep_or_wake(self._clock, delay, waker)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        self._seq += 1
        heapq.heappush(self._waits, (when, self._seq, waker))
        if len(self._waits) > SLACK and len(self._waits) > 4 * len(self._due) + SLACK:
            self._waits = [w for w in self._waits if not w[2].done()]
            heapq.heapify(self._waits)
        if when < self._armed_for:
            self._arm(loop, when)
        await waker

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_for = when
        self._handle = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle, self._armed_for = None, float("inf")
        loop = asyncio.get_running_loop()
        now = loop.time()
        waits = self._waits
        while waits and (waits[0][0] <= now or waits[0][2].done()):
            wake(heapq.heappop(waits)[2])
        if waits:
            self._arm(loop, waits[0][0])

    # -- the earliest entry held by any dispatcher --------------------------------------------

    def note_due(self, shard: int, due_ms: int | None) -> None:
        """``shard``'s dispatcher holds its earliest entry due at ``due_ms`` (None: none)."""
        if due_ms is None:
            self._due.pop(shard, None)
            return
        if self._due.get(shard) == due_ms:
            return
        self._due[shard] = due_ms
        heapq.heappush(self._due_heap, (due_ms, shard))
        if len(self._due_heap) > 2 * len(self._due) + SLACK:
            self._due_heap = [(d, s) for s, d in self._due.items()]
            heapq.heapify(self._due_heap)

    def next_due(self) -> int | None:
        """The due time of the earliest entry any dispatcher holds (None: none)."""
        heap = self._due_heap
        while heap:
            due, shard = heap[0]
            if self._due.get(shard) == due:
                return due
            heapq.heappop(heap)
        return None
