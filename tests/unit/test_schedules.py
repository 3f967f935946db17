"""Cron schedules on the embedded store and the fake clock: occurrences, misfire and overlap
policies, pause/resume, one run per occurrence (invariant 8); dead letters; per-type limits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.unit.helpers import START_MS, advance, running
from timeshard.cli.main import main
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.cron import CronSpec
from timeshard.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from timeshard.limits import MIN_MISFIRE_GRACE_MS
from timeshard.model import BucketEntry, JobState, MisfirePolicy, OverlapPolicy, Schedule
from timeshard.node import JobSpec, Node, TypePolicy
from timeshard.node.schedules import ScheduleFirer
from timeshard.server import Server
from timeshard.sharding import MINUTE_MS
from timeshard.store.sqlite import SqliteStore
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, schedule_from_pb

EVERY_MINUTE = "* * * * *"


def sched(sid: str = "s1", cron: str = EVERY_MINUTE, **kw: object) -> Schedule:
    fields: dict[str, object] = {
        "schedule_id": sid,
        "shard": 0,
        "cron": cron,
        "timezone": "UTC",
        "job_type": "cron.t",
        "payload": b'{"from": "cron"}',
        "next_fire": 0,
        "created_at": 0,
    }
    fields.update(kw)
    return Schedule(**fields)  # type: ignore[arg-type]


async def occurrences(node: Node, sid: str = "s1") -> dict[str, JobState]:
    page = await node.jobs.list_jobs(state=None, job_type="cron.t", limit=1000, page_token="")
    return {j.job_id: j.state for j in page.jobs if j.job_id.startswith(sid + "@")}


def occ(minute: int, sid: str = "s1") -> str:
    """The occurrence id of the run ``minute`` minutes after START_MS."""
    return f"{sid}@{START_MS + minute * MINUTE_MS}"


async def drain(node: Node) -> list[str]:
    """Claim and complete every due cron.t job; returns their ids."""
    done = []
    for c in await node.claims.claim(worker="w", types=["cron.t"], limit=100, wait_s=0, lease_s=30):
        await node.attempts.complete(c.job.job_id, c.job.fence)
        done.append(c.job.job_id)
    return done


async def test_each_occurrence_becomes_a_job_with_a_derived_id() -> None:
    async with running() as (node, clock):
        created = await node.schedules.create(sched())
        assert created.next_fire == START_MS + MINUTE_MS
        ran: list[str] = []
        for _ in range(4):
            await advance(node, clock, 60, step=5)
            ran += await drain(node)
        assert ran == [occ(1), occ(2), occ(3), occ(4)]
        job = await node.jobs.get(occ(1))
        assert job.payload == b'{"from": "cron"}' and job.run_at == START_MS + MINUTE_MS
        with pytest.raises(AlreadyExists):
            await node.schedules.create(sched())


async def outage(path: Path, policy: MisfirePolicy, **kw: object) -> dict[str, JobState]:
    """Run a every-minute schedule, stop the node 10 minutes, start it again."""
    async with running(path) as (node, clock):
        await node.schedules.create(sched(misfire=policy, misfire_grace_ms=30_000, **kw))
        await advance(node, clock, 61, step=5)
        assert await drain(node) == [occ(1)]
    clock.advance(10 * 60 + 30)  # the cluster is down; minutes 2..11 pass unfired
    async with running(path, clock=clock) as (node, clock):
        await advance(node, clock, 2, step=1)
        return await occurrences(node)


async def test_misfire_skip_drops_missed_runs(tmp_path: Path) -> None:
    assert set(await outage(tmp_path / "db", MisfirePolicy.SKIP)) == {occ(1)}


async def test_misfire_once_runs_one_catch_up_for_the_latest_missed_time(tmp_path: Path) -> None:
    assert set(await outage(tmp_path / "db", MisfirePolicy.ONCE)) == {occ(1), occ(11)}


async def test_misfire_all_runs_every_missed_run_up_to_max_catchup(tmp_path: Path) -> None:
    got = await outage(
        tmp_path / "db",
        MisfirePolicy.ALL,
        max_catchup=4,
        overlap=OverlapPolicy.ALLOW,
        max_concurrent=10,
    )
    assert set(got) == {occ(1), occ(8), occ(9), occ(10), occ(11)}


async def run_with_a_slow_handler(
    overlap: OverlapPolicy, **kw: object
) -> tuple[dict[str, JobState], Schedule, list[str]]:
    """Minute 1's run is slow: it completes at the end of minute 3. From then on every run
    completes within its minute."""
    async with running() as (node, clock):
        await node.schedules.create(sched(overlap=overlap, **kw))
        started: list[str] = []
        held = []
        for minute in range(1, 6):
            await advance(node, clock, 60, step=5)
            for c in await node.claims.claim(
                worker="w", types=["cron.t"], limit=10, wait_s=0, lease_s=600
            ):
                started.append(c.job.job_id)
                held.append(c)
            if minute >= 3:  # the slow ones finish
                for c in held:
                    await node.attempts.complete(c.job.job_id, c.job.fence)
                held.clear()
        for c in held:
            await node.attempts.complete(c.job.job_id, c.job.fence)
        await advance(node, clock, 2, step=1)
        started += await drain(node)
        return await occurrences(node), await node.schedules.get("s1"), started


async def test_overlap_skip_skips_while_the_previous_run_is_going() -> None:
    _, s, started = await run_with_a_slow_handler(OverlapPolicy.SKIP)
    # minute 1 runs until minute 3; 2 and 3 are skipped; 4 and 5 run.
    assert started == [occ(1), occ(4), occ(5)]
    assert s.skipped == 2 and s.last_skip_at > 0


async def test_overlap_queue_lets_one_wait_and_skips_the_rest() -> None:
    _, s, started = await run_with_a_slow_handler(OverlapPolicy.QUEUE)
    # minute 2 waits for minute 1; minute 3 is skipped (one waits at most); then 4, 5.
    assert started[:2] == [occ(1), occ(2)] and occ(3) not in started
    assert s.skipped == 1


async def test_overlap_allow_runs_up_to_max_concurrent() -> None:
    _, s, started = await run_with_a_slow_handler(OverlapPolicy.ALLOW, max_concurrent=2)
    assert started[:2] == [occ(1), occ(2)] and occ(3) not in started
    assert s.skipped == 1


async def test_paused_schedule_keeps_its_place_and_applies_misfire_on_resume() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched(misfire=MisfirePolicy.ONCE, misfire_grace_ms=10_000))
        await node.schedules.pause("s1")
        await advance(node, clock, 5 * 60 + 20, step=10)
        assert await occurrences(node) == {}
        resumed = await node.schedules.resume("s1")
        assert resumed.next_fire == START_MS + MINUTE_MS  # kept its place
        await advance(node, clock, 2, step=1)
        assert set(await occurrences(node)) == {occ(5)}  # one catch-up for the latest missed


async def paused_through_an_update(new: Schedule) -> tuple[Schedule, set[str]]:
    """Create an every-minute misfire=all schedule, pause it, update it to ``new`` 3.5 minutes
    later, resume it at 7.5 minutes; returns what the update left and the runs after resume."""
    async with running() as (node, clock):
        await node.schedules.create(catching_up(sched()))
        await node.schedules.pause("s1")
        await advance(node, clock, 3 * 60 + 30, step=10)
        updated = await node.schedules.update(new)
        await advance(node, clock, 4 * 60, step=10)
        assert await occurrences(node) == {}
        await node.schedules.resume("s1")
        await advance(node, clock, 2, step=1)
        return updated, set(await occurrences(node))


def catching_up(s: Schedule) -> Schedule:
    """misfire=all with room to run every missed run at once."""
    return s.with_(
        misfire=MisfirePolicy.ALL,
        misfire_grace_ms=10_000,
        max_catchup=20,
        overlap=OverlapPolicy.ALLOW,
        max_concurrent=20,
    )


async def test_updating_a_paused_schedule_keeps_its_place() -> None:
    """The runs missed since the pause are still caught up on resume: 7, not the 4 after the
    update."""
    updated, ran = await paused_through_an_update(catching_up(sched(payload=b'{"v": 2}')))
    assert updated.paused and updated.next_fire == START_MS + MINUTE_MS
    assert ran == {occ(m) for m in range(1, 8)}


async def test_a_new_expression_takes_over_from_a_paused_schedules_place() -> None:
    """Changed cron: the new expression's runs from where the schedule stood (minute 1) are
    the missed ones: minutes 2, 4 and 6, not only those after the update (4, 6)."""
    updated, ran = await paused_through_an_update(catching_up(sched(cron="*/2 * * * *")))
    assert updated.next_fire == START_MS + 2 * MINUTE_MS
    assert ran == {occ(2), occ(4), occ(6)}


async def test_updating_a_running_schedule_keeps_or_moves_its_next_fire() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched(cron="0 * * * *"))
        await advance(node, clock, 10 * 60, step=30)
        same = await node.schedules.update(sched(cron="0 * * * *", payload=b"{}"))
        assert same.next_fire == START_MS + 60 * MINUTE_MS  # unchanged
        moved = await node.schedules.update(sched(cron="*/15 * * * *"))
        assert moved.next_fire == START_MS + 15 * MINUTE_MS  # the new spec, from now
        await advance(node, clock, 5 * 60 + 5, step=5)
        assert set(await occurrences(node)) == {occ(15)}


async def test_two_dispatchers_racing_on_one_occurrence_create_one_run() -> None:
    async with running() as (node, clock):
        s = await node.schedules.create(sched())
        await node.schedules.pause("s1")  # keep the node's own dispatcher out of the race
        paused = await node.schedules.get("s1")
        unpaused = paused.with_(paused=False)
        await node.store.update_schedule(unpaused, paused.version, None)
        clock.advance(61)
        firers = [ScheduleFirer(node.store, clock, 3, land=_land_nowhere) for _ in range(2)]
        results = await asyncio.gather(*(f.fire("s1", s.next_fire) for f in firers))
        assert sorted(r.value for r in results) == ["conflict", "handled"]  # one update won
        assert set(await occurrences(node)) == {occ(1)}


async def _land_nowhere(
    entries: Sequence[BucketEntry], *, again: Sequence[BucketEntry] = ()
) -> None:
    pass


async def test_schedule_input_is_checked() -> None:
    async with running() as (node, _):
        with pytest.raises(InvalidArgument) as info:
            await node.schedules.create(sched(cron="61 * * * *"))
        assert info.value.field == "expression"
        with pytest.raises(InvalidArgument) as info:
            await node.schedules.create(sched(timezone="Mars/Olympus"))
        assert info.value.field == "timezone"
        with pytest.raises(InvalidArgument) as info:
            sched(overlap="sometimes")
        assert info.value.field == "overlap"
        with pytest.raises(NotFound):
            await node.schedules.get("missing")
        with pytest.raises(NotFound):
            await node.schedules.delete("missing")


# -- misfire_grace has a floor -----------------------------------------------------------------


@pytest.mark.parametrize("grace_ms", [0, 1, 999])
def test_a_grace_below_one_second_is_refused_naming_the_field_and_the_minimum(
    grace_ms: int,
) -> None:
    """With misfire=skip and a grace of 0 every on-time run was counted as missed (starting a
    run takes milliseconds), so the schedule never fired; the value was accepted."""
    with pytest.raises(InvalidArgument) as info:
        sched(misfire=MisfirePolicy.SKIP, misfire_grace_ms=grace_ms)
    assert info.value.field == "misfire_grace"
    assert f"must be at least 1s, got {grace_ms / 1000:g}s" in info.value.problem
    assert sched(misfire_grace_ms=MIN_MISFIRE_GRACE_MS).misfire_grace_ms == 1000


def test_the_api_refuses_a_zero_grace() -> None:
    msg = pb.Schedule(cron="* * * * *", timezone="UTC", type="cron.t", misfire="skip")
    msg.misfire_grace.CopyFrom(dur(0))
    with pytest.raises(InvalidArgument) as info:
        schedule_from_pb(msg, "s1")
    assert info.value.field == "misfire_grace"
    msg.misfire_grace.CopyFrom(dur(1000))
    assert schedule_from_pb(msg, "s1").misfire_grace_ms == 1000


async def test_the_cli_create_and_update_refuse_a_zero_grace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
    )
    server = Server(node, port=0)
    await server.start()
    try:
        spec = ["--cron", "0 3 * * *", "--tz", "UTC", "--misfire", "skip", "--misfire-grace"]
        cli = ["--server", server.address, "schedules"]
        code = await asyncio.to_thread(main, [*cli, "create", "cron.t", *spec, "0s", "--id", "s1"])
        assert code == 2
        assert "misfire_grace: must be at least 1s, got 0s" in capsys.readouterr().err
        with pytest.raises(NotFound):
            await node.schedules.get("s1")  # nothing written
        code = await asyncio.to_thread(main, [*cli, "create", "cron.t", *spec, "1s", "--id", "s1"])
        assert code == 0
        code = await asyncio.to_thread(main, [*cli, "update", "s1", "cron.t", *spec, "0s"])
        assert code == 2
        assert "misfire_grace: must be at least 1s, got 0s" in capsys.readouterr().err
        assert (await node.schedules.get("s1")).misfire_grace_ms == 1000  # unchanged
    finally:
        await server.stop(0)


async def test_misfire_skip_with_the_smallest_grace_fires_every_on_time_run() -> None:
    async with running() as (node, clock):
        await node.schedules.create(
            sched(
                misfire=MisfirePolicy.SKIP,
                misfire_grace_ms=MIN_MISFIRE_GRACE_MS,
                overlap=OverlapPolicy.ALLOW,  # no run waits on the one before
                max_concurrent=5,
            )
        )
        await advance(node, clock, 3 * 60 + 5, step=0.7)  # a run starts up to 0.7 s late
        assert sorted(await drain(node)) == [occ(1), occ(2), occ(3)]
        assert (await node.schedules.get("s1")).skipped == 0


async def test_an_expression_that_can_never_fire_is_refused_by_create_and_preview() -> None:
    async with running() as (node, _):
        for cron in ["0 0 31 2 *", "0 0 30 2 */2", "0 0 31 4,6 */7"]:
            with pytest.raises(InvalidArgument) as info:
                await node.schedules.create(sched(cron=cron))
            assert info.value.field == "expression"
            assert "the schedule would never fire" in info.value.problem
            with pytest.raises(InvalidArgument):
                CronSpec(expression=cron, timezone="UTC")  # what preview is given
        assert await node.schedules.list_schedules(10, "") == ([], "")


async def test_a_stored_schedule_that_no_longer_checks_does_not_hold_up_its_shard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A row written before a rule got stricter ('0 0 30 2 */2' used to fire on the OR rule):
    the dispatcher lets its entry go, with an error in the log, and the jobs due with it on
    the same shard still run; an update with a valid spec makes it fire again."""
    async with running() as (node, clock):
        bad = (await node.schedules.create(sched())).with_(cron="0 0 30 2 */2")
        current = await node.schedules.get("s1")
        await node.store.update_schedule(bad, current.version, None)
        shard_mates = []
        while len(shard_mates) < 3:
            job, _ = await node.jobs.schedule(
                JobSpec(job_type="cron.t", payload=b"", run_at=START_MS + 61_000)
            )
            if job.shard == bad.shard:
                shard_mates.append(job.job_id)
        await advance(node, clock, 65, step=5)
        assert set(shard_mates) <= set(await drain(node))
        assert "schedule s1 cannot fire: expression: day-of-month 30 never occurs" in caplog.text
        fixed = await node.schedules.update(sched())
        assert fixed.next_fire == START_MS + MINUTE_MS  # its place, now 5 s late
        await advance(node, clock, 5, step=1)
        assert occ(1) in await drain(node)
        await advance(node, clock, 60, step=5)
        assert occ(2) in await drain(node)


