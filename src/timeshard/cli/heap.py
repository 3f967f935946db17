"""Garbage-collector settings for the long-running processes (``server``, ``dev``, ``worker``).

CPython's default thresholds run a young collection every 700 net container allocations and,
every 100 of those, a full one that walks every live object. A node holds many long-lived
objects (imported modules, the entries and rows it read ahead, its metrics), so a full
collection took 0.2-0.35 s in a steady load test, with every job of the process waiting
behind it, and the collector used about 4 % of the server's time. Objects that live as long
as the process are moved out of the collector's sight once it has started (``gc.freeze``), and
collections run less often: the garbage that only the collector can free (reference cycles)
is bounded by the young threshold, tens of thousands of objects.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net container allocations between young collections (CPython's default: 700)."""
OLDER_EVERY = (20, 20)
"""A middle collection every 20 young ones, a full one every 20 middle ones (default 10, 10)."""


def tune_collector() -> None:
    """Call once at start, before the process builds its long-lived state."""
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_EVERY)


def freeze_startup_objects() -> None:
    """Call once the process has started (modules imported, the node or worker built): what
    exists now lives as long as the process, and no collection need walk it again."""
    gc.collect()
    gc.freeze()
