"""The occurrence ledger on the fire path (embedded store, fake clock): a row for every
nominal occurrence, skips included, with its reason, the node and epoch that decided it and
the words of why; the counters by reason; and ``plan_fire``'s decisions against a plan made by
listing every due time."""

from __future__ import annotations

import random
from pathlib import Path

from tests.unit.helpers import START_MS, advance, running
from tests.unit.test_catchup import EXPRESSIONS, STARTS, ZONES
from tests.unit.test_schedules import drain, occ, sched
from timeshard.clock import FakeClock
from timeshard.cron import next_fire
from timeshard.ledger import LedgerRow, Reason
from timeshard.model import Job, MisfirePolicy, OverlapPolicy, Schedule
from timeshard.node import Node
from timeshard.node.schedules import plan_fire, run_time, spec_of
from timeshard.sharding import MINUTE_MS, shard_of
from timeshard.store.base import Retention, entry_for, schedule_entry
from timeshard.store.sqlite import SqliteStore


async def ledger(node: Node, sid: str = "s1") -> list[LedgerRow]:
    """Oldest first."""
    rows = await node.store.read_ledger(sid, at_or_before=2**62, limit=1000)
    return rows[::-1]


def at(minute: int) -> int:
    return START_MS + minute * MINUTE_MS


def skipped(node: Node, schedule: str, reason: str) -> float | None:
    return node.metrics.registry.get_sample_value(
        "timeshard_schedule_occurrences_skipped_total", {"schedule": schedule, "reason": reason}
    )


async def test_each_occurrence_has_a_row_naming_its_job_node_and_epoch() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched())
        for _ in range(2):
            await advance(node, clock, 60, step=5)
            await drain(node)
        rows = await ledger(node)
        epoch = node.dispatchers[shard_of("s1", node.store.num_shards)].epoch
        assert [(r.nominal, r.reason, r.job_id) for r in rows] == [
            (at(1), Reason.CREATED, occ(1)),
            (at(2), Reason.CREATED, occ(2)),
        ]
        assert all(r.node == "test-node" and r.epoch == epoch >= 1 for r in rows)
        assert rows[0].run_at == at(1) and rows[0].decided_at >= at(1)
        created = node.metrics.registry.get_sample_value(
            "timeshard_schedule_occurrences_total", {"reason": "created"}
        )
        assert created == 2


async def test_an_outage_is_one_row_of_missed_runs_and_one_caught_up(tmp_path: Path) -> None:
    path = tmp_path / "db"
    async with running(path) as (node, clock):
        await node.schedules.create(sched(misfire=MisfirePolicy.ONCE, misfire_grace_ms=30_000))
        await advance(node, clock, 61, step=5)
        await drain(node)
    clock.advance(10 * 60 + 30)  # minutes 2..11 pass unfired
    async with running(path, clock=clock) as (node, clock):
        await advance(node, clock, 2, step=1)
        rows = await ledger(node)
        assert [(r.nominal, r.end, r.count, r.reason) for r in rows] == [
            (at(1), at(1), 1, Reason.CREATED),
            (at(2), at(10), 9, Reason.MISSED_SKIPPED),
            (at(11), at(11), 1, Reason.CAUGHT_UP),
        ]
        assert "misfire=once runs only the latest" in rows[1].notes[0]
        assert rows[2].job_id == occ(11) and "caught up by misfire=once" in rows[2].notes[0]
        assert skipped(node, "s1", "missed_skipped") == 9


async def test_a_run_still_going_makes_the_next_a_skip_for_overlap() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched(overlap=OverlapPolicy.SKIP))
        await advance(node, clock, 60, step=5)
        claimed = await node.claims.claim(
            worker="w", types=["cron.t"], limit=1, wait_s=0, lease_s=600
        )
        assert [c.job.job_id for c in claimed] == [occ(1)]
        await advance(node, clock, 60, step=5)  # minute 1's run is still going
        rows = await ledger(node)
        assert [(r.nominal, r.reason, r.job_id) for r in rows] == [
            (at(1), Reason.CREATED, occ(1)),
            (at(2), Reason.SKIPPED_OVERLAP, ""),
        ]
        assert "1 earlier run(s) still going" in rows[1].notes[0]
        assert skipped(node, "s1", "skipped_overlap") == 1


