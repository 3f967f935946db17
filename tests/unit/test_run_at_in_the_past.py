"""A run_at in the past: up to ``PAST_RUN_AT_GRACE_MS`` ago it means now (stored as now, so its
lateness counts from when it was scheduled); further back it is INVALID_ARGUMENT naming the
field, as a negative delay is — on ScheduleJob, ScheduleJobs and RescheduleJob alike, and so
for the client and the CLI's ``--at``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from tests.unit.helpers import embedded_server
from tests.unit.test_grpc_api import status_of
from timeshard.cli.main import main
from timeshard.client import Client
from timeshard.clock import format_rfc3339, to_datetime
from timeshard.errors import InvalidArgument
from timeshard.limits import PAST_RUN_AT_GRACE_MS
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, ts, ts_ms

HOUR_MS = 3_600_000


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[grpc.aio.Channel, str]]:
    async with embedded_server() as server:
        channel = grpc.aio.insecure_channel(server.address)
        try:
            yield channel, server.address
        finally:
            await channel.close(None)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def at(ms: int) -> Timestamp:
    return ts(ms)


async def test_a_run_at_long_past_is_refused_on_every_rpc_and_changes_nothing() -> None:
    async with serving() as (ch, _):
        jobs = pb_grpc.JobServiceStub(ch)
        code, msg = await status_of(
            jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", run_at=at(now_ms() - HOUR_MS)))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert msg.startswith("run_at: ") and "in the past" in msg and "0s" in msg

        batch = pb.ScheduleJobsRequest(
            jobs=[
                pb.ScheduleJobRequest(type="t", delay=dur(1000)),
                pb.ScheduleJobRequest(type="t", run_at=at(now_ms() - 7 * 365 * 24 * HOUR_MS)),
            ]
        )
        code, msg = await status_of(jobs.ScheduleJobs(batch))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("jobs[1].run_at: ")
        assert list((await jobs.ListJobs(pb.ListJobsRequest())).jobs) == []

        made = await jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", delay=dur(600_000)))
        code, msg = await status_of(
            jobs.RescheduleJob(
                pb.RescheduleJobRequest(job_id=made.job.job_id, run_at=at(now_ms() - HOUR_MS))
            )
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("run_at: ")
        job = await jobs.GetJob(pb.GetJobRequest(job_id=made.job.job_id))
        assert job.run_at == made.job.run_at


async def test_a_run_at_just_past_runs_now_and_is_late_from_when_it_was_scheduled() -> None:
    """A run_at most of the grace ago: accepted, stored as now; its lateness (start minus
    run_at) is measured from there, so it is well under the time it was asked in the past."""
    asked_ago = PAST_RUN_AT_GRACE_MS - 10_000
    async with serving() as (ch, _):
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        before = now_ms()
        asked = pb.ScheduleJobRequest(type="t", run_at=at(before - asked_ago))
        resp = await jobs.ScheduleJob(asked)
        assert resp.created
        assert before <= ts_ms(resp.job.run_at) <= ts_ms(resp.job.created_at)
        again = await jobs.ScheduleJob(
            pb.ScheduleJobRequest(type="r", delay=dur(600_000), idempotency_key="move")
        )
        moved = await jobs.RescheduleJob(
            pb.RescheduleJobRequest(job_id=again.job.job_id, run_at=at(now_ms() - asked_ago))
        )
        assert ts_ms(moved.run_at) >= before

        claim = await workers.Claim(
            pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=1, wait=dur(10_000))
        )
        assert [c.job.job_id for c in claim.jobs] == [resp.job.job_id]
        job = await jobs.GetJob(pb.GetJobRequest(job_id=resp.job.job_id))
        assert ts_ms(job.started_at) - ts_ms(job.run_at) < asked_ago


def _client_schedule(address: str, run_at: int) -> None:
    with Client(address, retries=0) as c:
        c.schedule("t", {}, at=to_datetime(run_at))


async def test_the_client_and_the_cli_get_the_same_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with serving() as (_, address):
        with pytest.raises(InvalidArgument, match=r"run_at: .* in the past"):
            await asyncio.to_thread(_client_schedule, address, now_ms() - HOUR_MS)

        past = format_rfc3339(now_ms() - 2 * HOUR_MS)
        args = ["--server", address, "jobs", "schedule", "t", "--at", past]
        code = await asyncio.to_thread(main, args)
        out = capsys.readouterr()
        assert code != 0 and out.out == ""
        assert "error (INVALID_ARGUMENT): run_at: " in out.err and "in the past" in out.err
