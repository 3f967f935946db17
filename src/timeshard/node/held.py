"""What a shard dispatcher holds in memory: every entry it read or was told of since its cursor,
the ones still pending (not handled: they hold the cursor at their minute, invariant 3), the
order it looks at them in (a heap by due time, and a second heap of rechecks put off until a
later time), the jobs claimed through its node, and the rows written with entries it was told
of. The dispatcher's bucket reading fills it; its entry decisions and its loop work it off.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from timeshard.model import BucketEntry, Job


class HeldEntries:
    def __init__(self, *, wake: Callable[[], None]) -> None:
        self._wake = wake  # cut the dispatcher loop's wait short
        self.known: set[BucketEntry] = set()
        self.rows: dict[BucketEntry, Job] = {}  # rows this node wrote with the entry (notify)
        self.pending: dict[int, set[BucketEntry]] = {}
        self.heap: list[BucketEntry] = []
        self.later: list[tuple[int, BucketEntry]] = []  # (when, entry): delayed rechecks
        self.rewritten: set[BucketEntry] = set()
        """Pending entries written again before they were handled: handling one (the decision
        that wrote it, or one made before the write) leaves it pending, looked at once more."""
        self.claimed: dict[str, tuple[int, list[BucketEntry]]] = {}
        """Jobs claimed through this node and running: their lease end, and the entries that
        made them ready, still pending (``running``)."""

    def add(self, e: BucketEntry) -> bool:
        """An entry read from the store: held once; one read again, even after it was
        handled, is not looked at again."""
        if e in self.known:
            return False
        self.known.add(e)
        self.pending.setdefault(e.minute, set()).add(e)
        heapq.heappush(self.heap, e)
        return True

    def written(self, e: BucketEntry) -> bool:
        """An entry just written (by this node, or one it is told of): pending, even if an
        equal one was handled before. An entry is (shard, minute, due time, job), so two
        writes for one job in one millisecond are one entry: a lease check that the job's
        end handled, and the entry its give-back wrote then, due at once (invariant 3). One
        written while an equal one is pending, perhaps being decided right now (a lease found
        over at the millisecond it ended, its retry due then), outlives that one's handling.
        Returns whether it became pending (False: it was already)."""
        if e not in self.known:
            return self.add(e)
        at = self.pending.setdefault(e.minute, set())
        if e in at:
            self.rewritten.add(e)
            return False
        at.add(e)
        heapq.heappush(self.heap, e)
        return True

    def handled(self, entries: Iterable[BucketEntry]) -> None:
        again = False
        for e in entries:
            self.claimed.pop(e.job_id, None)
            if e in self.rewritten:  # written again since it was taken: looked at once more
                self.rewritten.discard(e)
                heapq.heappush(self.heap, e)
                again = True
                continue
            self.pending.get(e.minute, set()).discard(e)
        if again:
            self._wake()

    def recheck(self, entries: Iterable[BucketEntry]) -> None:
        """A claim did not apply: look at these jobs again now."""
        for e in entries:
            if e in self.known:
                heapq.heappush(self.heap, e)
        self._wake()