async def test_runs_due_while_paused_are_paused_in_the_ledger() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched())
        await advance(node, clock, 30, step=5)
        await node.schedules.pause("s1")
        await advance(node, clock, 3 * 60, step=5)  # minute 1's entry comes due: paused
        marker = await ledger(node)
        assert [(r.nominal, r.reason) for r in marker] == [(at(1), Reason.PAUSED)]
        assert skipped(node, "s1", "paused") is None  # decided for good only on resume
        await node.schedules.resume("s1")  # at 3:30: minutes 1, 2 missed, 3 on time
        await advance(node, clock, 1, step=1)
        rows = await ledger(node)
        assert [(r.nominal, r.reason) for r in rows] == [
            (at(1), Reason.PAUSED),
            (at(2), Reason.SKIPPED_OVERLAP),  # once keeps minute 2; one may run: the newest
            (at(3), Reason.CREATED),
        ]
        assert "due while the schedule was paused" in rows[0].notes[0]
        assert skipped(node, "s1", "paused") == 1


async def test_a_dst_shift_and_a_spread_are_said_in_the_row() -> None:
    spring = 1_806_192_000_000  # 2027-03-28T00:00:00Z; Berlin skips 02:00-03:00 local
    async with running(clock=FakeClock(spring)) as (node, clock):
        await node.schedules.create(
            sched(cron="30 2 * * *", timezone="Europe/Berlin", spread_ms=600_000)
        )
        await advance(node, clock, 3600 + 700, step=60)
        (row,) = await ledger(node)
        assert row.reason is Reason.CREATED and row.nominal == spring + 3_600_000  # 03:00 local
        words = " ".join(row.notes)
        assert "falls in the time the clocks skip" in words and "dst_gap=shift" in words
        assert "spread: runs" in words and row.run_at >= row.nominal


async def test_an_occurrence_made_already_is_said_deduped() -> None:
    async with running() as (node, clock):
        s = await node.schedules.create(sched())
        job_id = s.occurrence_id(at(1))
        job = Job(  # made by a fire cut off before it recorded it
            job_id=job_id,
            shard=shard_of(job_id, node.store.num_shards),
            job_type=s.job_type,
            payload=s.payload,
            run_at=run_time(s, job_id, at(1)),
            created_at=START_MS,
            max_attempts=3,
        )
        await node.store.create_jobs([(job, entry_for(job, job.run_at, START_MS))])
        await advance(node, clock, 61, step=5)
        (row,) = await ledger(node)
        assert row.job_id == job_id and any("deduped" in n for n in row.notes)


def reference_reasons(s: Schedule, now: int, active: int) -> dict[int, Reason]:
    """What becomes of each due time, by listing them all (as ``test_catchup``'s
    reference plan does); the queued time that stays queued has no new decision."""
    spec = spec_of(s)
    due: list[int] = [s.next_fire] if s.next_fire <= now else []
    while due and (t := next_fire(spec, due[-1])) <= now:
        due.append(t)
    missed = [t for t in due if now - t > s.misfire_grace_ms]
    on_time = [t for t in due if now - t <= s.misfire_grace_ms]
    keep = {"skip": [], "once": missed[-1:]}.get(s.misfire, missed[-s.max_catchup :])
    out = {t: Reason.MISSED_SKIPPED for t in missed if t not in keep}
    candidates = keep + on_time
    capacity = max(0, (s.max_concurrent if s.overlap is OverlapPolicy.ALLOW else 1) - active)
    if s.queued_at:
        candidates = [s.queued_at, *candidates]
        run = candidates[:capacity]
    else:
        run = candidates[len(candidates) - capacity :] if capacity else []
    rest = [t for t in candidates if t not in run]
    for t in run:
        out[t] = Reason.CAUGHT_UP if t in keep else Reason.CREATED
    if s.overlap is OverlapPolicy.QUEUE and rest:
        if rest[0] != s.queued_at:
            out[rest[0]] = Reason.QUEUED
        rest = rest[1:]
    out |= {t: Reason.SKIPPED_OVERLAP for t in rest}
    return out


