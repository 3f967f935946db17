"""Fire times of a ``CronSpec``: croniter enumerates the matching local wall-clock times, and
each is placed on the real timeline under the schedule's DST policies.

Why not croniter's own time-zone support: it follows neither the default rule nor the
overrides (with croniter 7, ``30 1 * * *`` in America/New_York fires twice on the day the
clocks go back). Enumerating naive wall times keeps croniter to what it is good at — field
matching, ``L``, month lengths, the day-of-month/day-of-week OR (when ``CronSpec.day_or`` says
it applies) — and leaves time zones to us.

Wall times are visited in increasing order, but their instants are not quite in order: in a
fold, the second pass through a repeated hour comes after later wall times' first passes. Two
facts make the search exact without scanning: no instant after ``after_ms`` has a wall time
below ``earliest_wall_after``, so that is where enumeration starts; and the earliest instant of
a wall time (``WallTime.first_ms``) never decreases, so once it passes an instant collected so
far, nothing later can come before that instant and it is final.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from croniter import CroniterBadDateError, croniter

from timeshard.clock import format_rfc3339
from timeshard.cron.spec import CronSpec
from timeshard.cron.zones import (
    WallTime,
    earliest_wall_after,
    local_time,
    naive_wall,
    resolve,
)
from timeshard.errors import InvalidArgument

# Bounds of ``after_ms``: from the epoch to the start of 9999, so that every computation on
# the way (offsets, a day of look-ahead) stays inside what ``datetime`` can represent.
MIN_AFTER_MS = 0
MAX_AFTER_MS = 253370764800000  # 9999-01-01T00:00:00Z

_Kind = Literal["exact", "shifted", "fold-only-first", "fold-first", "fold-second"]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Fire:
    at_ms: int
    wall: datetime
    """The matching local time this run is for."""
    kind: _Kind
    shifted_from: datetime | None = None
    """The first matching local time a DST gap skipped whose run moved to this instant."""
    gap: tuple[datetime, datetime] | None = None
    """That gap, as the wall-clock interval the clocks skip."""


def _merge(known: _Fire, new: _Fire) -> _Fire:
    """One run for two wall times on one instant. That happens only when a time shifted out
    of a gap meets another (shifted, or the first real time after the gap): the run keeps the
    real time if there is one and remembers the first shifted one."""
    kept = known if new.kind == "shifted" else new
    return replace(
        kept, shifted_from=known.shifted_from or new.shifted_from, gap=known.gap or new.gap
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PreviewEntry:
    """One upcoming fire time, as ``preview`` shows it."""

    at_ms: int
    """The instant, milliseconds since the epoch, UTC."""
    utc: str
    """RFC 3339 in UTC, e.g. ``2026-03-08T07:00:00Z``."""
    local: str
    """ISO 8601 local time with its offset, e.g. ``2026-03-08T03:00:00-04:00``."""
    note: str | None
    """What daylight saving did to this run, if anything (shifted out of a gap, one of two
    runs in a repeated hour, ...); None for an ordinary run."""


def _fires_of(wall: datetime, placed: WallTime, spec: CronSpec) -> list[_Fire]:
    """The runs one matching wall time produces under the spec's DST policies."""
    if placed.kind == "normal":
        return [_Fire(at_ms=placed.first_ms, wall=wall, kind="exact")]
    if placed.kind == "gap":
        if spec.gap_policy == "skip":
            return []
        assert placed.gap_start is not None and placed.gap_end is not None
        gap = (placed.gap_start, placed.gap_end)
        return [_Fire(at_ms=placed.first_ms, wall=wall, kind="shifted", shifted_from=wall, gap=gap)]
    if spec.fold_policy == "first":
        return [_Fire(at_ms=placed.first_ms, wall=wall, kind="fold-only-first")]
    return [
        _Fire(at_ms=placed.first_ms, wall=wall, kind="fold-first"),
        _Fire(at_ms=placed.second_ms, wall=wall, kind="fold-second"),
    ]


def _check_window(after_ms: int, count: int) -> None:
    if isinstance(after_ms, bool) or not isinstance(after_ms, int):
        raise InvalidArgument("after_ms", f"must be an integer, got {type(after_ms).__name__}")
    if not MIN_AFTER_MS <= after_ms < MAX_AFTER_MS:
        raise InvalidArgument(
            "after_ms", f"{after_ms} is outside 1970-01-01 .. 9999-01-01 (epoch milliseconds)"
        )
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidArgument("count", f"must be a non-negative integer, got {count!r}")


def matching_walls_from(spec: CronSpec, start: datetime) -> Any:
    """croniter over the local wall times that match, from ``start`` (inclusive, to the
    second) on. croniter itself returns only times strictly after its start time."""
    first = start.replace(microsecond=0) - timedelta(seconds=1)
    return croniter(spec.croniter_expression, first, ret_type=datetime, day_or=spec.day_or)


