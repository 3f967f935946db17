"""The local times a schedule's DST rule gives no run (``cron.dstskips``): what a gap skips
under ``dst_gap=skip`` and a fold's second pass under ``dst_fold=first``, keyed by an instant
that is never a fire time, each decided exactly once by the fire that comes after it."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from timeshard.cron import CronSpec, fire_times_between, next_fire
from timeshard.cron.dstskips import (
    SKIP_COUNT_LIMIT,
    DstSkip,
    decided_with,
    skip_at,
    skip_of,
    transition_of_wall,
    wall_matches,
    wall_words,
)
from timeshard.cron.zones import transitions_between


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


BERLIN_SPRING = ms(2027, 3, 28, 1)  # 02:00 CET -> 03:00 CEST
BERLIN_AUTUMN = ms(2027, 10, 31, 1)  # 03:00 CEST -> 02:00 CET
NY_AUTUMN = ms(2027, 11, 7, 6)  # 02:00 EDT -> 01:00 EST
YEAR_2027 = (ms(2027, 1, 1), ms(2028, 1, 1))


def only_skip(spec: CronSpec, transition_ms: int) -> DstSkip | None:
    (t,) = transitions_between(spec.zone, transition_ms - 1, transition_ms)
    return skip_of(spec, t)


def test_transitions_are_found_at_their_instants() -> None:
    berlin = CronSpec(expression="0 0 * * *", timezone="Europe/Berlin").zone
    found = transitions_between(berlin, *YEAR_2027)
    assert [(t.at_ms, t.gap) for t in found] == [(BERLIN_SPRING, True), (BERLIN_AUTUMN, False)]
    spring = found[0]
    assert (spring.wall_from.hour, spring.wall_to.hour) == (2, 3)
    utc = CronSpec(expression="0 0 * * *", timezone="UTC").zone
    assert transitions_between(utc, *YEAR_2027) == []


def test_a_gap_skip_is_keyed_just_before_the_transition_and_says_the_rule() -> None:
    spec = CronSpec(expression="30 2 * * *", timezone="Europe/Berlin", dst_gap="skip")
    skip = only_skip(spec, BERLIN_SPRING)
    assert skip is not None and skip.kind == "gap" and skip.count == 1
    assert skip.key_ms == BERLIN_SPRING - 1 == skip.last_ms
    assert skip.words() == (
        "02:30 local did not exist on 2027-03-28 in Europe/Berlin (clocks went 02:00 -> 03:00); "
        "rule dst_gap=skip: no run"
    )
    assert fire_times_between(spec, skip.key_ms - 1, skip.key_ms, 1) == []  # never a fire
    shifted = CronSpec(expression="30 2 * * *", timezone="Europe/Berlin")  # default: shift
    assert only_skip(shifted, BERLIN_SPRING) is None
    nine = CronSpec(expression="0 9 * * *", timezone="Europe/Berlin", dst_gap="skip")
    assert only_skip(nine, BERLIN_SPRING) is None  # nothing matches in the gap


def test_every_matching_time_in_a_gap_is_one_row() -> None:
    spec = CronSpec(expression="*/15 * * * *", timezone="Europe/Berlin")  # default: skip
    skip = only_skip(spec, BERLIN_SPRING)
    assert skip is not None and skip.count == 4
    assert (skip.first_wall.minute, skip.last_wall.minute) == (0, 45)
    assert "02:00 to 02:45 (4 times) local did not exist" in skip.words()


def test_a_fold_skip_is_the_second_pass_of_each_repeated_time() -> None:
    daily = CronSpec(expression="30 1 * * *", timezone="America/New_York")  # default: first
    skip = only_skip(daily, NY_AUTUMN)
    assert skip is not None and skip.kind == "fold" and skip.count == 1
    assert skip.key_ms == skip.last_ms == NY_AUTUMN + 30 * 60_000  # 01:30 EST
    assert "01:30 local happened twice on 2027-11-07 in America/New_York" in skip.words()
    assert "(clocks went 02:00 -> 01:00); rule dst_fold=first" in skip.words()
    quarter = CronSpec(expression="*/15 * * * *", timezone="America/New_York", dst_fold="first")
    run = only_skip(quarter, NY_AUTUMN)
    assert run is not None and run.count == 4
    assert (run.key_ms, run.last_ms) == (NY_AUTUMN, NY_AUTUMN + 45 * 60_000)
    assert fire_times_between(quarter, run.key_ms - 1, run.last_ms, 10) == []  # none between
    assert skip_at(quarter, NY_AUTUMN + 15 * 60_000) == run
    assert skip_at(quarter, NY_AUTUMN + 20 * 60_000) is None  # 01:20: no match
    both = CronSpec(expression="30 1 * * *", timezone="America/New_York", dst_fold="both")
    assert only_skip(both, NY_AUTUMN) is None


def every_skip(spec: CronSpec, after: int, until: int) -> list[DstSkip]:
    found = [skip_of(spec, t) for t in transitions_between(spec.zone, after, until)]
    return [k for k in found if k is not None]


def fire_along(spec: CronSpec, start: int, end: int, rng: random.Random) -> list[DstSkip]:
    """What the fires of ``spec`` from ``start`` to ``end`` decide, each fire late by a random
    amount (over several fire times, at times), as the firer asks; checks each skip's fire."""
    decided: list[DstSkip] = []
    first_due = initial = next_fire(spec, start)
    while first_due < end:
        later = next_fire(spec, first_due)
        now = first_due + rng.choice([0, 1000, later - first_due, 3 * (later - first_due)])
        for skip in decided_with(spec, first_due, now):
            assert first_due <= next_fire(spec, skip.key_ms - 1) <= now, skip
            decided.append(skip)
        first_due = next_fire(spec, now)
    keys = [k.key_ms for k in decided]
    assert len(keys) == len(set(keys)), "decided twice"
    every = every_skip(spec, start - 400 * 86_400_000, end)
    assert decided == [k for k in every if initial <= next_fire(spec, k.key_ms) < first_due]
    return decided


