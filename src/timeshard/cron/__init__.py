"""Cron schedules: expressions, time zones and daylight saving, as
docs/architecture.md ("Time") states them.

Pure computation, no I/O. ``CronSpec`` is a validated schedule; ``next_fire_times``,
``next_fire`` and ``preview`` compute when it fires, in epoch milliseconds UTC.

The DST rule (cronie's, the default): a *fixed-time* schedule, one with no ``*`` in its minute
or hour field (``30 2 * * *``, ``0 9 * * 1-5``, ``0 1,2 * * *``), fires once at the first
instant after a gap that skips its local time, and once, at the first occurrence, for a local
time a fold repeats. A schedule with ``*`` in the minute or hour field (``*/15 * * * *``,
``30 * * * *``) fires at every real instant whose local time matches: the repeated hour runs
twice, the skipped hour not at all. ``dst_gap`` (``shift``/``skip``) and ``dst_fold``
(``first``/``both``) override the rule for any schedule. Runs that land on one instant (a time
shifted out of a gap meeting the first real time after it) fire once.
"""

from __future__ import annotations

from timeshard.cron.schedule import (
    PreviewEntry,
    fire_times_between,
    newest_fire_times,
    next_fire,
    next_fire_times,
    preview,
)
from timeshard.cron.spec import CronSpec, DstFold, DstGap

__all__ = [
    "CronSpec",
    "DstFold",
    "DstGap",
    "PreviewEntry",
    "fire_times_between",
    "newest_fire_times",
    "next_fire",
    "next_fire_times",
    "preview",
]