def _next_fires(
    spec: CronSpec, after_ms: int, count: int, until_ms: int | None = None
) -> list[_Fire]:
    """The first ``count`` fires after ``after_ms`` (and at or before ``until_ms``)."""
    _check_window(after_ms, count)
    zone = spec.zone
    walls = matching_walls_from(spec, naive_wall(earliest_wall_after(zone, after_ms)))
    final: list[_Fire] = []
    pending: dict[int, _Fire] = {}
    queue: list[int] = []  # the instants in ``pending``, as a heap
    while len(final) < count:
        try:
            wall: datetime = walls.get_next(datetime)
        except (CroniterBadDateError, ValueError, OverflowError):
            break  # no match left before the year 10000 (or in croniter's 50-year horizon)
        placed = resolve(zone, wall)
        while queue and queue[0] < placed.first_ms and len(final) < count:
            final.append(pending.pop(heapq.heappop(queue)))
        if until_ms is not None and placed.first_ms > until_ms:
            break  # this wall time's runs, and every later one's, come after until_ms
        for fire in _fires_of(wall, placed, spec):
            if fire.at_ms <= after_ms:
                continue
            known = pending.get(fire.at_ms)
            if known is None:
                heapq.heappush(queue, fire.at_ms)
                pending[fire.at_ms] = fire
            else:
                pending[fire.at_ms] = _merge(known, fire)
        if placed.gap_end is not None:
            # The rest of the gap maps to the same instant (or to nothing): skip past it
            # rather than visit every matching second of it.
            walls = matching_walls_from(spec, placed.gap_end)
    while queue and len(final) < count:
        final.append(pending.pop(heapq.heappop(queue)))
    if until_ms is not None:
        return [fire for fire in final if fire.at_ms <= until_ms]
    return final


def next_fire_times(spec: CronSpec, after_ms: int, count: int) -> list[int]:
    """The next ``count`` fire instants strictly after ``after_ms``, ascending, each once.

    Times are epoch milliseconds, UTC. Fewer than ``count`` only if the schedule has no more
    fire times before the year 10000. Raises ``InvalidArgument`` for an ``after_ms`` outside
    1970..9999 or a negative ``count``.
    """
    return [fire.at_ms for fire in _next_fires(spec, after_ms, count)]


def fire_times_between(spec: CronSpec, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """The fire instants in ``(after_ms, until_ms]``, ascending, at most ``limit`` (the oldest).

    The work is in proportion to what is returned, however far ``until_ms`` is."""
    if until_ms <= after_ms or limit <= 0:
        return []
    return [fire.at_ms for fire in _next_fires(spec, after_ms, limit, until_ms)]


def newest_fire_times(spec: CronSpec, after_ms: int, until_ms: int, count: int) -> list[int]:
    """The newest ``count`` fire instants in ``(after_ms, until_ms]``, ascending.

    Found without visiting every fire time in between (a per-second schedule over a day has
    86,400): windows are read backwards from ``until_ms``, each twice as long as the one before
    while fires are sparse, and half as long when one would hold more than twice what is still
    needed. The work is about ``count`` fire times and a few dozen windows."""
    found: list[int] = []  # newest first
    top, span = until_ms, _FIRST_WINDOW_MS
    while len(found) < count and top > after_ms:
        start = max(after_ms, top - span)
        cap = 2 * (count - len(found)) + 64
        window = fire_times_between(spec, start, top, cap + 1)
        if len(window) > cap and span > _FIRST_WINDOW_MS:
            span //= 2  # dense here: a shorter window, so as not to read more than needed
            continue
        if len(window) > cap:  # a second holds them all (never, with whole-second fires)
            window = fire_times_between(spec, start, top, top - start + 1)
        found.extend(reversed(window))
        top, span = start, span * 2
    return sorted(found[:count])


_FIRST_WINDOW_MS = 1000


def next_fire(spec: CronSpec, after_ms: int) -> int:
    """The first fire instant strictly after ``after_ms`` (epoch milliseconds, UTC)."""
    fires = _next_fires(spec, after_ms, 1)
    if not fires:
        raise InvalidArgument(
            "after_ms", f"{spec.expression!r} has no fire time after {after_ms} before year 10000"
        )
    return fires[0].at_ms


def _clock(wall: datetime) -> str:
    return wall.strftime("%H:%M:%S" if wall.second else "%H:%M")


def _note(fire: _Fire, spec: CronSpec) -> str | None:
    """What daylight saving did to this run, in words, or None if nothing."""
    day = f"on {fire.wall.date().isoformat()} in {spec.timezone}"
    skipped = ""
    if fire.gap is not None:
        skipped = f"the time the clocks skip ({_clock(fire.gap[0])}-{_clock(fire.gap[1])})"
    if fire.kind == "shifted":
        assert fire.gap is not None
        return (
            f"{_clock(fire.wall)} {day} falls in {skipped}; runs at {_clock(fire.gap[1])} "
            "instead (once, with any other run due in the gap)"
        )
    repeated = f"{_clock(fire.wall)} {day} occurs twice (clocks go back)"
    notes = {
        "exact": [],
        "fold-only-first": [f"{repeated}; runs at the first occurrence only"],
        "fold-first": [f"{repeated}; first of two runs"],
        "fold-second": [f"{repeated}; second of two runs"],
    }[fire.kind]
    if fire.shifted_from is not None:
        notes.append(f"also covers the runs due in {skipped} {day}")
    return "; ".join(notes) or None


def preview(spec: CronSpec, after_ms: int, count: int) -> list[PreviewEntry]:
    """The next ``count`` fire times after ``after_ms`` in UTC and local time, with a note on
    each run daylight saving moved, doubled or merged: what a user sees before saving."""
    zone = spec.zone
    return [
        PreviewEntry(
            at_ms=fire.at_ms,
            utc=format_rfc3339(fire.at_ms),
            local=local_time(zone, fire.at_ms).isoformat(timespec="seconds"),
            note=_note(fire, spec),
        )
        for fire in _next_fires(spec, after_ms, count)
    ]
