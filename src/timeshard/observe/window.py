"""Lateness over the last minutes, for the status page and ``timeshard status``.

Prometheus keeps the long history (``timeshard_fire_lateness_seconds``); a person looking at one
node wants "how late are jobs firing right now" without a query. Samples go into fixed
geometric buckets (each 10 % wider than the last, from 1 ms to about two days), one set per
10-second slot, so a window's percentiles cost a merge of a few dozen small dicts, memory stays
bounded whatever the rate, and two nodes' windows merge exactly (``timeshard status`` adds the
nodes' buckets up).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from timeshard.clock import Clock

RATIO = 1.1
BOUNDS_MS: tuple[float, ...] = tuple(RATIO**k for k in range(205))
"""Upper bounds of the buckets, in milliseconds (1 ms ... about 50 hours)."""
SLOT_MS = 10_000
DEFAULT_WINDOW_S = 300.0


def bucket_of(lateness_ms: float) -> int:
    return min(bisect.bisect_left(BOUNDS_MS, lateness_ms), len(BOUNDS_MS) - 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Percentiles:
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, float]:
        return {
            "count": self.count,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        }


def percentiles(buckets: Mapping[float, int], max_ms: float) -> Percentiles:
    """Percentiles from ``{upper bound ms: count}``: each is its bucket's upper bound (at most
    10 % above the true value), never above the largest sample."""
    total = sum(buckets.values())
    if total == 0:
        return Percentiles(count=0, p50_ms=0.0, p90_ms=0.0, p99_ms=0.0, max_ms=0.0)
    ordered = sorted(buckets.items())

    def at(q: float) -> float:
        rank = q * total
        seen = 0
        for bound, n in ordered:
            seen += n
            if seen >= rank:
                return min(bound, max_ms)
        return max_ms

    return Percentiles(count=total, p50_ms=at(0.5), p90_ms=at(0.9), p99_ms=at(0.99), max_ms=max_ms)


class LatenessWindow:
    """Lateness samples of the last ``keep_s`` seconds, in 10-second slots."""

    def __init__(self, clock: Clock, keep_s: float = 900.0) -> None:
        self._clock = clock
        self._keep = max(1, round(keep_s * 1000 / SLOT_MS))
        self._slots: dict[int, Counter[int]] = {}
        self._max: dict[int, float] = {}

    def add(self, lateness_ms: float) -> None:
        slot = self._clock.now_ms() // SLOT_MS
        counts = self._slots.get(slot)
        if counts is None:
            counts = self._slots[slot] = Counter()
            self._max[slot] = 0.0
            self._forget(slot)
        value = max(0.0, lateness_ms)
        counts[bucket_of(value)] += 1
        self._max[slot] = max(self._max[slot], value)

    def _forget(self, current: int) -> None:
        for old in [s for s in self._slots if s <= current - self._keep]:
            del self._slots[old], self._max[old]

    def _recent(self, window_s: float) -> Iterable[int]:
        now = self._clock.now_ms() // SLOT_MS
        first = now - max(1, round(window_s * 1000 / SLOT_MS)) + 1
        return [s for s in self._slots if first <= s <= now]

    def buckets(self, window_s: float = DEFAULT_WINDOW_S) -> tuple[dict[float, int], float]:
        """``({upper bound ms: count}, max ms)`` over the last ``window_s`` seconds."""
        merged: Counter[int] = Counter()
        top = 0.0
        for slot in self._recent(window_s):
            merged.update(self._slots[slot])
            top = max(top, self._max[slot])
        return {BOUNDS_MS[i]: n for i, n in sorted(merged.items())}, top

    def percentiles(self, window_s: float = DEFAULT_WINDOW_S) -> Percentiles:
        counts, top = self.buckets(window_s)
        return percentiles(counts, top)
