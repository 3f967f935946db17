"""Every string and list that reaches the store has a limit (``timeshard.limits``): over it, the
call is INVALID_ARGUMENT naming the field, and the message shows a prefix and the length, never
the input. Replies fit in what the client accepts, so no write is applied behind a reply the
client can not read. Through the real gRPC server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from tests.unit.helpers import embedded_server
from tests.unit.test_grpc_api import status_of
from timeshard.api.replies import CLAIM_WORST_JOB_BYTES, claim_cap
from timeshard.errors import InvalidArgument
from timeshard.limits import (
    DEFAULT_MAX_REPLY_BYTES,
    MAX_ERROR_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_REPLY_BYTES,
    MAX_WORKER_ID_BYTES,
    REPLY_HEADROOM_BYTES,
)
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur
from timeshard.worker import JobContext, Worker

HUGE = "x" * 3_000_000  # the worker id that once made a 9 MB job row
Stubs = tuple[pb_grpc.JobServiceStub, pb_grpc.WorkerServiceStub, pb_grpc.AdminServiceStub]
Call = Callable[[Stubs], Any]
NOW = dur(0)


@asynccontextmanager
async def serving_at() -> AsyncIterator[tuple[grpc.aio.Channel, str]]:
    """A real server on the embedded store; a default client channel and the address."""
    async with embedded_server() as server:
        channel = grpc.aio.insecure_channel(server.address)
        try:
            yield channel, server.address
        finally:
            await channel.close(None)


@asynccontextmanager
async def serving() -> AsyncIterator[grpc.aio.Channel]:
    async with serving_at() as (channel, _):
        yield channel


def _sched(**kw: Any) -> pb.Schedule:
    base: dict[str, Any] = {"schedule_id": "s", "cron": "* * * * *", "timezone": "UTC", "type": "t"}
    return pb.Schedule(**{**base, **kw})


# (what is too big, the field the message must name, the call)
OVER_LIMIT: list[tuple[str, str, Call]] = [
    ("job type", "type", lambda s: s[0].ScheduleJob(pb.ScheduleJobRequest(type=HUGE, delay=NOW))),
    (
        "idempotency key",
        "idempotency_key",
        lambda s: s[0].ScheduleJob(
            pb.ScheduleJobRequest(type="t", delay=NOW, idempotency_key=HUGE)
        ),
    ),
    (
        "idempotency key in a batch",
        "jobs[1].idempotency_key",
        lambda s: s[0].ScheduleJobs(
            pb.ScheduleJobsRequest(
                jobs=[
                    pb.ScheduleJobRequest(type="t", delay=NOW),
                    pb.ScheduleJobRequest(type="t", delay=NOW, idempotency_key="k" * 201),
                ]
            )
        ),
    ),
    (
        "batch length",
        "jobs",
        lambda s: s[0].ScheduleJobs(
            pb.ScheduleJobsRequest(jobs=[pb.ScheduleJobRequest(type="t", delay=NOW)] * 1001)
        ),
    ),
    (
        "delay past 9999",
        "delay",
        lambda s: s[0].ScheduleJob(
            pb.ScheduleJobRequest(type="t", delay=Duration(seconds=315_576_000_000))
        ),
    ),
    (
        "run_at past 9999",
        "run_at",
        lambda s: s[0].ScheduleJob(
            pb.ScheduleJobRequest(type="t", run_at=Timestamp(seconds=253_402_300_800))
        ),
    ),
    (
        "reschedule past 9999",
        "delay",
        lambda s: s[0].RescheduleJob(
            pb.RescheduleJobRequest(job_id="j", delay=Duration(seconds=315_576_000_000))
        ),
    ),
    (
        "max_attempts",
        "max_attempts",
        lambda s: s[0].ScheduleJob(pb.ScheduleJobRequest(type="t", delay=NOW, max_attempts=1001)),
    ),
    (
        "max_attempts in a batch",
        "jobs[1].max_attempts",
        lambda s: s[0].ScheduleJobs(
            pb.ScheduleJobsRequest(
                jobs=[
                    pb.ScheduleJobRequest(type="t", delay=NOW),
                    pb.ScheduleJobRequest(type="t", delay=NOW, max_attempts=2**31 - 1),
                ]
            )
        ),
    ),
    (
        "schedule max_attempts",
        "max_attempts",
        lambda s: s[0].CreateSchedule(pb.CreateScheduleRequest(schedule=_sched(max_attempts=1001))),
    ),
    ("job id (get)", "job_id", lambda s: s[0].GetJob(pb.GetJobRequest(job_id=HUGE))),
    ("job id (cancel)", "job_id", lambda s: s[0].CancelJob(pb.CancelJobRequest(job_id=HUGE))),
    (
        "job id (reschedule)",
        "job_id",
        lambda s: s[0].RescheduleJob(pb.RescheduleJobRequest(job_id=HUGE, delay=NOW)),
    ),
    ("list type", "type", lambda s: s[0].ListJobs(pb.ListJobsRequest(type=HUGE))),
    ("list token", "page_token", lambda s: s[0].ListJobs(pb.ListJobsRequest(page_token=HUGE))),
    ("page size", "page_size", lambda s: s[0].ListJobs(pb.ListJobsRequest(page_size=1001))),
    (
        "schedule id",
        "schedule_id",
        lambda s: s[0].CreateSchedule(pb.CreateScheduleRequest(schedule=_sched(schedule_id=HUGE))),
    ),
    (
        "cron expression",
        "expression",
        lambda s: s[0].CreateSchedule(pb.CreateScheduleRequest(schedule=_sched(cron=HUGE))),
    ),
    (
        "time zone",
        "timezone",
        lambda s: s[0].CreateSchedule(pb.CreateScheduleRequest(schedule=_sched(timezone=HUGE))),
    ),
    (
        "misfire policy",
        "misfire",
        lambda s: s[0].CreateSchedule(pb.CreateScheduleRequest(schedule=_sched(misfire=HUGE))),
    ),
    (
        "dst_gap policy",
        "dst_gap",
        lambda s: s[0].CreateSchedule(pb.CreateScheduleRequest(schedule=_sched(dst_gap=HUGE))),
    ),
    (
        "schedule payload",
        "payload",
        lambda s: s[0].CreateSchedule(
            pb.CreateScheduleRequest(schedule=_sched(payload=b"p" * (MAX_PAYLOAD_BYTES + 1)))
        ),
    ),
    (
        "preview cron",
        "expression",
        lambda s: s[0].PreviewSchedule(pb.PreviewRequest(cron=HUGE, timezone="UTC")),
    ),
    (
        "preview time zone",
        "timezone",
        lambda s: s[0].PreviewSchedule(pb.PreviewRequest(cron="* * * * *", timezone=HUGE)),
    ),
    (
        "schedule id (get)",
        "schedule_id",
        lambda s: s[0].GetSchedule(pb.GetScheduleRequest(schedule_id=HUGE)),
    ),
    (
        "schedule id (pause)",
        "schedule_id",
        lambda s: s[0].PauseSchedule(pb.ScheduleIdRequest(schedule_id=HUGE)),
    ),
    (
        "schedules token",
        "page_token",
        lambda s: s[0].ListSchedules(pb.ListSchedulesRequest(page_token=HUGE)),
    ),
    (
        "dead-letter type",
        "type",
        lambda s: s[0].ListDeadLetters(pb.ListDeadLettersRequest(type=HUGE)),
    ),
    (
        "dead-letter token",
        "page_token",
        lambda s: s[0].ListDeadLetters(pb.ListDeadLettersRequest(page_token=HUGE)),
    ),
    (
        "replay ids",
        "job_ids",
        lambda s: s[0].ReplayDeadLetters(pb.ReplayDeadLettersRequest(job_ids=["a"] * 1001)),
    ),
    (
        "replay id",
        "job_ids[1]",
        lambda s: s[0].ReplayDeadLetters(pb.ReplayDeadLettersRequest(job_ids=["a", HUGE])),
    ),
    (
        "purge id",
        "job_ids[0]",
        lambda s: s[0].PurgeDeadLetters(pb.ReplayDeadLettersRequest(job_ids=[HUGE])),
    ),
    (
        "worker id",
        "worker_id",
        lambda s: s[1].Claim(pb.ClaimRequest(worker_id=HUGE, types=["t"], max_jobs=1)),
    ),
    (
        "claim types",
        "types",
        lambda s: s[1].Claim(pb.ClaimRequest(worker_id="w", types=["t"] * 257, max_jobs=1)),
    ),
    (
        "claim type",
        "type",
        lambda s: s[1].Claim(pb.ClaimRequest(worker_id="w", types=["t", HUGE], max_jobs=1)),
    ),
    (
        "claim max_jobs",
        "max_jobs",
        lambda s: s[1].Claim(pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=1001)),
    ),
    (
        "claim reply too small for a job",
        "max_reply_bytes",
        lambda s: s[1].Claim(
            pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=1, max_reply_bytes=1000)
        ),
    ),
    (
        "heartbeat job id",
        "job_id",
        lambda s: s[1].Heartbeat(pb.HeartbeatRequest(job_id=HUGE, fence=1)),
    ),
    (
        "complete job id",
        "job_id",
        lambda s: s[1].Complete(pb.CompleteRequest(job_id=HUGE, fence=1)),
    ),
    ("fail job id", "job_id", lambda s: s[1].Fail(pb.FailRequest(job_id=HUGE, fence=1))),
    (
        "finish items",
        "items",
        lambda s: s[1].Finish(pb.FinishRequest(items=[pb.FinishItem(job_id="a", fence=1)] * 1001)),
    ),
    (
        "finish job id",
        "items[0].job_id",
        lambda s: s[1].Finish(pb.FinishRequest(items=[pb.FinishItem(job_id=HUGE, fence=1)])),
    ),
    (
        "move to node",
        "to_node",
        lambda s: s[2].MoveShard(pb.MoveShardRequest(shard=0, to_node=HUGE)),
    ),
    ("drain node", "node_id", lambda s: s[2].DrainNode(pb.DrainNodeRequest(node_id=HUGE))),
]


@pytest.mark.parametrize(("what", "field", "call"), OVER_LIMIT, ids=[c[0] for c in OVER_LIMIT])
async def test_over_the_limit_is_invalid_argument_naming_the_field_not_echoing_it(
    what: str, field: str, call: Call
) -> None:
    async with serving() as ch:
        stubs = (
            pb_grpc.JobServiceStub(ch),
            pb_grpc.WorkerServiceStub(ch),
            pb_grpc.AdminServiceStub(ch),
        )
        code, msg = await status_of(call(stubs))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (what, code, msg[:300])
        assert msg.startswith(f"{field}:"), (what, msg[:300])
        assert len(msg) < 400, (what, len(msg), msg[:300])
        listed = await stubs[0].ListJobs(pb.ListJobsRequest())
        assert list(listed.jobs) == []  # nothing was written


async def test_a_worker_id_at_its_limit_claims_and_one_byte_over_changes_nothing() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        job = (await jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", delay=NOW))).job
        too_long = "é" * (MAX_WORKER_ID_BYTES // 2) + "w"  # characters fit, bytes do not
        code, msg = await status_of(
            workers.Claim(pb.ClaimRequest(worker_id=too_long, types=["t"], wait=dur(2000)))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert (
            f"{MAX_WORKER_ID_BYTES + 1} bytes" in msg and f"limit of {MAX_WORKER_ID_BYTES}" in msg
        )
        unchanged = await jobs.GetJob(pb.GetJobRequest(job_id=job.job_id))
        assert unchanged.state == pb.JOB_STATE_SCHEDULED and unchanged.lease_owner == ""
        at_limit = "w" * MAX_WORKER_ID_BYTES
        claim = await workers.Claim(
            pb.ClaimRequest(worker_id=at_limit, types=["t"], max_jobs=1, wait=dur(5000))
        )
        assert [c.job.lease_owner for c in claim.jobs] == [at_limit]


async def test_error_text_is_truncated_not_refused() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        await jobs.ScheduleJobs(
            pb.ScheduleJobsRequest(jobs=[pb.ScheduleJobRequest(type="t", delay=NOW)] * 2)
        )
        claim = await workers.Claim(
            pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=2, wait=dur(5000))
        )
        a, b = claim.jobs
        await workers.Fail(
            pb.FailRequest(job_id=a.job.job_id, fence=a.fence, error="é" * 1_000_000)
        )
        resp = await workers.Finish(
            pb.FinishRequest(
                items=[pb.FinishItem(job_id=b.job.job_id, fence=b.fence, failed=True, error=HUGE)]
            )
        )
        assert resp.results[0].code == 0
        for job_id, size in ((a.job.job_id, 2_000_000), (b.job.job_id, 3_000_000)):
            stored = await jobs.GetJob(pb.GetJobRequest(job_id=job_id))
            assert stored.state == pb.JOB_STATE_SCHEDULED  # retried, not refused
            assert len(stored.last_error.encode()) <= MAX_ERROR_BYTES
            assert stored.last_error.endswith(f"(truncated from {size} bytes)")
            assert stored.history[0].error == stored.last_error


def test_the_claim_cap_fits_the_worst_case_in_each_reply_size() -> None:
    for accepted in (0, DEFAULT_MAX_REPLY_BYTES, MAX_REPLY_BYTES):
        cap = claim_cap(accepted)
        assert cap * CLAIM_WORST_JOB_BYTES + REPLY_HEADROOM_BYTES <= (
            accepted or DEFAULT_MAX_REPLY_BYTES
        )
        assert (cap + 1) * CLAIM_WORST_JOB_BYTES > (accepted or DEFAULT_MAX_REPLY_BYTES) - (
            REPLY_HEADROOM_BYTES
        )
    assert claim_cap(0) == 15 and claim_cap(MAX_REPLY_BYTES) == 251  # as the proto says


BIG = b"p" * MAX_PAYLOAD_BYTES
JOBS = 20  # 20 payloads at the limit: 5 MiB, more than a default client takes in one reply


async def _schedule_big(jobs: pb_grpc.JobServiceStub, n: int = JOBS) -> set[str]:
    ids = set()
    for _ in range(n):  # one at a time: a batch of them would be over the request limit
        ids.add(
            (
                await jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", payload=BIG, delay=NOW))
            ).job.job_id
        )
    return ids


async def test_a_claim_never_takes_more_than_its_reply_can_carry() -> None:
    async with serving_at() as (ch, address):
        jobs = pb_grpc.JobServiceStub(ch)
        workers = pb_grpc.WorkerServiceStub(ch)
        ids = await _schedule_big(jobs)
        ask = pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=JOBS, wait=dur(5000))
        first = await workers.Claim(ask)  # a default client: 4 MiB
        assert 0 < len(first.jobs) <= claim_cap(0)
        assert all(c.job.payload == BIG and not c.job.history for c in first.jobs)
        handed_out = {c.job.job_id for c in first.jobs}
        # Every job the claim wrote as running is one the worker was handed.
        token, claimed = "", set()
        while True:
            page = await jobs.ListJobs(
                pb.ListJobsRequest(state=pb.JOB_STATE_RUNNING, page_token=token)
            )
            claimed |= {j.job_id for j in page.jobs}
            token = page.next_page_token
            if not token:
                break
        assert claimed == handed_out
        # A client that accepts more, and says so, gets the rest in one reply.
        big = grpc.aio.insecure_channel(
            address,
            options=[("grpc.max_receive_message_length", MAX_REPLY_BYTES)],
        )
        try:
            rest = await pb_grpc.WorkerServiceStub(big).Claim(
                pb.ClaimRequest(
                    worker_id="w2",
                    types=["t"],
                    max_jobs=JOBS,
                    wait=dur(5000),
                    max_reply_bytes=MAX_REPLY_BYTES,
                )
            )
        finally:
            await big.close(None)
        assert handed_out | {c.job.job_id for c in rest.jobs} == ids


async def test_list_pages_are_cut_to_fit_a_default_reply_and_lose_nothing() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        ids = await _schedule_big(jobs)
        seen: list[str] = []
        token, pages = "", 0
        while True:
            page = await jobs.ListJobs(pb.ListJobsRequest(page_size=100, page_token=token))
            assert page.ByteSize() <= DEFAULT_MAX_REPLY_BYTES
            seen += [j.job_id for j in page.jobs]
            pages += 1
            token = page.next_page_token
            if not token:
                break
        assert pages > 1 and sorted(seen) == sorted(ids)


async def test_a_schedule_batch_whose_full_reply_would_not_fit_is_answered_in_summary() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        # Just under the 4 MiB request limit; the reply adds ids and times to every job.
        one = pb.ScheduleJobRequest(type="t", payload=b"p" * 4150, delay=Duration(seconds=3600))
        request = pb.ScheduleJobsRequest(jobs=[one] * 1000)
        assert request.ByteSize() < DEFAULT_MAX_REPLY_BYTES
        resp = await jobs.ScheduleJobs(request)
        assert len(resp.results) == 1000 and all(r.created for r in resp.results)
        assert all(r.job.payload == b"" for r in resp.results)  # in summary
        stored = await jobs.GetJob(pb.GetJobRequest(job_id=resp.results[0].job.job_id))
        assert stored.payload == one.payload


def test_the_worker_sdk_refuses_a_worker_id_over_the_limit() -> None:
    with pytest.raises(InvalidArgument, match=r"worker_id: .*\(3000000 characters\)"):
        Worker(worker_id=HUGE)


async def test_a_worker_with_many_slots_runs_a_burst_of_big_payloads_once_each() -> None:
    """The SDK declares the reply size its channels accept, so its claims take a whole burst
    of jobs at the payload limit in one reply, and none is claimed behind a lost reply."""
    async with serving_at() as (ch, address):
        ids = await _schedule_big(pb_grpc.JobServiceStub(ch))
        ran: list[str] = []
        worker = Worker(lease_s=30, claim_wait_s=1)

        @worker.handler("t", concurrency=JOBS)
        async def handle(ctx: JobContext) -> None:
            assert ctx.payload == BIG
            ran.append(ctx.job_id)

        stop = asyncio.Event()
        task = asyncio.create_task(worker.run([address], stop, discover_every_s=0))
        try:
            await wait_until(lambda: len(ran) >= JOBS, 15, f"{JOBS} jobs run", every=0.05)
        finally:
            stop.set()
            await task
        assert sorted(ran) == sorted(ids)  # each once, none left behind a lost reply
