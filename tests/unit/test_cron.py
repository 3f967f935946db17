"""Cron: fire times, the DST rule and its overrides, calendar edges, and bad input.

Expected instants are worked out by hand from each zone's rules (stated beside each group) and
written as RFC 3339 UTC strings, so a failure shows the instant that is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from timeshard.cron import CronSpec, PreviewEntry, next_fire, next_fire_times, preview
from timeshard.errors import InvalidArgument

MINUTE_MS = 60_000


def ms(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def rfc(instant_ms: int) -> str:
    stamp = datetime.fromtimestamp(instant_ms / 1000, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def fires(expression: str, timezone: str, after: str, count: int, **policies: Any) -> list[str]:
    spec = CronSpec(expression=expression, timezone=timezone, **policies)
    return [rfc(t) for t in next_fire_times(spec, ms(after), count)]


# --- Daylight saving -------------------------------------------------------------------------
#
# America/New_York, EST -05:00 / EDT -04:00.
#   2026-03-08 02:00 EST -> 03:00 EDT at 07:00Z: 02:00-02:59 does not exist.
#   2026-11-01 02:00 EDT -> 01:00 EST at 06:00Z: 01:00-01:59 happens at 05:xxZ, then 06:xxZ.
# Europe/London, GMT +00:00 / BST +01:00.
#   2026-03-29 01:00 GMT -> 02:00 BST at 01:00Z: 01:00-01:59 does not exist.
#   2026-10-25 02:00 BST -> 01:00 GMT at 01:00Z: 01:00-01:59 happens at 00:xxZ, then 01:xxZ.
# Australia/Lord_Howe, +10:30 / +11:00 (a half-hour shift; southern hemisphere).
#   2026-10-04 02:00 +10:30 -> 02:30 +11:00 at 2026-10-03T15:30Z: 02:00-02:29 does not exist.
#   2026-04-05 02:00 +11:00 -> 01:30 +10:30 at 2026-04-04T15:00Z: 01:30-01:59 happens twice,
#   at 14:30-14:59Z (+11:00) and at 15:00-15:29Z (+10:30).
# Australia/Sydney, AEST +10:00 / AEDT +11:00 (southern hemisphere: forward in October).
#   2026-10-04 02:00 AEST -> 03:00 AEDT at 2026-10-03T16:00Z: 02:00-02:59 does not exist.
#   2026-04-05 03:00 AEDT -> 02:00 AEST at 2026-04-04T16:00Z: 02:00-02:59 happens at
#   15:xxZ (+11:00), then 16:xxZ (+10:00).

DST_CASES: list[tuple[str, str, str, dict[str, str], str, list[str]]] = [
    # (id, expression, zone, policies, after, expected fire times)
    # New York, spring forward
    ("ny-gap-fixed-shifts", "30 2 * * *", "America/New_York", {}, "2026-03-07T12:00:00Z",
     ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    ("ny-gap-fixed-skip", "30 2 * * *", "America/New_York", {"dst_gap": "skip"},
     "2026-03-07T12:00:00Z", ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]),
    ("ny-gap-star-skips-the-hour", "30 * * * *", "America/New_York", {},
     "2026-03-08T06:00:00Z",
     ["2026-03-08T06:30:00Z", "2026-03-08T07:30:00Z", "2026-03-08T08:30:00Z"]),
    ("ny-gap-star-shift", "30 * * * *", "America/New_York", {"dst_gap": "shift"},
     "2026-03-08T06:00:00Z",
     ["2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"]),
    # 02:00 and 02:30 shift to 03:00 EDT, which also matches: one run, not three.
    ("ny-gap-shift-collides-once", "0,30 2,3 * * *", "America/New_York", {},
     "2026-03-08T06:00:00Z",
     ["2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z", "2026-03-09T06:00:00Z"]),
    ("ny-gap-two-shifted-times-once", "0,30 2 * * *", "America/New_York", {},
     "2026-03-07T12:00:00Z",
     ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T06:30:00Z"]),
    ("ny-weekdays-across-the-change", "0 9 * * 1-5", "America/New_York", {},
     "2026-03-06T15:00:00Z", ["2026-03-09T13:00:00Z", "2026-03-10T13:00:00Z"]),
    # New York, fall back
    ("ny-fold-fixed-first", "30 1 * * *", "America/New_York", {}, "2026-10-31T12:00:00Z",
     ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
    ("ny-fold-fixed-both", "30 1 * * *", "America/New_York", {"dst_fold": "both"},
     "2026-10-31T12:00:00Z",
     ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]),
    ("ny-fold-fixed-both-after-first", "30 1 * * *", "America/New_York",
     {"dst_fold": "both"}, "2026-11-01T05:30:00Z",
     ["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]),
    ("ny-fold-hour-list-is-fixed", "0 1,2 * * *", "America/New_York", {},
     "2026-10-31T12:00:00Z",
     ["2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-02T06:00:00Z"]),
    ("ny-fold-star-twice", "30 * * * *", "America/New_York", {}, "2026-11-01T04:00:00Z",
     ["2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z",
      "2026-11-01T07:30:00Z"]),
    ("ny-fold-star-first", "30 * * * *", "America/New_York", {"dst_fold": "first"},
     "2026-11-01T04:00:00Z",
     ["2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:30:00Z"]),
    # After 01:50 EDT the clock still reads 01:00 EST and 01:30 EST again.
    ("ny-fold-star-after-first-pass", "*/30 * * * *", "America/New_York", {},
     "2026-11-01T05:50:00Z",
     ["2026-11-01T06:00:00Z", "2026-11-01T06:30:00Z", "2026-11-01T07:00:00Z"]),
    # London, spring forward
    ("lon-gap-fixed-shifts", "30 1 * * *", "Europe/London", {}, "2026-03-28T12:00:00Z",
     ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
    ("lon-gap-fixed-skip", "30 1 * * *", "Europe/London", {"dst_gap": "skip"},
     "2026-03-28T12:00:00Z", ["2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"]),
    ("lon-gap-star", "15 * * * *", "Europe/London", {}, "2026-03-29T00:00:00Z",
     ["2026-03-29T00:15:00Z", "2026-03-29T01:15:00Z", "2026-03-29T02:15:00Z"]),
    ("lon-gap-star-shift", "15 * * * *", "Europe/London", {"dst_gap": "shift"},
     "2026-03-29T00:00:00Z",
     ["2026-03-29T00:15:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z"]),
    # London, fall back
    ("lon-fold-fixed-first", "30 1 * * *", "Europe/London", {}, "2026-10-24T12:00:00Z",
     ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
    ("lon-fold-fixed-both", "30 1 * * *", "Europe/London", {"dst_fold": "both"},
     "2026-10-24T12:00:00Z",
     ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"]),
    ("lon-fold-star-twice", "*/30 * * * *", "Europe/London", {}, "2026-10-24T23:45:00Z",
     ["2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z",
      "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"]),
    ("lon-fold-star-first", "*/30 * * * *", "Europe/London", {"dst_fold": "first"},
     "2026-10-24T23:45:00Z",
     ["2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-25T02:00:00Z"]),
    # Lord Howe, spring forward by half an hour
    ("lh-gap-fixed-shifts", "15 2 * * *", "Australia/Lord_Howe", {}, "2026-10-03T00:00:00Z",
     ["2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"]),
    ("lh-gap-fixed-skip", "15 2 * * *", "Australia/Lord_Howe", {"dst_gap": "skip"},
     "2026-10-03T00:00:00Z", ["2026-10-04T15:15:00Z", "2026-10-05T15:15:00Z"]),
    ("lh-gap-star", "15 * * * *", "Australia/Lord_Howe", {}, "2026-10-03T14:00:00Z",
     ["2026-10-03T14:45:00Z", "2026-10-03T16:15:00Z"]),
    ("lh-gap-star-shift", "15 * * * *", "Australia/Lord_Howe", {"dst_gap": "shift"},
     "2026-10-03T14:00:00Z",
     ["2026-10-03T14:45:00Z", "2026-10-03T15:30:00Z", "2026-10-03T16:15:00Z"]),
    # Lord Howe, fall back by half an hour
    ("lh-fold-fixed-first", "45 1 * * *", "Australia/Lord_Howe", {}, "2026-04-04T00:00:00Z",
     ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]),
    ("lh-fold-fixed-both", "45 1 * * *", "Australia/Lord_Howe", {"dst_fold": "both"},
     "2026-04-04T00:00:00Z",
     ["2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z", "2026-04-05T15:15:00Z"]),
    ("lh-fold-star-twice", "*/15 * * * *", "Australia/Lord_Howe", {},
     "2026-04-04T14:00:00Z",
     ["2026-04-04T14:15:00Z", "2026-04-04T14:30:00Z", "2026-04-04T14:45:00Z",
      "2026-04-04T15:00:00Z", "2026-04-04T15:15:00Z", "2026-04-04T15:30:00Z"]),
    ("lh-fold-star-first", "*/15 * * * *", "Australia/Lord_Howe", {"dst_fold": "first"},
     "2026-04-04T14:00:00Z",
     ["2026-04-04T14:15:00Z", "2026-04-04T14:30:00Z", "2026-04-04T14:45:00Z",
      "2026-04-04T15:30:00Z", "2026-04-04T15:45:00Z"]),
    # Sydney, spring forward in October
    ("syd-gap-fixed-shifts", "30 2 * * *", "Australia/Sydney", {}, "2026-10-03T00:00:00Z",
     ["2026-10-03T16:00:00Z", "2026-10-04T15:30:00Z"]),
    ("syd-gap-fixed-skip", "30 2 * * *", "Australia/Sydney", {"dst_gap": "skip"},
     "2026-10-03T00:00:00Z", ["2026-10-04T15:30:00Z", "2026-10-05T15:30:00Z"]),
    ("syd-gap-star", "30 * * * *", "Australia/Sydney", {}, "2026-10-03T15:00:00Z",
     ["2026-10-03T15:30:00Z", "2026-10-03T16:30:00Z"]),
    ("syd-gap-star-shift", "30 * * * *", "Australia/Sydney", {"dst_gap": "shift"},
     "2026-10-03T15:00:00Z",
     ["2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z", "2026-10-03T16:30:00Z"]),
    # Sydney, fall back in April
    ("syd-fold-fixed-first", "30 2 * * *", "Australia/Sydney", {}, "2026-04-04T00:00:00Z",
     ["2026-04-04T15:30:00Z", "2026-04-05T16:30:00Z"]),
    ("syd-fold-fixed-both", "30 2 * * *", "Australia/Sydney", {"dst_fold": "both"},
     "2026-04-04T00:00:00Z",
     ["2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z", "2026-04-05T16:30:00Z"]),
    ("syd-fold-star-twice", "0 * * * *", "Australia/Sydney", {}, "2026-04-04T14:30:00Z",
     ["2026-04-04T15:00:00Z", "2026-04-04T16:00:00Z", "2026-04-04T17:00:00Z"]),
    ("syd-fold-star-first", "0 * * * *", "Australia/Sydney", {"dst_fold": "first"},
     "2026-04-04T14:30:00Z", ["2026-04-04T15:00:00Z", "2026-04-04T17:00:00Z"]),
    # Pacific/Apia skipped 2011-12-30 entirely (-10:00 -> +14:00 at 2011-12-30T10:00Z).
    ("apia-skipped-day-shifts", "0 12 * * *", "Pacific/Apia", {}, "2011-12-29T00:00:00Z",
     ["2011-12-29T22:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T22:00:00Z"]),
    ("apia-skipped-day-skip", "0 12 * * *", "Pacific/Apia", {"dst_gap": "skip"},
     "2011-12-29T00:00:00Z", ["2011-12-29T22:00:00Z", "2011-12-30T22:00:00Z"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("expression", "timezone", "policies", "after", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in DST_CASES],
)
def test_dst_rule(
    expression: str, timezone: str, policies: dict[str, str], after: str, expected: list[str]
) -> None:
    assert fires(expression, timezone, after, len(expected), **policies) == expected


def test_croniter_alone_fires_twice_in_the_fold_and_we_do_not() -> None:
    """Why the DST rule sits on top of croniter: this is the case it gets wrong."""
    start = datetime(2026, 10, 31, 12, tzinfo=ZoneInfo("America/New_York"))
    iterator = croniter("30 1 * * *", start)
    raw = [rfc(int(iterator.get_next(float) * 1000)) for _ in range(2)]
    assert raw == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]
    assert fires("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2) == [
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    ]


@pytest.mark.parametrize("policies", [{}, {"dst_gap": "shift"}], ids=["default", "shift"])
def test_seconds_in_a_gap_are_skipped_without_visiting_each(policies: dict[str, str]) -> None:
    # Every second, New York: 01:59:59 EST is 06:59:59Z and the next real second is 03:00:00
    # EDT; the hour between does not exist, and shifting it lands on 03:00:00 EDT anyway.
    assert fires("* * * * * *", "America/New_York", "2026-03-08T06:59:58Z", 3, **policies) == [
        "2026-03-08T06:59:59Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:00:01Z",
    ]


@pytest.mark.parametrize(
    ("expression", "fixed"),
    [
        ("30 2 * * *", True),
        ("0 9 * * 1-5", True),
        ("0 1,2 * * *", True),
        ("0-59 2 * * *", True),
        ("*/10 30 2 * * *", True),  # the seconds field does not count
        ("@daily", True),
        ("*/15 * * * *", False),
        ("30 * * * *", False),
        ("0 */2 * * *", False),
        ("@hourly", False),
    ],
)
def test_fixed_time_means_no_star_in_minute_or_hour(expression: str, fixed: bool) -> None:
    spec = CronSpec(expression=expression, timezone="UTC")
    assert spec.fixed_time is fixed
    assert spec.gap_policy == ("shift" if fixed else "skip")
    assert spec.fold_policy == ("first" if fixed else "both")


def test_explicit_policies_override_the_default() -> None:
    spec = CronSpec(expression="30 2 * * *", timezone="UTC", dst_gap="skip", dst_fold="both")
    assert (spec.gap_policy, spec.fold_policy) == ("skip", "both")


# --- An independent check: walk real time minute by minute ---------------------------------


@functools.cache
def _walls(timezone: str, start_ms: int, end_ms: int) -> tuple[datetime, ...]:
    """The local wall-clock reading of each real minute from start (inclusive) to end."""
    zone = ZoneInfo(timezone)
    return tuple(
        datetime.fromtimestamp(instant / 1000, zone).replace(tzinfo=None)
        for instant in range(start_ms, end_ms, MINUTE_MS)
    )


@functools.cache
def _matching(expression: str, first: datetime, last: datetime) -> frozenset[datetime]:
    walls = croniter(expression, first, ret_type=datetime)
    matching = set()
    while (matched := walls.get_next(datetime)) < last:
        matching.add(matched)
    return frozenset(matching)


def _oracle(spec: CronSpec, start_ms: int, end_ms: int) -> list[int]:
    """Fire times in (start, end) by the rule's own words, one real minute at a time: a minute
    fires if its local time matches (unless it is a repeat and only the first counts), or if
    the clock jumped over a matching local time and gaps shift."""
    walls = _walls(spec.timezone, start_ms, end_ms)
    day = timedelta(days=1)
    matching = _matching(spec.expression, walls[0] - day, walls[-1] + day)
    result = []
    previous = highest = walls[0]
    for index, now in enumerate(walls[1:], start=1):
        repeat = now <= highest
        fire = now in matching and (not repeat or spec.fold_policy == "both")
        skipped = (now - previous) // MINUTE_DT - 1
        if skipped > 0 and spec.gap_policy == "shift":
            jumped = (previous + MINUTE_DT * (k + 1) for k in range(skipped))
            fire = fire or any(wall in matching for wall in jumped)
        if fire:
            result.append(start_ms + index * MINUTE_MS)
        previous, highest = now, max(highest, now)
    return result


MINUTE_DT = timedelta(minutes=1)

TRANSITION_DAYS = [  # (zone, a local date on which the clocks change)
    ("America/New_York", date(2026, 3, 8)),
    ("America/New_York", date(2026, 11, 1)),
    ("Europe/London", date(2026, 3, 29)),
    ("Europe/London", date(2026, 10, 25)),
    ("Europe/Dublin", date(2026, 10, 25)),  # "negative DST" in the tz database
    ("Australia/Lord_Howe", date(2026, 4, 5)),
    ("Australia/Lord_Howe", date(2026, 10, 4)),
    ("Australia/Sydney", date(2026, 4, 5)),
    ("Australia/Sydney", date(2026, 10, 4)),
    ("Antarctica/Troll", date(2026, 3, 29)),  # a two-hour shift
    ("Antarctica/Troll", date(2026, 10, 25)),
    ("Pacific/Apia", date(2011, 12, 30)),  # a whole day skipped
]
ORACLE_EXPRESSIONS = ["30 2 * * *", "0,30 1-3 * * *", "45 1 * * *", "*/20 * * * *", "15 * * * *"]
POLICY_SETS: list[dict[str, str]] = [{}, {"dst_gap": "shift", "dst_fold": "first"}]
POLICY_SETS += [{"dst_gap": "skip", "dst_fold": "both"}]


def _afters(start_ms: int, end_ms: int, change_ms: int, oracle: list[int]) -> Iterator[int]:
    """Start points in [start, end): an irregular grid, and on and just before each fire in
    the hours around the change."""
    yield from range(start_ms, end_ms, 181 * MINUTE_MS)
    for fire in oracle:
        if change_ms - 180 * MINUTE_MS < fire < change_ms + 360 * MINUTE_MS:
            yield fire
            yield fire - 1


@pytest.mark.parametrize("policies", POLICY_SETS, ids=["default", "shift-first", "skip-both"])
@pytest.mark.parametrize(("timezone", "day"), TRANSITION_DAYS, ids=lambda v: str(v))
def test_agrees_with_a_minute_by_minute_walk(
    timezone: str, day: date, policies: dict[str, str]
) -> None:
    zone = ZoneInfo(timezone)
    midnight = datetime(day.year, day.month, day.day, tzinfo=zone)  # the changes are 00-03h
    midnight_ms = int(midnight.timestamp() * 1000)
    start_ms, end_ms = midnight_ms - 24 * 60 * MINUTE_MS, midnight_ms + 3 * 24 * 60 * MINUTE_MS
    for expression in ORACLE_EXPRESSIONS:
        spec = CronSpec(expression=expression, timezone=timezone, **policies)  # type: ignore[arg-type]
        oracle = _oracle(spec, start_ms, end_ms)
        assert oracle
        for after in _afters(start_ms, end_ms - 24 * 60 * MINUTE_MS, midnight_ms, oracle):
            expected = [f for f in oracle if f > after][:3]  # the window may end before 3
            got = next_fire_times(spec, after, len(expected))
            assert [rfc(t) for t in got] == [rfc(t) for t in expected], (expression, rfc(after))


def test_next_fire_chained_matches_a_batch() -> None:
    """What the dispatcher does (next after each occurrence) gives what preview shows."""
    for expression in ["*/20 * * * *", "30 1 * * *", "0,30 2,3 * * *"]:
        spec = CronSpec(expression=expression, timezone="America/New_York", dst_fold="both")
        after = ms("2026-03-07T00:00:00Z")
        batch = next_fire_times(spec, after, 60)
        chained = []
        for _ in range(60):
            after = next_fire(spec, after)
            chained.append(after)
        assert chained == batch
        assert batch == sorted(set(batch))


# --- Calendar --------------------------------------------------------------------------------

CALENDAR_CASES: list[tuple[str, str, str, str, list[str]]] = [
    # (id, expression, zone, after, expected)
    ("day-31-only-in-long-months", "0 0 31 * *", "UTC", "2026-01-31T00:00:00Z",
     ["2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z", "2026-07-31T00:00:00Z",
      "2026-08-31T00:00:00Z", "2026-10-31T00:00:00Z", "2026-12-31T00:00:00Z"]),
    ("feb-29-next-leap-year", "0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z",
     ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]),
    ("feb-29-skips-2100", "0 0 29 2 *", "UTC", "2096-03-01T00:00:00Z",
     ["2104-02-29T00:00:00Z"]),
    ("last-day-of-month", "0 0 L * *", "UTC", "2026-01-15T00:00:00Z",
     ["2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-31T00:00:00Z",
      "2026-04-30T00:00:00Z"]),
    ("last-day-of-february-leap", "0 0 L 2 *", "UTC", "2027-03-01T00:00:00Z",
     ["2028-02-29T00:00:00Z", "2029-02-28T00:00:00Z"]),
    ("L-in-a-list", "0 0 15,L * *", "UTC", "2026-02-01T00:00:00Z",
     ["2026-02-15T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-15T00:00:00Z"]),
    # 2026-04-13 is a Monday: the 13th or any Friday.
    ("dom-or-dow", "0 0 13 * FRI", "UTC", "2026-03-28T00:00:00Z",
     ["2026-04-03T00:00:00Z", "2026-04-10T00:00:00Z", "2026-04-13T00:00:00Z",
      "2026-04-17T00:00:00Z"]),
    ("dom-only-when-dow-is-star", "0 0 13 * *", "UTC", "2026-03-28T00:00:00Z",
     ["2026-04-13T00:00:00Z", "2026-05-13T00:00:00Z"]),
    ("dow-only-when-dom-is-question-mark", "0 0 ? * FRI", "UTC", "2026-03-28T00:00:00Z",
     ["2026-04-03T00:00:00Z", "2026-04-10T00:00:00Z"]),
    ("L-or-friday", "0 0 L * 5", "UTC", "2026-01-28T00:00:00Z",
     ["2026-01-30T00:00:00Z", "2026-01-31T00:00:00Z", "2026-02-06T00:00:00Z"]),
    # 2027-01-01 is a Friday.
    ("month-and-day-names", "0 9 * JAN MON-FRI", "UTC", "2026-12-31T00:00:00Z",
     ["2027-01-01T09:00:00Z", "2027-01-04T09:00:00Z", "2027-01-05T09:00:00Z"]),
    ("month-restriction-waits-a-year", "0 9 * jan mon-fri", "UTC", "2027-01-29T10:00:00Z",
     ["2028-01-03T09:00:00Z"]),
    ("seven-is-sunday", "0 0 * * 7", "UTC", "2026-03-02T00:00:00Z",
     ["2026-03-08T00:00:00Z", "2026-03-15T00:00:00Z"]),
    ("zero-is-sunday", "0 0 * * 0", "UTC", "2026-03-02T00:00:00Z",
     ["2026-03-08T00:00:00Z", "2026-03-15T00:00:00Z"]),
    ("range-to-seven", "0 0 * * 5-7", "UTC", "2026-03-02T00:00:00Z",
     ["2026-03-06T00:00:00Z", "2026-03-07T00:00:00Z", "2026-03-08T00:00:00Z",
      "2026-03-13T00:00:00Z"]),
    ("range-to-sunday-by-name", "0 0 * * FRI-SUN", "UTC", "2026-03-02T00:00:00Z",
     ["2026-03-06T00:00:00Z", "2026-03-07T00:00:00Z", "2026-03-08T00:00:00Z",
      "2026-03-13T00:00:00Z"]),
    ("hour-range-step", "0 8-18/4 * * *", "UTC", "2026-01-01T00:00:00Z",
     ["2026-01-01T08:00:00Z", "2026-01-01T12:00:00Z", "2026-01-01T16:00:00Z",
      "2026-01-02T08:00:00Z"]),
    ("start-slash-step", "10/20 * * * *", "UTC", "2026-01-01T00:00:00Z",
     ["2026-01-01T00:10:00Z", "2026-01-01T00:30:00Z", "2026-01-01T00:50:00Z",
      "2026-01-01T01:10:00Z"]),
    ("month-step", "0 0 1 */3 *", "UTC", "2026-01-01T00:00:00Z",
     ["2026-04-01T00:00:00Z", "2026-07-01T00:00:00Z", "2026-10-01T00:00:00Z",
      "2027-01-01T00:00:00Z"]),
    ("seconds-field", "30 0 9 * * *", "UTC", "2026-01-01T09:00:00Z",
     ["2026-01-01T09:00:30Z", "2026-01-02T09:00:30Z"]),
    ("seconds-step", "*/20 * * * * *", "UTC", "2026-01-01T00:00:05Z",
     ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z", "2026-01-01T00:01:00Z"]),
    ("alias-weekly", "@weekly", "UTC", "2026-03-02T00:00:00Z",
     ["2026-03-08T00:00:00Z", "2026-03-15T00:00:00Z"]),
    ("local-zone", "0 9 * * *", "Europe/Berlin", "2026-01-10T00:00:00Z",
     ["2026-01-10T08:00:00Z", "2026-01-11T08:00:00Z"]),
    ("strictly-after", "0 9 * * *", "Europe/Berlin", "2026-01-10T08:00:00Z",
     ["2026-01-11T08:00:00Z"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("expression", "timezone", "after", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CALENDAR_CASES],
)
def test_calendar(expression: str, timezone: str, after: str, expected: list[str]) -> None:
    assert fires(expression, timezone, after, len(expected)) == expected


# --- The day-of-month / day-of-week rule ------------------------------------------------------
#
# Cron (docs/architecture.md, Time): both day fields restricted means either matches (OR);
# otherwise both must (AND). A field is restricted when it does not start with '*' (or '?'),
# so '*/2' keeps AND. The sets below are the days each field allows, written out by hand;
# day-of-week is cron's (0 = Sunday). The rule itself is applied here, not taken from croniter.

ODD_DAYS = frozenset(range(1, 32, 2))
EVERY_DAY = frozenset(range(1, 32))
EVERY_WEEKDAY = frozenset(range(7))
DAY_RULE_CASES: list[tuple[str, frozenset[int], frozenset[int], bool]] = [
    # (expression, days of the month, days of the week, OR?)
    ("0 0 1 * */2", frozenset({1}), frozenset({0, 2, 4, 6}), False),
    ("0 0 */2 * 1", ODD_DAYS, frozenset({1}), False),
    ("0 0 1-7 * 1", frozenset(range(1, 8)), frozenset({1}), True),
    ("0 0 * * 1", EVERY_DAY, frozenset({1}), False),
    ("0 0 13 * *", frozenset({13}), EVERY_WEEKDAY, False),
    ("0 0 13 * FRI", frozenset({13}), frozenset({5}), True),
    ("0 0 */10 * MON-FRI", frozenset({1, 11, 21, 31}), frozenset(range(1, 6)), False),
    ("0 0 ? * */3", EVERY_DAY, frozenset({0, 3, 6}), False),
    ("0 0 1,15 * */1", frozenset({1, 15}), EVERY_WEEKDAY, False),
    ("0 0 */1 * 0", EVERY_DAY, frozenset({0}), False),
]


def _days_by_the_rule(
    days: frozenset[int], weekdays: frozenset[int], day_or: bool, first: date, n: int
) -> list[str]:
    found, day = [], first
    while len(found) < n:
        dom, dow = day.day in days, day.isoweekday() % 7 in weekdays
        if (dom or dow) if day_or else (dom and dow):
            found.append(f"{day.isoformat()}T00:00:00Z")
        day += timedelta(days=1)
    return found


@pytest.mark.parametrize(("expression", "days", "weekdays", "day_or"), DAY_RULE_CASES)
def test_day_fields_or_only_when_neither_starts_with_a_star(
    expression: str, days: frozenset[int], weekdays: frozenset[int], day_or: bool
) -> None:
    dom, dow = expression.split()[2], expression.split()[4]
    assert day_or == (not dom.startswith(("*", "?")) and not dow.startswith(("*", "?")))
    expected = _days_by_the_rule(days, weekdays, day_or, date(2026, 1, 2), 40)
    assert fires(expression, "UTC", "2026-01-01T00:00:00Z", 40) == expected


def test_a_day_of_month_with_a_starred_weekday_fires_once_a_month_at_most() -> None:
    """The issue's example: '0 0 1 * */2' is the 1st when it is a Sunday, Tuesday, Thursday
    or Saturday, not those four days of every week."""
    assert fires("0 0 1 * */2", "UTC", "2026-01-01T00:00:00Z", 4) == [
        "2026-02-01T00:00:00Z",  # a Sunday
        "2026-03-01T00:00:00Z",  # a Sunday
        "2026-08-01T00:00:00Z",  # a Saturday
        "2026-09-01T00:00:00Z",  # a Tuesday
    ]


def test_next_fire_is_the_first_of_next_fire_times() -> None:
    spec = CronSpec(expression="30 2 * * *", timezone="America/New_York")
    assert next_fire(spec, ms("2026-03-07T12:00:00Z")) == ms("2026-03-08T07:00:00Z")


def test_count_zero_is_empty() -> None:
    spec = CronSpec(expression="* * * * *", timezone="UTC")
    assert next_fire_times(spec, ms("2026-01-01T00:00:00Z"), 0) == []


def test_no_fire_time_before_year_10000() -> None:
    spec = CronSpec(expression="0 0 29 2 *", timezone="UTC")
    assert fires("0 0 29 2 *", "UTC", "9990-01-01T00:00:00Z", 3) == [
        "9992-02-29T00:00:00Z",
        "9996-02-29T00:00:00Z",
    ]
    with pytest.raises(InvalidArgument) as raised:
        next_fire(spec, ms("9996-03-01T00:00:00Z"))
    assert raised.value.field == "after_ms"


# --- Preview ---------------------------------------------------------------------------------


def test_preview_shows_utc_local_and_what_dst_did() -> None:
    spec = CronSpec(expression="30 2 * * *", timezone="America/New_York")
    entries = preview(spec, ms("2026-03-07T12:00:00Z"), 2)
    assert entries[0] == PreviewEntry(
        at_ms=ms("2026-03-08T07:00:00Z"),
        utc="2026-03-08T07:00:00Z",
        local="2026-03-08T03:00:00-04:00",
        note=entries[0].note,
    )
    assert entries[0].note is not None
    assert "02:30 on 2026-03-08" in entries[0].note
    assert "clocks skip (02:00-03:00)" in entries[0].note
    assert entries[1] == PreviewEntry(
        at_ms=ms("2026-03-09T06:30:00Z"),
        utc="2026-03-09T06:30:00Z",
        local="2026-03-09T02:30:00-04:00",
        note=None,
    )


def test_preview_half_hour_offsets_and_both_runs_of_a_fold() -> None:
    spec = CronSpec(expression="45 1 * * *", timezone="Australia/Lord_Howe", dst_fold="both")
    entries = preview(spec, ms("2026-04-04T00:00:00Z"), 3)
    assert [e.local for e in entries] == [
        "2026-04-05T01:45:00+11:00",
        "2026-04-05T01:45:00+10:30",
        "2026-04-06T01:45:00+10:30",
    ]
    assert entries[0].note is not None and "first of two runs" in entries[0].note
    assert entries[1].note is not None and "second of two runs" in entries[1].note
    assert entries[2].note is None


def test_preview_says_when_a_real_time_also_covers_the_gap() -> None:
    spec = CronSpec(expression="0,30 2,3 * * *", timezone="America/New_York")
    entry = preview(spec, ms("2026-03-08T06:00:00Z"), 1)[0]
    assert entry.local == "2026-03-08T03:00:00-04:00"
    assert entry.note is not None and "also covers the runs due in" in entry.note


def test_preview_default_fold_says_first_only() -> None:
    spec = CronSpec(expression="30 1 * * *", timezone="America/New_York")
    entry = preview(spec, ms("2026-10-31T12:00:00Z"), 1)[0]
    assert entry.local == "2026-11-01T01:30:00-04:00"
    assert entry.note is not None and "first occurrence only" in entry.note


# --- The value object and bad input ----------------------------------------------------------


def test_cron_spec_is_frozen_and_keyword_only() -> None:
    spec = CronSpec(expression="0 0 * * *", timezone="UTC")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.expression = "1 0 * * *"  # type: ignore[misc]
    with pytest.raises(TypeError):
        CronSpec("0 0 * * *", "UTC")  # type: ignore[call-arg]
    assert spec == CronSpec(expression="0 0 * * *", timezone="UTC")
    assert hash(spec) == hash(CronSpec(expression="0 0 * * *", timezone="UTC"))


BAD_SPECS: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, CronSpec arguments, field, a fragment of the message)
    ("empty", {"expression": ""}, "expression", "expected 5 fields"),
    ("three-fields", {"expression": "0 0 *"}, "expression", "got 3"),
    ("year-field", {"expression": "0 0 0 1 1 * 2030"}, "expression", "got 7"),
    ("minute-out-of-range", {"expression": "61 * * * *"}, "expression",
     "minute field '61': 61 is out of range 0-59"),
    ("hour-out-of-range", {"expression": "0 24 * * *"}, "expression", "hour field"),
    ("day-zero", {"expression": "0 0 0 * *"}, "expression", "day-of-month field"),
    ("month-13", {"expression": "0 0 1 13 *"}, "expression", "month field"),
    ("weekday-8", {"expression": "0 0 * * 8"}, "expression", "out of range 0-7"),
    ("second-60", {"expression": "60 0 0 * * *"}, "expression", "second field"),
    ("bad-month-name", {"expression": "0 0 1 FOO *"}, "expression", "month name (JAN-DEC)"),
    ("bad-day-name", {"expression": "0 0 * * FUNDAY"}, "expression", "day name (SUN-SAT)"),
    ("step-zero", {"expression": "*/0 * * * *"}, "expression", "step must be at least 1"),
    ("backwards-range", {"expression": "0 22-2 * * *"}, "expression",
     "runs backwards and ranges do not wrap around; split it, e.g. '22-23,0-2'"),
    ("L-in-weekday", {"expression": "0 0 * * L"}, "expression",
     "only allowed in the day-of-month field"),
    ("question-mark-in-minute", {"expression": "? 0 * * *"}, "expression", "'?'"),
    ("nth-weekday", {"expression": "0 0 * * 5#2"}, "expression", "'#') is not supported"),
    ("nearest-weekday", {"expression": "0 0 15W * *"}, "expression", "('W') is not supported"),
    ("L-in-a-range", {"expression": "0 0 10-L * *"}, "expression", "must be an item on its own"),
    ("hashed", {"expression": "H * * * *"}, "expression", "minute field"),
    ("negative", {"expression": "-5 * * * *"}, "expression", "minute field"),
    ("empty-list-item", {"expression": "0 0 1,,2 * *"}, "expression", "empty item"),
    ("february-30", {"expression": "0 0 30 2 *"}, "expression",
     "day-of-month 30 never occurs in FEB"),
    ("day-31-short-months", {"expression": "0 0 31 4,6,9,11 *"}, "expression",
     "never occurs in APR, JUN, SEP, NOV"),
    ("february-30-starred-weekday", {"expression": "0 0 30 2 */2"}, "expression",
     "day-of-month 30 never occurs in FEB"),
    ("april-31-starred-weekday", {"expression": "0 0 31 4 */7"}, "expression",
     "both day fields must match"),
    ("reboot", {"expression": "@reboot"}, "expression", "unknown alias '@reboot'"),
    ("not-a-string", {"expression": None}, "expression", "must be a string"),
    ("unknown-zone", {"timezone": "Mars/Olympus_Mons"}, "timezone", "unknown time zone"),
    ("empty-zone", {"timezone": ""}, "timezone", "a time zone is required"),
    ("zone-case", {"timezone": "america/new_york"}, "timezone",
     "did you mean 'America/New_York'?"),
    ("zone-typo", {"timezone": "Europe/Berln"}, "timezone", "did you mean 'Europe/Berlin'?"),
    ("host-localtime", {"timezone": "localtime"}, "timezone", "unknown time zone"),
    ("leap-second-zone", {"timezone": "right/UTC"}, "timezone", "unknown time zone"),
    ("zone-path", {"timezone": "../../etc/passwd"}, "timezone", "unknown time zone"),
    ("absolute-zone-path", {"timezone": "/etc/localtime"}, "timezone", "unknown time zone"),
    ("zone-not-a-string", {"timezone": 5}, "timezone", "must be a string"),
    ("gap-policy", {"dst_gap": "later"}, "dst_gap", "unknown policy 'later'; use 'shift'"),
    ("fold-policy", {"dst_fold": "second"}, "dst_fold", "unknown policy 'second'; use 'first'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "field", "fragment"), [pytest.param(*c[1:], id=c[0]) for c in BAD_SPECS]
)
def test_bad_input_names_the_field(arguments: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        CronSpec(**{"expression": "0 0 * * *", "timezone": "UTC", **arguments})
    assert raised.value.field == field
    assert fragment in raised.value.problem
    assert str(raised.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("after_ms", "count", "field"),
    [(-1, 1, "after_ms"), (10**15, 1, "after_ms"), (0, -1, "count"), (True, 1, "after_ms")],
)
def test_bad_window_names_the_field(after_ms: Any, count: Any, field: str) -> None:
    spec = CronSpec(expression="0 0 * * *", timezone="UTC")
    with pytest.raises(InvalidArgument) as raised:
        next_fire_times(spec, after_ms, count)
    assert raised.value.field == field


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 ? * ?",
        "0 0 1-31 * *",
        "0 0 * * 0-7",
        "0 0 1 1 *",
        "0 0 29 2 *",
        "0 0 30 2 1",  # OR: every Monday of February
        "0 0 31 4 MON",
        "0 0 L 2 */2",
        "0 0 29 2 */7",  # a 29 February that is a Sunday: 2032, 2060, 2088, 2128
    ],
)
def test_valid_edge_expressions_are_accepted(expression: str) -> None:
    spec = CronSpec(expression=expression, timezone="UTC")
    assert next_fire_times(spec, ms("2026-01-01T00:00:00Z"), 1)
