"""Cron catch-up after an outage or a pause does bounded work and keeps the event loop serving
(resuming a per-second schedule paused for a day once computed every missed
time, 16 s with nothing else served), and plans exactly what listing every due time would."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from croniter import croniter

from tests.unit.helpers import START_MS, advance, running
from tests.unit.test_schedules import drain, occurrences, sched
from timeshard.cron import CronSpec, fire_times_between, newest_fire_times, next_fire
from timeshard.model import MisfirePolicy, OverlapPolicy, Schedule
from timeshard.node import Node
from timeshard.node.schedules import COUNT_LIMIT, FirePlan, plan_fire, spec_of
from timeshard.sharding import minute_of
from timeshard.testing.waits import wait_until

DAY_S = 86_400
CHEAP_STEPS = DAY_S // 4
"""The catch-up's work, counted in the wall times croniter steps to while the test waits for
the fire (every computation of a fire time is such steps): far below the 86,400 seconds of the
day that listing every missed time stepped through (16 s of CPU). Counted, not timed: a bound
on the process's CPU time varied 0.7-9.3 s with the machine's load and failed two CI runs."""


def reference_plan(s: Schedule, now: int, still_active: int) -> FirePlan:
    """The plan by listing every due time (the code before the fix), as the specification."""
    spec = spec_of(s)
    due: list[int] = [s.next_fire] if s.next_fire <= now else []
    while due:
        t = next_fire(spec, due[-1])
        if t > now:
            break
        due.append(t)
    missed = [t for t in due if now - t > s.misfire_grace_ms]
    on_time = [t for t in due if now - t <= s.misfire_grace_ms]
    keep = {"skip": [], "once": missed[-1:]}.get(s.misfire, missed[-s.max_catchup :])
    candidates = keep + on_time
    skipped = len(missed) - len(keep)
    capacity = max(0, (s.max_concurrent if s.overlap is OverlapPolicy.ALLOW else 1) - still_active)
    if s.queued_at:
        candidates = [s.queued_at, *candidates]
        run = candidates[:capacity]
    else:
        run = candidates[len(candidates) - capacity :] if capacity else []
    rest = [t for t in candidates if t not in run]
    queued_at = 0
    if s.overlap is OverlapPolicy.QUEUE and rest:
        queued_at, rest = rest[0], rest[1:]
    return FirePlan(
        run=run, skipped=skipped + len(rest), queued_at=queued_at, next_fire=next_fire(spec, now)
    )


EXPRESSIONS = ["* * * * *", "*/5 * * * * *", "*/7 * * * *", "30 1 * * *", "0 */2 * * *"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]
# Around a spring-forward and a fall-back in New York and Berlin, and an ordinary day.
STARTS = [1_710_050_000_000, 1_730_600_000_000, 1_711_840_000_000, 1_729_900_000_000, START_MS]


async def test_the_plan_is_what_listing_every_due_time_gives() -> None:
    rng = random.Random(10)
    for case in range(150):
        expression = rng.choice(EXPRESSIONS)
        s = sched(
            cron=expression,
            timezone=rng.choice(ZONES),
            dst_fold=rng.choice(["", "first", "both"]),
            dst_gap=rng.choice(["", "shift", "skip"]),
            misfire=rng.choice(list(MisfirePolicy)),
            misfire_grace_ms=rng.choice([1000, 1500, 60_000, 3_600_000]),  # 1 s is the least
            max_catchup=rng.choice([1, 3, 20]),
            overlap=rng.choice(list(OverlapPolicy)),
            max_concurrent=rng.choice([1, 2, 5]),
        )
        spec = spec_of(s)
        first = next_fire(spec, rng.choice(STARTS) + rng.randrange(0, 3_600_000))
        reach = 600_000 if "*/5" in expression else 3 * 3_600_000
        now = first + rng.randrange(-60_000, reach)
        queued = next_fire(spec, first - 7_200_000) if rng.random() < 0.3 else 0
        s = s.with_(next_fire=first, queued_at=queued if queued < first else 0)
        active = rng.choice([0, 0, 1, 3])
        want = reference_plan(s, now, active)
        assert await plan_fire(s, now, active) == want, (case, s, now, active)


@contextmanager
def cron_steps() -> Iterator[list[int]]:
    """How many times any croniter stepped to its next matching wall time meanwhile."""
    steps = [0]
    real = croniter.get_next

    def counting(self: croniter, *args: Any, **kwargs: Any) -> Any:
        steps[0] += 1
        return real(self, *args, **kwargs)

    with mock.patch.object(croniter, "get_next", counting):
        yield steps


class Heartbeat:
    """A task that runs at every turn of the loop, recording the longest stretch (in CPU
    time of this process) in which it could not run: what any other request would wait."""

    def __init__(self) -> None:
        self.turns = 0
        self.longest_stall = 0.0
        self._task = asyncio.create_task(self._beat(), name="heartbeat")

    async def _beat(self) -> None:
        last = time.process_time()
        while True:
            await asyncio.sleep(0)
            now = time.process_time()
            self.longest_stall = max(self.longest_stall, now - last)
            self.turns += 1
            last = now

    def stop(self) -> None:
        self._task.cancel()


async def resume_after_a_day_paused(
    misfire: MisfirePolicy, **kw: object
) -> tuple[Schedule, list[int], int, Heartbeat]:
    """A per-second schedule runs, is paused for a day, and resumed: every second of the day
    is due at once. Returns the schedule after, the scheduled times of the occurrences the
    catch-up created, the croniter steps it took, and how the loop fared meanwhile."""
    async with running() as (node, clock):
        await node.schedules.create(
            sched(
                cron="* * * * * *",
                misfire=misfire,
                misfire_grace_ms=60_000,
                overlap=OverlapPolicy.ALLOW,
                max_concurrent=500,
                **kw,
            )
        )
        await advance(node, clock, 3, step=1)
        await node.schedules.pause("s1")
        assert len(await drain(node)) == 3  # run: nothing holds the shard's cursor back
        before = set(await occurrences(node))
        clock.advance(DAY_S)  # paused: nothing fires
        await advance(node, clock, 120, step=60)

        def caught_up() -> bool:  # the dispatchers have read the day's buckets
            now_minute = minute_of(clock.now_ms())
            return all(d.cursor >= now_minute - 1 for d in node.dispatchers.values())

        await wait_until(caught_up, timeout=60, what="dispatchers reading a day of buckets")
        beat = Heartbeat()
        try:
            with cron_steps() as steps:
                resumed = await node.schedules.resume("s1")  # the day is due at once
                await fired_after(node, resumed.last_fire_at)
        finally:
            beat.stop()
        after = await node.schedules.get("s1")
        created = set(await occurrences(node)) - before
        return after, sorted(int(i.split("@")[1]) for i in created), steps[0], beat


async def fired_after(node: Node, last_fire_at: int, timeout: float = 90) -> None:
    """Wait (the fake clock standing still) until the schedule fired again."""
    await wait_until(
        lambda: node.schedules.get("s1"),
        timeout,
        "the resumed schedule to fire",
        until=lambda s: s.last_fire_at != last_fire_at,
        every=0.01,  # (each look costs CPU, which the caller is measuring)
    )


def seconds(first: int, last: int) -> list[int]:
    return list(range(first, last + 1, 1000))


async def test_resuming_a_per_second_schedule_paused_a_day_catches_up_once_cheaply() -> None:
    s, times, steps, beat = await resume_after_a_day_paused(MisfirePolicy.ONCE)
    assert steps < CHEAP_STEPS, f"catch-up took {steps} croniter steps"
    assert beat.turns > 0 and beat.longest_stall < 0.25, beat.longest_stall
    now = s.last_fire_at  # a whole second: the clock stood still since the resume
    on_time = seconds(now - 60_000, now)  # within misfire_grace: each runs
    assert times == [now - 61_000, *on_time]  # and one catch-up: the latest missed second
    assert s.skipped == COUNT_LIMIT - 1  # counted up to the limit, not one by one all day
    assert s.next_fire == now + 1000


async def test_misfire_all_catches_up_at_most_max_catchup_cheaply() -> None:
    s, times, steps, beat = await resume_after_a_day_paused(MisfirePolicy.ALL, max_catchup=100)
    assert steps < CHEAP_STEPS, f"catch-up took {steps} croniter steps"
    assert beat.turns > 0 and beat.longest_stall < 0.25, beat.longest_stall
    now = s.last_fire_at
    assert times == seconds(now - 160_000, now)  # the newest 100 missed, 61 on time
    assert s.skipped == COUNT_LIMIT - 100


def test_the_spec_used_is_the_schedules() -> None:
    s = sched(cron="* * * * * *", timezone="Europe/Berlin", dst_fold="both")
    assert spec_of(s) == CronSpec(
        expression="* * * * * *", timezone="Europe/Berlin", dst_fold="both"
    )


def listing(spec: CronSpec, after: int, until: int) -> list[int]:
    """Every fire time in ``(after, until]``, one by one."""
    out: list[int] = []
    t = next_fire(spec, after)
    while t <= until:
        out.append(t)
        t = next_fire(spec, t)
    return out


def test_fire_times_in_a_window_oldest_and_newest_match_listing_them() -> None:
    rng = random.Random(5)
    for case in range(120):
        spec = CronSpec(
            expression=rng.choice(EXPRESSIONS),
            timezone=rng.choice(ZONES),
            dst_fold=rng.choice([None, "first", "both"]),
            dst_gap=rng.choice([None, "shift", "skip"]),
        )
        after = rng.choice(STARTS) + rng.randrange(0, 3_600_000)
        until = after + rng.randrange(0, 600_000 if "*/5" in spec.expression else 10_800_000)
        every = listing(spec, after, until)
        n = rng.choice([1, 2, 7, 100])
        assert fire_times_between(spec, after, until, n) == every[:n], (case, spec)
        assert newest_fire_times(spec, after, until, n) == every[-n:], (case, spec)
