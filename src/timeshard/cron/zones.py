"""Time zones: loading an IANA zone by name, and mapping a local wall-clock time onto the real
instants at which it occurs (none in a DST gap, two in a DST fold).

Everything works on offsets as zoneinfo reports them, so shifts of any size (Lord Howe's half
hour, a zone changing its standard offset) are handled like the usual one-hour DST change.
Instants are integer milliseconds since the epoch, UTC.
"""

from __future__ import annotations

import difflib
import functools
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from timeshard.errors import InvalidArgument

_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_ONE_MS = timedelta(milliseconds=1)
_HALF_HOUR_MS = 30 * 60 * 1000
_HOUR_MS = 2 * _HALF_HOUR_MS
# How far ahead a clock setback can still take the wall clock back below its reading now: no
# zone changes its offset by a day or more, and offsets span less than 26 hours.
_LOOKAHEAD_MS = 26 * 60 * 60 * 1000
# Host-specific or leap-second variants: valid files under TZPATH, but not IANA zones we want.
_NOT_ZONES = ("localtime", "posixrules")
_NOT_ZONE_PREFIXES = ("posix/", "right/")


def _invalid_zone(problem: str) -> InvalidArgument:
    return InvalidArgument("timezone", problem)


@functools.cache
def _zone_names_by_lowercase() -> dict[str, str]:
    return {name.lower(): name for name in zoneinfo.available_timezones()}


def _suggestion(name: str) -> str:
    """' (did you mean ...?)' for a near miss, or ''. Only computed on the error path."""
    names = _zone_names_by_lowercase()
    exact = names.get(name.strip().lower())
    if exact is not None:
        return f" (did you mean {exact!r}?)"
    close = difflib.get_close_matches(name.strip().lower(), list(names), n=1, cutoff=0.8)
    return f" (did you mean {names[close[0]]!r}?)" if close else ""


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone called ``name``, or ``InvalidArgument("timezone", ...)``."""
    if not isinstance(name, str):
        raise _invalid_zone(f"must be a string, got {type(name).__name__}")
    if not name:
        raise _invalid_zone("a time zone is required: an IANA name such as 'Europe/Berlin'")
    if name not in _NOT_ZONES and not name.startswith(_NOT_ZONE_PREFIXES):
        try:
            return zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            pass  # answered below, with a suggestion
    raise _invalid_zone(
        f"unknown time zone {name!r}{_suggestion(name)}; use an IANA name such as "
        "'Europe/Berlin', 'America/New_York' or 'UTC'"
    )


def wall_ms(wall: datetime) -> int:
    """A naive wall-clock time as milliseconds, read as if it were UTC (for arithmetic)."""
    return (wall - _EPOCH_NAIVE) // _ONE_MS


def naive_wall(ms: int) -> datetime:
    return _EPOCH_NAIVE + timedelta(milliseconds=ms)


def local_time(zone: zoneinfo.ZoneInfo, instant_ms: int) -> datetime:
    """The aware local time of an instant."""
    return (_EPOCH_UTC + timedelta(milliseconds=instant_ms)).astimezone(zone)


def _offset_ms(zone: zoneinfo.ZoneInfo, instant_ms: int) -> int:
    offset = local_time(zone, instant_ms).utcoffset()
    assert offset is not None  # a ZoneInfo-aware datetime always has one
    return offset // _ONE_MS


@dataclass(frozen=True, kw_only=True, slots=True)
class WallTime:
    """Where one local wall-clock time falls on the real timeline."""

    kind: Literal["normal", "gap", "fold"]
    first_ms: int
    """normal: the instant; gap: the first instant after the gap; fold: the first occurrence.
    It never decreases as the wall time increases, which is what lets a caller stop early."""
    second_ms: int
    """fold: the second occurrence; otherwise the same as ``first_ms``."""
    gap_start: datetime | None = None
    """gap: the first wall-clock time the clocks skip."""
    gap_end: datetime | None = None
    """gap: the wall-clock time they jump to (the reading at ``first_ms``); every wall time
    from this one up to ``gap_end`` is in the same gap."""


def resolve(zone: zoneinfo.ZoneInfo, wall: datetime) -> WallTime:
    """Map a naive local wall time onto instants in ``zone``."""
    base = wall_ms(wall)
    # PEP 495: fold=0 reads the wall time with the offset in force before a transition,
    # fold=1 with the one after. They differ only at a gap or a fold.
    before = wall.replace(tzinfo=zone, fold=0).utcoffset()
    after = wall.replace(tzinfo=zone, fold=1).utcoffset()
    assert before is not None and after is not None
    if before == after:
        instant = base - before // _ONE_MS
        return WallTime(kind="normal", first_ms=instant, second_ms=instant)
    early, late = sorted((base - before // _ONE_MS, base - after // _ONE_MS))
    if wall_ms(local_time(zone, early).replace(tzinfo=None)) == base:
        return WallTime(kind="fold", first_ms=early, second_ms=late)
    transition = _transition_between(zone, early, late)
    return WallTime(
        kind="gap",
        first_ms=transition,
        second_ms=transition,
        gap_start=naive_wall(transition + before // _ONE_MS),
        gap_end=naive_wall(transition + after // _ONE_MS),
    )


def _transition_between(zone: zoneinfo.ZoneInfo, early_ms: int, late_ms: int) -> int:
    """The instant in (early, late] at which the offset stops being the one in force at
    ``early``. Zone transitions fall on whole seconds, so a binary search on seconds finds it
    in a dozen steps for an hour-long gap."""
    offset = _offset_ms(zone, early_ms)
    low, high = early_ms // 1000, -(-late_ms // 1000)
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_ms(zone, middle * 1000) == offset:
            low = middle
        else:
            high = middle
    return high * 1000


def earliest_wall_after(zone: zoneinfo.ZoneInfo, instant_ms: int) -> int:
    """A lower bound (as ``wall_ms``) on the wall clock of every instant after ``instant_ms``.

    Usually the wall clock at ``instant_ms`` itself; but when the clocks are about to be set
    back, later instants read earlier wall times: the earliest reading just after each
    setback in the next day bounds the result too.
    """
    lowest = instant_ms + _offset_ms(zone, instant_ms)
    for setback, reading in _setbacks_from_hour(zone, instant_ms // _HOUR_MS):
        if instant_ms < setback <= instant_ms + _LOOKAHEAD_MS:
            lowest = min(lowest, reading)
    return lowest


@functools.lru_cache(maxsize=4096)
def _setbacks_from_hour(zone: zoneinfo.ZoneInfo, hour: int) -> tuple[tuple[int, int], ...]:
    """Each instant in the lookahead from the start of ``hour`` (hours since the epoch, plus an
    hour) at which the offset decreases, with the wall clock (``wall_ms``) just after it.

    Cached per zone and hour: a dispatcher asks about the same few hours over and over.
    Zones never change offset twice within half an hour, so half-hourly samples see each
    change.
    """
    setbacks = []
    previous_at = hour * _HOUR_MS
    previous = _offset_ms(zone, previous_at)
    end = previous_at + _HOUR_MS + _LOOKAHEAD_MS
    for at in range(previous_at + _HALF_HOUR_MS, end + 1, _HALF_HOUR_MS):
        offset = _offset_ms(zone, at)
        if offset < previous:
            setback = _transition_between(zone, previous_at, at)
            setbacks.append((setback, setback + _offset_ms(zone, setback)))
        previous_at, previous = at, offset
    return tuple(setbacks)


@dataclass(frozen=True, kw_only=True, slots=True)
class Transition:
    """An instant at which a zone's UTC offset changes: daylight saving starting (a gap: the
    clocks skip from ``wall_from`` to ``wall_to``) or ending (a fold: they go back, and the
    wall times from ``wall_to`` up to ``wall_from`` happen twice)."""

    at_ms: int
    offset_before_ms: int
    offset_after_ms: int

    @property
    def gap(self) -> bool:
        return self.offset_after_ms > self.offset_before_ms

    @property
    def wall_from(self) -> datetime:
        """The wall clock's reading as the change comes (02:00 in spring in Europe/Berlin)."""
        return naive_wall(self.at_ms + self.offset_before_ms)

    @property
    def wall_to(self) -> datetime:
        """The reading it jumps to (03:00 in spring in Europe/Berlin, 02:00 in autumn)."""
        return naive_wall(self.at_ms + self.offset_after_ms)