async def test_deleted_schedule_stops_firing() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched())
        await node.schedules.delete("s1")
        await advance(node, clock, 120, step=10)
        assert await occurrences(node) == {}


# -- dead letters ----------------------------------------------------------------------------


async def test_permanent_error_goes_to_the_dlq_and_replay_runs_it_again() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b'{"x": 1}', run_at=START_MS, idempotency_key="key-1")
        )
        await advance(node, clock, 0.5)
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=30)
        dead = await node.attempts.fail(
            job.job_id, c.job.fence, "ValueError: bad input", permanent=True
        )
        assert dead.state is JobState.DEAD and dead.attempt == 1
        page = await node.dead_letters.page(job_type="t", since_ms=0, limit=10, page_token="")
        (letter,) = page.jobs
        assert letter.last_error == "ValueError: bad input" and letter.payload == b'{"x": 1}'
        assert letter.history[0].error == "ValueError: bad input"
        with pytest.raises(NotFound):
            await node.dead_letters.replay(["nope"], None)
        with pytest.raises(InvalidArgument):
            await node.dead_letters.replay([], None)


async def test_replay_gives_a_fresh_attempt_count_and_keeps_the_key() -> None:
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(
                job_type="t",
                payload=b"{}",
                run_at=START_MS,
                idempotency_key="key-1",
                max_attempts=1,
            )
        )
        await advance(node, clock, 0.5)
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=30)
        # Out of attempts:
        await node.attempts.fail(job.job_id, c.job.fence, "boom", permanent=False)
        assert (await node.jobs.get(job.job_id)).state is JobState.DEAD
        (replayed,) = await node.dead_letters.replay([], "t")
        assert replayed.state is JobState.SCHEDULED and replayed.attempt == 0
        assert replayed.idempotency_key == "key-1" and replayed.job_id == job.job_id
        await advance(node, clock, 0.5)
        (c2,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=30)
        assert c2.job.attempt == 1
        await node.attempts.complete(job.job_id, c2.job.fence)
        assert (await node.jobs.get(job.job_id)).state is JobState.SUCCEEDED
        with pytest.raises(FailedPrecondition, match="not dead"):
            await node.dead_letters.replay([job.job_id], None)