def test_each_skip_is_decided_once_with_the_first_fire_after_it() -> None:
    rng = random.Random(38)
    cases = [
        ("30 2 * * *", "Europe/Berlin", "skip", None),
        ("*/15 * * * *", "Europe/Berlin", None, None),
        ("30 1 * * *", "America/New_York", None, None),
        ("*/20 1 * * *", "America/New_York", "skip", "first"),
        ("*/15 1-2 * * 0", "Australia/Lord_Howe", None, None),  # half-hour changes
    ]
    day = 86_400_000
    for expression, zone, gap, fold in cases:
        spec = CronSpec(expression=expression, timezone=zone, dst_gap=gap, dst_fold=fold)
        found = 0
        for t in transitions_between(spec.zone, ms(2027, 1, 1), ms(2029, 1, 1)):
            decided = fire_along(spec, t.at_ms - 3 * day, t.at_ms + 9 * day, rng)
            want = [t] if skip_of(spec, t) is not None else []
            assert [k.transition for k in decided] == want, (expression, t)
            found += len(decided)
        assert found, expression
    yearly = CronSpec(expression="0 2 28 3 *", timezone="Europe/Berlin", dst_gap="skip")
    (skip,) = fire_along(yearly, ms(2026, 12, 1), ms(2029, 6, 1), rng)
    assert skip.key_ms == ms(2027, 3, 28, 1) - 1  # decided a year later, with 2028's run


def test_a_fire_far_from_any_change_decides_none() -> None:
    spec = CronSpec(expression="* * * * *", timezone="Europe/Berlin")
    july = ms(2027, 7, 1, 12)
    assert decided_with(spec, july, july + 60_000) == []


def test_a_wall_time_in_a_gap_or_fold_names_its_transition_and_rule() -> None:
    skip = CronSpec(expression="30 2 * * *", timezone="Europe/Berlin", dst_gap="skip")
    shift = CronSpec(expression="30 2 * * *", timezone="Europe/Berlin")
    wall = datetime(2027, 3, 28, 2, 30)
    t = transition_of_wall(skip, wall)
    assert t is not None and t.at_ms == BERLIN_SPRING
    assert wall_words(skip, wall, t).endswith("rule dst_gap=skip: no run")
    assert wall_words(shift, wall, t).endswith(
        "rule dst_gap=shift: its run is at 03:00 local instead"
    )
    assert transition_of_wall(skip, datetime(2027, 3, 28, 3, 30)) is None
    fold = CronSpec(expression="30 1 * * *", timezone="America/New_York")
    folded = datetime(2027, 11, 7, 1, 30)
    t = transition_of_wall(fold, folded)
    assert t is not None and t.at_ms == NY_AUTUMN
    assert wall_words(fold, folded, t) == (
        "01:30 local happened twice on 2027-11-07 in America/New_York (clocks went 02:00 -> "
        "01:00): at 2027-11-07T05:30:00Z and at 2027-11-07T06:30:00Z; rule dst_fold=first: a "
        "run at the first only, none at the second"
    )
    assert wall_matches(fold, folded) and not wall_matches(fold, datetime(2027, 11, 7, 1, 31))


def test_a_per_second_schedules_hour_is_counted_no_further_than_the_limit() -> None:
    spec = CronSpec(expression="* * * * * *", timezone="Europe/Berlin")
    skip = only_skip(spec, BERLIN_SPRING)
    assert skip is not None and skip.count == SKIP_COUNT_LIMIT + 1  # a lower bound
    assert f"02:00 to 02:59:59 ({SKIP_COUNT_LIMIT}+ times) local did not exist" in skip.words()
    minutely = CronSpec(expression="* * * * *", timezone="Europe/Berlin")
    counted = only_skip(minutely, BERLIN_SPRING)
    assert counted is not None and counted.count == 60  # exact under the limit
    assert "02:00 to 02:59 (60 times)" in counted.words()
