"""The gRPC surface in-process: every bad input gets its status and an actionable message;
health and reflection answer. Real server, embedded store, system clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.unit.helpers import embedded_server
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur


@asynccontextmanager
async def serving() -> AsyncIterator[grpc.aio.Channel]:
    async with embedded_server() as server:
        channel = grpc.aio.insecure_channel(server.address)
        try:
            yield channel
        finally:
            await channel.close(None)


async def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code(), info.value.details() or ""


async def test_bad_input_gets_the_right_status_and_message() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        code, msg = await status_of(
            jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", delay=Duration(seconds=-2)))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "delay" in msg and "negative" in msg
        code, msg = await status_of(jobs.ScheduleJob(pb.ScheduleJobRequest(delay=dur(1000))))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "type" in msg
        code, msg = await status_of(jobs.ScheduleJob(pb.ScheduleJobRequest(type="t")))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "delay or a run_at" in msg
        code, msg = await status_of(
            jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", delay=dur(0), payload=b"x" * 300_000))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "over the limit" in msg
        code, msg = await status_of(jobs.GetJob(pb.GetJobRequest(job_id="nope")))
        assert code is grpc.StatusCode.NOT_FOUND and "nope" in msg
        code, msg = await status_of(
            workers.Claim(pb.ClaimRequest(worker_id="w", types=[], max_jobs=1))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "type" in msg
        code, msg = await status_of(workers.Complete(pb.CompleteRequest(job_id="nope", fence=1)))
        assert code is grpc.StatusCode.NOT_FOUND


async def test_lease_protocol_over_grpc_rejects_stale_fences() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        resp = await jobs.ScheduleJob(
            pb.ScheduleJobRequest(type="t", delay=dur(0), idempotency_key="k")
        )
        claim = await workers.Claim(
            pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=5, wait=dur(5000), lease=dur(5000))
        )
        assert [c.job.job_id for c in claim.jobs] == [resp.job.job_id]
        fence = claim.jobs[0].fence
        assert claim.jobs[0].idempotency_key == "k"
        code, msg = await status_of(
            workers.Heartbeat(pb.HeartbeatRequest(job_id=resp.job.job_id, fence=fence - 1))
        )
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "stale" in msg
        await workers.Complete(pb.CompleteRequest(job_id=resp.job.job_id, fence=fence))
        code, msg = await status_of(
            workers.Complete(pb.CompleteRequest(job_id=resp.job.job_id, fence=fence))
        )
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        code, msg = await status_of(jobs.CancelJob(pb.CancelJobRequest(job_id=resp.job.job_id)))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "succeeded" in msg
        code, msg = await status_of(
            jobs.ScheduleJob(
                pb.ScheduleJobRequest(type="t", delay=dur(0), idempotency_key="k", payload=b"2")
            )
        )
        assert code is grpc.StatusCode.ALREADY_EXISTS and "k" in msg


async def test_health_and_reflection() -> None:
    async with serving() as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "timeshard.v1.JobService", "timeshard.v1.WorkerService"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        refl = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def one() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = set()
        async for r in refl.ServerReflectionInfo(one()):
            names |= {s.name for s in r.list_services_response.service}
        assert {"timeshard.v1.JobService", "timeshard.v1.AdminService"} <= names


async def test_schedule_jobs_batch_writes_nothing_when_one_item_is_bad() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        good = pb.ScheduleJobRequest(type="t", delay=dur(0))
        bad = pb.ScheduleJobRequest(type="t", delay=Duration(seconds=-1))
        code, msg = await status_of(jobs.ScheduleJobs(pb.ScheduleJobsRequest(jobs=[good, bad])))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "jobs[1].delay" in msg
        listed = await jobs.ListJobs(pb.ListJobsRequest(page_size=10))
        assert list(listed.jobs) == []
        resp = await jobs.ScheduleJobs(pb.ScheduleJobsRequest(jobs=[good, good]))
        assert [r.created for r in resp.results] == [True, True]
        assert len({r.job.job_id for r in resp.results}) == 2


def altered(token: str) -> str:
    """``token`` with one character in its middle changed."""
    i = len(token) // 2
    return token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]


async def test_a_page_token_the_server_never_gave_out_is_refused_by_every_listing() -> None:
    """ListJobs, ListSchedules and ListDeadLetters answer INVALID_ARGUMENT, saying what to do,
    to a token they did not give out (made up, cut short, altered, or another listing's),
    never a page from wherever it happens to point; the tokens they gave out go on."""
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        for _ in range(3):
            await jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", delay=dur(60_000)))
        for sid in ("s-1", "s-2", "s-3"):
            await jobs.CreateSchedule(
                pb.CreateScheduleRequest(
                    schedule=pb.Schedule(
                        schedule_id=sid, cron="0 2 * * *", timezone="UTC", type="t"
                    )
                )
            )
        first = await jobs.ListJobs(pb.ListJobsRequest(page_size=1))
        schedules = await jobs.ListSchedules(pb.ListSchedulesRequest(page_size=1))
        job_token, schedule_token = first.next_page_token, schedules.next_page_token
        assert job_token and schedule_token

        seen = [first.jobs[0].job_id]
        token = job_token
        while token:
            page = await jobs.ListJobs(pb.ListJobsRequest(page_size=1, page_token=token))
            seen += [j.job_id for j in page.jobs]
            token = page.next_page_token
        assert len(seen) == len(set(seen)) == 3

        made_up = [
            first.jobs[0].job_id,  # a job id (the embedded store's old token)
            "s-2",
            "bm90IGEgdG9rZW4=",
            "garbage",
            altered(job_token),
            job_token[:-3],
            schedule_token,  # another listing's
        ]
        for bad in made_up:
            calls = {
                "ListJobs": jobs.ListJobs(pb.ListJobsRequest(page_size=1, page_token=bad)),
                "ListDeadLetters": jobs.ListDeadLetters(
                    pb.ListDeadLettersRequest(page_size=1, page_token=bad)
                ),
            }
            if bad != schedule_token:
                calls["ListSchedules"] = jobs.ListSchedules(
                    pb.ListSchedulesRequest(page_size=1, page_token=bad)
                )
            for name, call in calls.items():
                code, msg = await status_of(call)
                assert code is grpc.StatusCode.INVALID_ARGUMENT, (name, bad)
                assert msg.startswith("page_token: ") and "without a page token" in msg, msg
        code, msg = await status_of(
            jobs.ListSchedules(pb.ListSchedulesRequest(page_size=1, page_token=job_token))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "page_token" in msg


async def test_finish_reports_each_item_on_its_own_fence() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        req = pb.ScheduleJobRequest(type="t", delay=dur(0))
        await jobs.ScheduleJobs(pb.ScheduleJobsRequest(jobs=[req, req]))
        claim = await workers.Claim(
            pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=2, wait=dur(5000))
        )
        a, b = claim.jobs
        resp = await workers.Finish(
            pb.FinishRequest(
                items=[
                    pb.FinishItem(job_id=a.job.job_id, fence=a.fence),
                    pb.FinishItem(job_id=b.job.job_id, fence=b.fence + 7, failed=True),
                    pb.FinishItem(job_id="nope", fence=1),
                ]
            )
        )
        codes = [(r.code, r.state) for r in resp.results]
        assert codes[0] == (0, pb.JOB_STATE_SUCCEEDED)
        assert codes[1][0] == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert codes[2][0] == grpc.StatusCode.NOT_FOUND.value[0]
        still = await jobs.GetJob(pb.GetJobRequest(job_id=b.job.job_id))
        assert still.state == pb.JOB_STATE_RUNNING and still.fence == b.fence


async def test_a_negative_claim_wait_is_refused_not_taken_as_zero() -> None:
    async with serving() as ch:
        workers = pb_grpc.WorkerServiceStub(ch)
        code, msg = await status_of(
            workers.Claim(
                pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=1, wait=Duration(seconds=-5))
            )
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("wait: ")


async def test_max_attempts_is_taken_up_to_its_limit() -> None:
    """Over it (2**31 - 1 was taken: a job that never reaches the dead-letter queue) is in
    ``test_limits``."""
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        most = await jobs.ScheduleJob(
            pb.ScheduleJobRequest(type="m", delay=dur(60_000), max_attempts=1000)
        )
        assert most.job.max_attempts == 1000


async def _claimed_once(ch: grpc.aio.Channel) -> tuple[str, int]:
    """A job of one attempt, claimed: (id, fence)."""
    jobs = pb_grpc.JobServiceStub(ch)
    workers = pb_grpc.WorkerServiceStub(ch)
    await jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", delay=dur(0), max_attempts=1))
    claim = pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=1, wait=dur(5000))
    (c,) = (await workers.Claim(claim)).jobs
    return c.job.job_id, c.fence


async def test_a_second_result_for_one_job_in_a_finish_is_refused_on_its_own() -> None:
    """Two results for one job in one batch raced each other (the outcome left to their
    order); the first now stands and the second is INVALID_ARGUMENT, changing nothing."""
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        job_id, fence = await _claimed_once(ch)
        resp = await workers.Finish(
            pb.FinishRequest(
                items=[
                    pb.FinishItem(job_id=job_id, fence=fence, failed=True, permanent=True),
                    pb.FinishItem(job_id=job_id, fence=fence),
                ]
            )
        )
        first, second = resp.results
        assert (first.code, first.state) == (0, pb.JOB_STATE_DEAD)
        assert second.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert second.job_id == job_id and second.message.startswith("items[1].job_id: ")
        dead = await jobs.GetJob(pb.GetJobRequest(job_id=job_id))
        assert dead.state == pb.JOB_STATE_DEAD and [a.outcome for a in dead.history] == ["dead"]


async def test_a_replay_naming_jobs_and_a_type_is_refused() -> None:
    """The type was ignored: named jobs of any type were replayed."""
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        job_id, fence = await _claimed_once(ch)
        await workers.Fail(pb.FailRequest(job_id=job_id, fence=fence, permanent=True))
        for call in (jobs.ReplayDeadLetters, jobs.PurgeDeadLetters):
            code, msg = await status_of(
                call(pb.ReplayDeadLettersRequest(job_ids=[job_id], type="other"))
            )
            assert code is grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("type: ")
        still = await jobs.GetJob(pb.GetJobRequest(job_id=job_id))
        assert still.state == pb.JOB_STATE_DEAD