async def test_every_due_time_is_decided_once_as_listing_them_all_decides() -> None:
    rng = random.Random(38)
    for case in range(200):
        s = sched(
            cron=rng.choice(EXPRESSIONS),
            timezone=rng.choice(ZONES),
            misfire=rng.choice(list(MisfirePolicy)),
            misfire_grace_ms=rng.choice([1000, 60_000, 3_600_000]),
            max_catchup=rng.choice([1, 3, 20]),
            overlap=rng.choice(list(OverlapPolicy)),
            max_concurrent=rng.choice([1, 2, 5]),
        )
        spec = spec_of(s)
        first = next_fire(spec, rng.choice(STARTS) + rng.randrange(0, 3_600_000))
        reach = 600_000 if "*/5" in s.cron else 3 * 3_600_000
        now = first + rng.randrange(-60_000, reach)
        queued = next_fire(spec, first - 7_200_000) if rng.random() < 0.3 else 0
        s = s.with_(next_fire=first, queued_at=queued if queued < first else 0)
        active = rng.choice([0, 0, 1, 3])
        want = reference_reasons(s, now, active)
        plan = await plan_fire(s, now, active)
        got: dict[int, Reason] = {}
        for d in plan.decided:
            inside = sorted(t for t in {*want, s.queued_at} if d.first <= t <= d.last)
            assert len(inside) == d.count and inside[0] == d.first, (case, d, inside)
            for t in inside:
                assert t not in got, (case, "decided twice", t)
                got[t] = d.reason
        assert got == want, (case, s, now, active)


async def test_sqlite_sweeps_ledger_rows_past_their_retention(tmp_path: Path) -> None:
    clock = FakeClock(START_MS)
    store = SqliteStore(
        tmp_path / "r.db", num_shards=4, retention=Retention(ledger_s=60), clock=clock
    )
    await store.open()
    try:
        s = sched().with_(next_fire=at(1), created_at=START_MS)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, START_MS))
        row = LedgerRow(schedule_id="s1", nominal=at(1), reason=Reason.CREATED, decided_at=START_MS)
        assert (await store.update_schedule(s, 0, None, ledger=[row]))[0]
        clock.advance(59)
        await store.sweep()
        assert await store.read_ledger("s1", at_or_before=at(5), limit=5) == [row]
        clock.advance(2)
        await store.sweep()
        assert await store.read_ledger("s1", at_or_before=at(5), limit=5) == []
    finally:
        await store.close()


async def test_a_repeated_hour_says_which_run_of_two_and_the_rule() -> None:
    fall = 1_824_940_800_000  # 2027-10-31T00:00:00Z; Berlin repeats 02:00-03:00 local
    async with running(clock=FakeClock(fall)) as (node, clock):
        await node.schedules.create(
            sched(
                cron="30 2 * * *",
                timezone="Europe/Berlin",
                dst_fold="both",
                overlap=OverlapPolicy.ALLOW,
                max_concurrent=2,
            )
        )
        await advance(node, clock, 2 * 3600, step=60)
        rows = await ledger(node)
        assert [r.nominal for r in rows] == [fall + 1_800_000, fall + 5_400_000]  # 00:30, 01:30Z
        assert "first of two runs" in rows[0].notes[0] and "dst_fold=both" in rows[0].notes[0]
        assert "second of two runs" in rows[1].notes[0]
        plain = await node.explain.occurrence("s1", fall + 1_800_000 + 86_400_000 * 2)
        assert not any("clocks" in step for step in plain.steps)  # no clock change near
