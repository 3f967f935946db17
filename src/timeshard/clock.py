"""Time comes from here: an injected clock, so logic can be tested without sleeping.

Times are integers of milliseconds since the Unix epoch, UTC (the stored precision).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time, UTC, in milliseconds."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for local deadlines)."""

    async def sleep(self, seconds: float) -> None:
        """Sleep on this clock."""


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to; sleepers wake when it passes their deadline."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self._now_ms = start_ms
        self._mono = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        self._now_ms += round(seconds * 1000)
        self._mono += seconds
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)


def now_us(clock: Clock) -> int:
    """Wall-clock time in microseconds: to the microsecond on the system clock, in whole
    milliseconds on any other (a fake or shifted one). Both cut the time down, never up, so a
    wait measured from it to a due time is never short (a worker's ``starts_in``: from
    ``now_ms`` it would be half a millisecond too long on average)."""
    if type(clock) is SystemClock:
        return time.time_ns() // 1000
    return clock.now_ms() * 1000


def wake(fut: asyncio.Future[None]) -> None:
    """Complete a waker made for ``sleep_or_wake`` (a no-op once it is done)."""
    if not fut.done():
        fut.set_result(None)


async def sleep_or_wake(clock: Clock, delay: float, waker: asyncio.Future[None]) -> None:
    """Sleep ``delay`` seconds on ``clock``, or less if ``waker`` completes first (``wake``).
    On the system clock it is one timer on the loop, not a task per wait: trickling jobs wake a
    dispatcher or a long-polled claim once each, and two tasks and a wait per step were most of
    their cost. On another clock (a fake one in tests) it races the clock's sleep."""
    if type(clock) is SystemClock:
        timer = asyncio.get_running_loop().call_later(delay, wake, waker)
        try:
            await waker
        finally:
            timer.cancel()
        return
    # The end is fixed now, not when the sleeper task first runs: a fake clock moved in
    # between would otherwise push it back by as much (a dispatcher woke a step late).
    sleeper = asyncio.ensure_future(_sleep_until(clock, clock.monotonic() + delay))
    try:
        await asyncio.wait({waker, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waker.cancel()
        sleeper.cancel()


async def _sleep_until(clock: Clock, until: float) -> None:
    await clock.sleep(until - clock.monotonic())


def to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def from_datetime(dt: datetime) -> int:
    if dt.tzinfo is None:
        raise ValueError("naive datetime: give a time zone (UTC times end in Z)")
    return round(dt.timestamp() * 1000)


def format_rfc3339(ms: int) -> str:
    """RFC 3339 UTC with millisecond precision, e.g. 2026-03-08T07:00:00.250Z."""
    dt = to_datetime(ms)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    frac = ms % 1000
    return f"{text}.{frac:03d}Z" if frac else f"{text}Z"


def parse_rfc3339(text: str) -> int:
    """Parse an RFC 3339 / ISO 8601 time with an offset (or Z) into epoch milliseconds."""
    raw = text.strip()
    try:
        dt = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"not an RFC 3339 time: {text!r} (e.g. 2026-03-08T07:00:00Z)") from exc
    return from_datetime(dt)
