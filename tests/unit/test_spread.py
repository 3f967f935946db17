"""Cron spread: each occurrence of a schedule runs a stable offset after its nominal time,
derived from the schedule id (the same for every occurrence and on every node, in
[0, spread), never earlier than nominal), while its id and the misfire catch-up stay on the
nominal time. ``preview`` shows the spread times; a spread that would make occurrences
overlap is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.helpers import START_MS, advance, running
from timeshard.cli.main import main
from timeshard.cron import CronSpec
from timeshard.errors import InvalidArgument
from timeshard.model import MisfirePolicy, OverlapPolicy, Schedule, spread_offset_of
from timeshard.node.scheduleops import ScheduleOps
from timeshard.sharding import MINUTE_MS

HOURLY = "0 * * * *"
SPREAD_MS = 10 * MINUTE_MS


def sched(sid: str, cron: str = HOURLY, **kw: object) -> Schedule:
    fields: dict[str, object] = {
        "schedule_id": sid,
        "shard": 0,
        "cron": cron,
        "timezone": "UTC",
        "job_type": "cron.t",
        "next_fire": 0,
        "created_at": 0,
        "spread_ms": SPREAD_MS,
    }
    fields.update(kw)
    return Schedule(**fields)  # type: ignore[arg-type]


def test_the_offset_is_stable_within_the_window_and_spreads_many_schedules() -> None:
    offsets = [spread_offset_of(f"report-{n}", SPREAD_MS) for n in range(2000)]
    assert offsets == [spread_offset_of(f"report-{n}", SPREAD_MS) for n in range(2000)]
    assert all(0 <= o < SPREAD_MS for o in offsets)
    # Spread over the window: each tenth of it holds a tenth of them, give or take.
    tenths = [0] * 10
    for o in offsets:
        tenths[o * 10 // SPREAD_MS] += 1
    assert all(140 <= n <= 260 for n in tenths), tenths
    assert sched("a").spread_offset == spread_offset_of("a", SPREAD_MS)
    assert sched("a", spread_ms=0).spread_offset == 0


async def test_occurrences_run_at_nominal_plus_the_same_offset_and_keep_their_ids() -> None:
    async with running() as (node, clock):
        s = await node.schedules.create(sched("nightly-report"))
        offset = spread_offset_of("nightly-report", SPREAD_MS)
        first_nominal = s.next_fire
        await advance(node, clock, (first_nominal - START_MS) / 1000 + 1, step=30)
        assert (
            await node.claims.claim(worker="w", types=["cron.t"], limit=1, wait_s=0, lease_s=30)
            == []
        )
        await advance(node, clock, offset / 1000 + 1, step=30)  # never early: due only now
        [c] = await node.claims.claim(worker="w", types=["cron.t"], limit=1, wait_s=0, lease_s=30)
        assert c.job.started_at >= first_nominal + offset
        await node.attempts.complete(c.job.job_id, c.job.fence)
        await advance(node, clock, 3600, step=60)  # the next hour's occurrence too
        page = await node.jobs.list_jobs(state=None, job_type="cron.t", limit=10, page_token="")
        jobs = sorted(page.jobs, key=lambda j: j.job_id)
        nominals = [first_nominal, first_nominal + 3_600_000]
        assert [j.job_id for j in jobs] == [f"nightly-report@{t}" for t in nominals]
        assert [j.run_at for j in jobs] == [t + offset for t in nominals]


async def test_a_missed_occurrence_is_caught_up_on_its_nominal_id() -> None:
    """misfire=all after a pause: the catch-up runs carry their nominal ids (backfill stays on
    the nominal times) and are never due before nominal + offset."""
    async with running() as (node, clock):
        s = await node.schedules.create(
            sched(
                "backfill",
                misfire=MisfirePolicy.ALL,
                overlap=OverlapPolicy.ALLOW,
                max_concurrent=10,
            )
        )
        await node.schedules.pause("backfill")
        await advance(node, clock, (s.next_fire - START_MS) / 1000 + 3 * 3600, step=600)
        await node.schedules.resume("backfill")
        await advance(node, clock, 2)
        page = await node.jobs.list_jobs(state=None, job_type="cron.t", limit=10, page_token="")
        offset = spread_offset_of("backfill", SPREAD_MS)
        got = {j.job_id: j.run_at for j in page.jobs}
        nominals = [s.next_fire + h * 3_600_000 for h in range(3)]
        assert set(got) >= {f"backfill@{t}" for t in nominals}
        assert all(run_at == int(i.split("@")[1]) + offset for i, run_at in got.items())


async def test_a_spread_not_shorter_than_the_interval_is_refused() -> None:
    async with running() as (node, _):
        with pytest.raises(InvalidArgument) as bad:
            await node.schedules.create(sched("too-wide", cron="*/5 * * * *", spread_ms=300_000))
        assert bad.value.field == "spread" and "overlap" in str(bad.value)
        ok = await node.schedules.create(sched("fits", cron="*/5 * * * *", spread_ms=299_000))
        assert ok.spread_ms == 299_000
        with pytest.raises(InvalidArgument) as update:
            await node.schedules.update(sched("fits", cron="* * * * *", spread_ms=299_000))
        assert update.value.field == "spread"
    with pytest.raises(InvalidArgument) as negative:
        sched("neg", spread_ms=-1)
    assert negative.value.field == "spread"


def test_preview_shows_when_each_occurrence_runs() -> None:
    spec = CronSpec(expression=HOURLY, timezone="Europe/Berlin")
    times = ScheduleOps.preview(spec, START_MS, 3, schedule_id="r", spread_ms=SPREAD_MS)
    offset = spread_offset_of("r", SPREAD_MS)
    assert [t.runs_at - t.fire.at_ms for t in times] == [offset] * 3
    assert all(t.runs_at_local.endswith("+01:00") for t in times)
    with pytest.raises(InvalidArgument) as no_id:
        ScheduleOps.preview(spec, START_MS, 3, spread_ms=SPREAD_MS)
    assert no_id.value.field == "schedule_id"


def test_the_cli_preview_prints_the_spread_times(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["schedules", "preview", HOURLY, "--tz", "UTC", "--from", "2027-01-15T08:00:00Z"]
    assert main([*args, "--count", "2", "--spread", "10m", "--id", "r", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    offset = spread_offset_of("r", SPREAD_MS)
    assert [t["nominal"] for t in shown] == ["2027-01-15T09:00:00Z", "2027-01-15T10:00:00Z"]
    for t in shown:
        from timeshard.clock import parse_rfc3339

        assert parse_rfc3339(t["runs_at"]) - parse_rfc3339(t["nominal"]) == offset
    assert main([*args, "--spread", "10m"]) != 0  # no --id
    assert "--id" in capsys.readouterr().err


def test_the_cli_sends_the_spread(tmp_path: Path) -> None:
    from timeshard.cli.main import build_parser
    from timeshard.cli.schedules import _schedule_msg

    args = build_parser().parse_args(
        ["schedules", "create", "cron.t", "--cron", HOURLY, "--tz", "UTC", "--spread", "90s"]
    )
    assert _schedule_msg(args, "x").spread.seconds == 90