async def test_purge_removes_dead_jobs_only() -> None:
    async with running() as (node, clock):
        a, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        b, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"{}", run_at=START_MS + 3_600_000)
        )
        await advance(node, clock, 0.5)
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=30)
        await node.attempts.fail(a.job_id, c.job.fence, "x", permanent=True)
        purged = await node.dead_letters.purge([], "t")
        assert [j.job_id for j in purged] == [a.job_id]
        with pytest.raises(NotFound):
            await node.jobs.get(a.job_id)
        assert (await node.jobs.get(b.job_id)).state is JobState.SCHEDULED
        with pytest.raises(NotFound):
            await node.dead_letters.purge([a.job_id], None)


# -- per-type limits -------------------------------------------------------------------------


async def test_cluster_wide_concurrency_limit_of_a_type() -> None:
    async with running(types={"limited": TypePolicy(concurrency=2)}) as (node, clock):
        for _ in range(5):
            await node.jobs.schedule(JobSpec(job_type="limited", payload=b"{}", run_at=START_MS))
            await node.jobs.schedule(JobSpec(job_type="free", payload=b"{}", run_at=START_MS))
        await advance(node, clock, 0.5)
        got = await node.claims.claim(
            worker="w", types=["limited", "free"], limit=20, wait_s=0, lease_s=30
        )
        assert sorted(c.job.job_type for c in got).count("limited") == 2
        assert sum(1 for c in got if c.job.job_type == "free") == 5
        first = next(c for c in got if c.job.job_type == "limited")
        await node.attempts.complete(first.job.job_id, first.job.fence)
        more = await node.claims.claim(
            worker="w", types=["limited"], limit=20, wait_s=0, lease_s=30
        )
        assert len(more) == 1


