"""Deadlines, priorities and spread through the gRPC API and the typed client: a deadline as
a time or as a duration after the job is due, each shown back on the job; bad values answered
INVALID_ARGUMENT naming the field (never a traceback); ``jobs list --state expired``; a
schedule's spread and the preview of its times."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.helpers import embedded_server
from timeshard.client import AsyncClient, NewJob
from timeshard.errors import InvalidArgument
from timeshard.model import JobState, spread_offset_of
from timeshard.testing.waits import wait_until


async def test_deadline_and_priority_through_the_typed_client() -> None:
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
        relative = (await c.schedule("t", at=at, deadline_in=600, priority=4)).job
        assert relative.deadline == at + timedelta(minutes=10) and relative.priority == 4
        absolute = (await c.schedule("t", at=at, deadline=at + timedelta(seconds=5))).job
        assert absolute.deadline == at + timedelta(seconds=5) and absolute.priority == 0
        plain = (await c.schedule("t", at=at)).job
        assert plain.deadline is None
        [many] = await c.schedule_many([NewJob(job_type="t", at=at, deadline_in=1, priority=9)])
        assert many.job.deadline == at + timedelta(seconds=1) and many.job.priority == 9
        with pytest.raises(InvalidArgument) as before:
            await c.schedule("t", at=at, deadline=at - timedelta(seconds=1))
        assert before.value.field == "deadline"
        with pytest.raises(InvalidArgument) as negative:
            await c.schedule("t", at=at, deadline_in=-5)
        assert negative.value.field == "deadline_in"
        with pytest.raises(InvalidArgument) as priority:
            await c.schedule("t", priority=10)
        assert priority.value.field == "priority"
        with pytest.raises(InvalidArgument) as both:
            await c.schedule("t", deadline=at, deadline_in=5)
        assert both.value.field == "deadline"
        with pytest.raises(InvalidArgument) as batch:
            await c.schedule_many([NewJob(job_type="t"), NewJob(job_type="t", priority=11)])
        assert batch.value.field == "jobs[1].priority"


async def test_an_expired_job_is_listed_by_its_state_and_the_cli_shows_it() -> None:
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        job = (await c.schedule("nobody.polls", deadline_in=0.05)).job
        got = await wait_until(
            lambda: c.get(job.job_id),
            20,  # a busy machine
            "the job to expire",
            until=lambda j: j.state is JobState.EXPIRED,
            every=0.02,
        )
        assert got.state is JobState.EXPIRED and not got.will_run
        assert got.last_error.startswith("not started by its deadline")
        listed = [j.job_id async for j in c.list_jobs(state="expired")]
        assert listed == [job.job_id]
        from timeshard.cli.main import main

        def cli() -> int:
            return main(["--server", server.address, "jobs", "list", "--state", "expired"])

        assert await asyncio.to_thread(cli) == 0


async def test_a_schedule_with_a_spread_and_its_preview() -> None:
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        s = await c.create_schedule(
            "report", cron="0 * * * *", schedule_id="r1", spread=timedelta(minutes=10)
        )
        assert s.spread == timedelta(minutes=10)
        assert (await c.get_schedule("r1")).spread == timedelta(minutes=10)
        times = await c.preview("0 * * * *", spread=600, schedule_id="r1", count=3)
        offset = timedelta(milliseconds=spread_offset_of("r1", 600_000))
        assert [t.runs_at - t.utc for t in times] == [offset] * 3  # type: ignore[operator]
        plain = await c.preview("0 * * * *", count=1)
        assert plain[0].runs_at == plain[0].utc  # no spread: runs at its time
        with pytest.raises(InvalidArgument) as wide:
            await c.create_schedule("report", cron="*/5 * * * *", spread=300)
        assert wide.value.field == "spread"
        with pytest.raises(InvalidArgument) as no_id:
            await c.preview("0 * * * *", spread=600)
        assert no_id.value.field == "schedule_id"
