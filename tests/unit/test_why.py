"""Why an occurrence ran or did not (``node.why``, ``ExplainOccurrence``): the chain in words
from the ledger and the job, a time that is no occurrence with the nearest ones, unknown
schedules and jobs as NOT_FOUND naming them, and bad requests as INVALID_ARGUMENT."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
import pytest

from tests.unit.helpers import START_MS, advance, embedded_server, running
from tests.unit.test_grpc_api import serving, status_of
from tests.unit.test_schedules import drain, occ, sched
from timeshard.client import AsyncClient
from timeshard.errors import InvalidArgument, NotFound
from timeshard.ledger import Reason
from timeshard.node import JobSpec
from timeshard.node.why import occurrence_of
from timeshard.sharding import MINUTE_MS
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import ts


async def test_the_chain_of_a_run_occurrence_names_its_decision_job_and_outcome() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched(timezone="Europe/Berlin"))
        await advance(node, clock, 60, step=5)
        await drain(node)
        by_time = await node.explain.occurrence("s1", START_MS + MINUTE_MS)
        by_job = await node.explain.job(occ(1))
        assert by_time == by_job
        assert by_time.found and by_time.row is not None and by_time.row.reason is Reason.CREATED
        assert by_time.job is not None and by_time.job.state.value == "succeeded"
        words = "\n".join(by_time.steps)
        assert "cron '* * * * *' in Europe/Berlin" in words
        assert "2027-01-15T09:01:00+01:00" in by_time.nominal_local
        assert "by node test-node, shard epoch" in words and "created its job" in words
        assert f"job {occ(1)}" in words and "succeeded" in words


async def test_a_time_that_is_no_occurrence_says_so_with_the_nearest() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched())
        await advance(node, clock, 150, step=5)
        e = await node.explain.occurrence("s1", START_MS + 90_000)
        assert not e.found and e.row is None
        assert e.nearest == (
            START_MS,
            START_MS + MINUTE_MS,
            START_MS + 2 * MINUTE_MS,
            START_MS + 3 * MINUTE_MS,
        )
        assert "is no occurrence of it; nearest: 2027-01-15T08:00:00Z" in e.steps[-1]
        future = await node.explain.occurrence("s1", START_MS + 10 * MINUTE_MS)
        assert future.found and "not due yet" in future.steps[-1]


async def test_unknown_schedules_and_jobs_are_not_found_by_name() -> None:
    async with running() as (node, _):
        with pytest.raises(NotFound, match="nosuch"):
            await node.explain.occurrence("nosuch", START_MS)
        with pytest.raises(NotFound, match="ghost@5"):
            await node.explain.job("ghost@5")
        ((plain, _),) = await node.jobs.schedule_many(
            [JobSpec(job_type="t", payload=b"", run_at=START_MS + 1000)]
        )
        e = await node.explain.job(plain.job_id)
        assert e.schedule_id == "" and "created at" in e.steps[0] and e.job == plain
    assert occurrence_of("a@123") == ("a", 123) and occurrence_of("a@x") is None
    assert occurrence_of("plain") is None


async def test_explain_over_grpc_checks_its_request() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        for request, field in (
            (pb.ExplainOccurrenceRequest(), "schedule_id"),
            (pb.ExplainOccurrenceRequest(schedule_id="s"), "at"),
            (pb.ExplainOccurrenceRequest(job_id="j", schedule_id="s"), "job_id"),
            (pb.ExplainOccurrenceRequest(job_id="j", recent=201), "recent"),
        ):
            code, msg = await status_of(jobs.ExplainOccurrence(request))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and field in msg, (request, msg)
        code, msg = await status_of(
            jobs.ExplainOccurrence(pb.ExplainOccurrenceRequest(schedule_id="nosuch", at=ts(1)))
        )
        assert code is grpc.StatusCode.NOT_FOUND and "nosuch" in msg


async def test_the_python_client_explains_an_occurrence() -> None:
    async with embedded_server() as server:
        node = server.node
        now = node.clock.now_ms()
        await node.schedules.create(sched(cron="* * * * * *"))  # every second
        nominal = (now // 1000 + 1) * 1000
        await wait_until(
            lambda: node.metrics.registry.get_sample_value(
                "timeshard_schedule_occurrences_total", {"reason": "created"}
            ),
            timeout=15,
            what="a fire",
        )
        async with AsyncClient(server.address, tls=False, token="") as c:
            e = await c.explain("s1", datetime.fromtimestamp(nominal / 1000, UTC), recent=5)
            assert e.found and e.entry is not None and e.entry.reason == "created"
            assert e.entry.job_id == f"s1@{nominal}" and e.job is not None and e.recent
            assert e.nominal == datetime.fromtimestamp(nominal / 1000, UTC)
            with pytest.raises(NotFound, match="nosuch"):
                await c.explain(job_id="nosuch")
            with pytest.raises(InvalidArgument, match="time zone"):
                await c.explain("s1", datetime(2026, 1, 1))