_YEAR_MS = 365 * 24 * _HOUR_MS
_SAMPLE_MS = 2 * _HOUR_MS
"""Transitions are found by sampling the offset this often: no zone changes its offset twice
within two hours (that would be missed)."""


def transitions_between(zone: zoneinfo.ZoneInfo, after_ms: int, until_ms: int) -> list[Transition]:
    """The zone's transitions in ``(after_ms, until_ms]``, ascending (a cached scan per year,
    so asking again about the same years costs a lookup)."""
    out: list[Transition] = []
    for year in range(after_ms // _YEAR_MS, until_ms // _YEAR_MS + 1):
        out += [t for t in _transitions_of_year(zone, year) if after_ms < t.at_ms <= until_ms]
    return out


@functools.lru_cache(maxsize=1024)
def _transitions_of_year(zone: zoneinfo.ZoneInfo, year: int) -> tuple[Transition, ...]:
    """The transitions in ``(year * _YEAR_MS, (year + 1) * _YEAR_MS]`` (365-day "years" from
    the epoch: only a way to cut time into cached pieces)."""
    found = []
    previous_at = year * _YEAR_MS
    previous = _offset_ms(zone, previous_at)
    for at in range(previous_at + _SAMPLE_MS, previous_at + _YEAR_MS + 1, _SAMPLE_MS):
        offset = _offset_ms(zone, at)
        if offset != previous:
            change = _transition_between(zone, previous_at, at)
            found.append(
                Transition(at_ms=change, offset_before_ms=previous, offset_after_ms=offset)
            )
        previous_at, previous = at, offset
    return tuple(found)
