"""Counters a store keeps about its own work, read by metrics and benchmarks.

A *Paxos round* is one lightweight transaction sent to Cassandra: a single conditional
statement or one conditional batch (however many rows it carries). The SQLite store counts
each write transaction as a round, so the two can be compared.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass(slots=True)
class StoreStats:
    paxos_rounds: int = 0
    """Conditional statements or conditional batches sent (one Paxos round each)."""
    conditional_rows: int = 0
    """Rows those rounds carried (a batch of 50 counts 50)."""
    rounds_by_kind: Counter[str] = field(default_factory=Counter)
    """The rounds by what they carried: a job-row batch by the kinds of its transitions
    (``claim``, ``complete``, ``claim+complete``...), any other by its statement's name."""
    bucket_partitions_read: int = 0
    """Bucket partitions read (a page of one partition counts one; a multi-partition read
    counts each partition it names)."""
    operations: Counter[str] = field(default_factory=Counter)
    """Calls by named operation."""
    errors: Counter[str] = field(default_factory=Counter)
    """Failed calls (store unavailable, timeouts) by named operation."""
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Total time spent in each named operation, for latency averages."""

    def round(self, rows: int = 1, kind: str = "") -> None:
        self.paxos_rounds += 1
        self.conditional_rows += rows
        self.rounds_by_kind[kind or "other"] += 1