async def test_per_type_max_attempts_and_backoff() -> None:
    from timeshard.node.retry import RetryPolicy

    policy = TypePolicy(max_attempts=5, retry=RetryPolicy(base_s=10, max_backoff_s=20))
    async with running(types={"t": policy}) as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=START_MS))
        assert job.max_attempts == 5
        await advance(node, clock, 0.5)
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=30)
        failed = await node.attempts.fail(job.job_id, c.job.fence, "x", permanent=False)
        assert clock.now_ms() <= failed.run_at <= clock.now_ms() + 10_000


async def test_a_row_stored_with_a_zero_grace_reads_with_the_minimum_and_fires() -> None:
    """Before the grace had its minimum, 0 was accepted and stored: such a row must still read
    (as the minimum grace) and fire, not fail every get, update and pause."""
    async with running() as (node, clock):
        made = await node.schedules.create(sched(misfire=MisfirePolicy.SKIP))
        legacy = made.with_()
        object.__setattr__(legacy, "misfire_grace_ms", 0)  # as an older node wrote it
        current = await node.schedules.get("s1")
        await node.store.update_schedule(legacy, current.version, None)
        stored = await node.schedules.get("s1")
        assert stored.misfire_grace_ms == MIN_MISFIRE_GRACE_MS
        await advance(node, clock, 61, step=1)
        assert occ(1) in await drain(node)
