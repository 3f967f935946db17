"""The matching local times a schedule's DST rule gives no run: those a gap skips under
``dst_gap=skip``, and the second pass through those a fold repeats under ``dst_fold=first``.

The fire times (``cron.schedule``) leave these out; the occurrence ledger records them, so
that "why did my 02:30 job not run on the 28th?" has an answer that names the rule. Each gap
or fold is one ``DstSkip`` (a per-second schedule skips 3,600 times in an hour's gap), keyed
by an instant that is never a fire time of the schedule:

- a gap: one millisecond before the transition (fire times are whole seconds, and so are
  transitions), so it sorts just before the first run after the gap;
- a fold: the second instant of the first repeated local time that matches, up to the second
  instant of the last one (``last_ms``): under ``dst_fold=first`` no fire time lies in between.

A skip is decided with the schedule's first fire time after its key (``decided_with``): every
fire time is decided exactly once, so every skip is too, and never before the instants it is
about have passed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from croniter import CroniterBadDateError, croniter

from timeshard.clock import format_rfc3339
from timeshard.cron.schedule import matching_walls_from, next_fire_times
from timeshard.cron.spec import CronSpec
from timeshard.cron.zones import Transition, naive_wall, resolve, transitions_between

SKIP_COUNT_LIMIT = 120
"""Matching times counted per gap or fold (every minute of two hours); past it the count
(``SKIP_COUNT_LIMIT + 1``) is a lower bound, said "120+". Counting walks croniter a time at a
time, on the fire path: a per-second schedule's hour counted whole took 137 ms of one fire."""
LOOK_BACK_MS = 400 * 86_400_000
"""How far before the first fire time it is decided with a skip is looked for: a yearly
schedule decides the skip of last year's gap with this year's run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DstSkip:
    """The matching local times one gap or fold gave no run, by the schedule's rule."""

    kind: Literal["gap", "fold"]
    key_ms: int
    """Its ledger key (never a fire time; see the module)."""
    last_ms: int
    """A fold: the second instant of the last repeated time; a gap: ``key_ms``."""
    count: int
    first_wall: datetime
    last_wall: datetime
    transition: Transition
    timezone: str

    @property
    def ends_ms(self) -> int:
        """When the transition's effect ends: the gap's end (the transition), or the fold's
        (its second pass over). No fire time lies in ``[key_ms, ends_ms)``, so the first fire
        time after the skip is the first at or after this: found without walking croniter
        through the fold's repeated times, as a search from ``key_ms`` would."""
        t = self.transition
        return t.at_ms + max(0, t.offset_before_ms - t.offset_after_ms)

    @property
    def rule(self) -> str:
        return "dst_gap=skip" if self.kind == "gap" else "dst_fold=first"

    def words(self) -> str:
        t = self.transition
        walls = clock(self.first_wall)
        if self.count > 1:
            many = f"{SKIP_COUNT_LIMIT}+" if self.count > SKIP_COUNT_LIMIT else str(self.count)
            walls = f"{walls} to {clock(self.last_wall)} ({many} times)"
        day = f"on {t.wall_from.date().isoformat()} in {self.timezone}"
        went = f"clocks went {clock(t.wall_from)} -> {clock(t.wall_to)}"
        if self.kind == "gap":
            return f"{walls} local did not exist {day} ({went}); rule {self.rule}: no run"
        return (
            f"{walls} local happened twice {day} ({went}); rule {self.rule}: ran at the first "
            "only, no run at the second"
        )


def clock(wall: datetime) -> str:
    return wall.strftime("%H:%M:%S" if wall.second else "%H:%M")


def _matching(spec: CronSpec, start: datetime, end: datetime) -> tuple[int, datetime, datetime]:
    """How many local times in ``[start, end)`` match (``SKIP_COUNT_LIMIT + 1``: more), the
    first and the last; (0, start, start) if none."""
    walls = matching_walls_from(spec, start)
    count, first = 0, start
    while count <= SKIP_COUNT_LIMIT:
        try:
            wall: datetime = walls.get_next(datetime)
        except (CroniterBadDateError, ValueError, OverflowError):
            break
        if wall >= end:
            break
        first = wall if not count else first
        count += 1
    if not count:
        return 0, start, start
    before_end = croniter(spec.croniter_expression, end, ret_type=datetime, day_or=spec.day_or)
    last: datetime = before_end.get_prev(datetime)  # (strictly before end: in the range)
    return count, first, last


@functools.lru_cache(maxsize=4096)
def skip_of(spec: CronSpec, t: Transition) -> DstSkip | None:
    """The times ``t`` gives no run under ``spec``'s rule, or None (none match, or the rule
    runs them: ``shift`` moves a gap's to its end, ``both`` runs a fold's twice)."""
    rule, skips = (spec.gap_policy, "skip") if t.gap else (spec.fold_policy, "first")
    if rule != skips:
        return None
    start, end = (t.wall_from, t.wall_to) if t.gap else (t.wall_to, t.wall_from)
    count, first, last = _matching(spec, start, end)
    if not count:
        return None
    if t.gap:
        key = last_ms = t.at_ms - 1
    else:
        key = resolve(spec.zone, first).second_ms
        last_ms = resolve(spec.zone, last).second_ms
    return DstSkip(
        kind="gap" if t.gap else "fold",
        key_ms=key,
        last_ms=last_ms,
        count=count,
        first_wall=first,
        last_wall=last,
        transition=t,
        timezone=spec.timezone,
    )


@functools.lru_cache(maxsize=4096)
def _first_fire_from(spec: CronSpec, at_ms: int) -> int | None:
    """The first fire time at or after ``at_ms`` (cached: asked by every fire near a skip)."""
    found = next_fire_times(spec, at_ms - 1, 1)
    return found[0] if found else None


def _newest_first(spec: CronSpec, until_ms: int, since_ms: int) -> Iterator[Transition]:
    """The zone's transitions in ``(since_ms, until_ms]``, newest first, 100 days at a time."""
    top = until_ms
    while top > since_ms:
        bottom = max(since_ms, top - LOOK_BACK_MS // 4)
        yield from reversed(transitions_between(spec.zone, bottom, top))
        top = bottom


def decided_with(spec: CronSpec, first_due_ms: int, now_ms: int) -> list[DstSkip]:
    """The skips decided by a fire that decides the fire times in ``[first_due_ms, now_ms]``:
    those whose first fire time after them is one of these. Oldest first.

    A fire far from any transition costs a few cached lookups: the newest skip before
    ``now_ms`` whose first fire time after it came before ``first_due_ms`` ends the search
    (a schedule whose rule skips nothing looks at the transitions of ``LOOK_BACK_MS``)."""
    out: list[DstSkip] = []
    for t in _newest_first(spec, now_ms, first_due_ms - LOOK_BACK_MS):
        skip = skip_of(spec, t)
        if skip is None or skip.key_ms > now_ms:
            continue  # (nothing to decide here; or a fold whose instants are still to come)
        first = _first_fire_from(spec, skip.ends_ms)
        if first is None or first < first_due_ms:
            break  # decided with an earlier fire, as is every older one
        if first <= now_ms:
            out.append(skip)
    return out[::-1]


def skip_at(spec: CronSpec, at_ms: int) -> DstSkip | None:
    """The skip whose key ``at_ms`` is, or (a fold) one of whose skipped instants it is."""
    for t in transitions_between(spec.zone, at_ms - 2 * 86_400_000, at_ms + 1):
        skip = skip_of(spec, t)
        if skip is None or not skip.key_ms <= at_ms <= skip.last_ms:
            continue
        if skip.kind == "gap" or wall_matches(spec, naive_wall(at_ms + t.offset_after_ms)):
            return skip
    return None


def transition_of_wall(spec: CronSpec, wall: datetime) -> Transition | None:
    """The transition that skips (a gap) or repeats (a fold) the local time ``wall``, if any."""
    placed = resolve(spec.zone, wall)
    if placed.kind == "normal":
        return None
    if placed.kind == "gap":  # (first_ms is the transition itself)
        found = transitions_between(spec.zone, placed.first_ms - 1, placed.first_ms)
    else:
        found = transitions_between(spec.zone, placed.first_ms, placed.second_ms)
    return found[-1] if found else None


def wall_words(spec: CronSpec, wall: datetime, t: Transition) -> str:
    """What the transition ``t`` does to the local time ``wall``, and the schedule's rule."""
    day = f"on {wall.date().isoformat()} in {spec.timezone}"
    went = f"clocks went {clock(t.wall_from)} -> {clock(t.wall_to)}"
    if t.gap:
        said = f"{clock(wall)} local did not exist {day} ({went}); rule dst_gap={spec.gap_policy}"
        if spec.gap_policy == "skip":
            return f"{said}: no run"
        return f"{said}: its run is at {clock(t.wall_to)} local instead"
    placed = resolve(spec.zone, wall)
    said = (
        f"{clock(wall)} local happened twice {day} ({went}): at {format_rfc3339(placed.first_ms)}"
        f" and at {format_rfc3339(placed.second_ms)}; rule dst_fold={spec.fold_policy}"
    )
    if spec.fold_policy == "first":
        return f"{said}: a run at the first only, none at the second"
    return f"{said}: a run at each"


def wall_matches(spec: CronSpec, wall: datetime) -> bool:
    """Whether the local time ``wall`` (naive, whole seconds) matches the cron fields."""
    if wall.microsecond:
        return False
    try:
        found: datetime = matching_walls_from(spec, wall).get_next(datetime)
    except (CroniterBadDateError, ValueError, OverflowError):
        return False
    return found == wall
