"""A repeat of an idempotency key with another time is refused like one with another body, unless
the request says if_exists=return (issue 35, item 5; invariant 1). Over gRPC, on the embedded
store and a fake clock, so "a repeat an hour later" takes no time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from tests.unit.helpers import make_node
from timeshard.clock import FakeClock, format_rfc3339
from timeshard.model import JobState
from timeshard.node import Node
from timeshard.node.repeats import AskedTime
from timeshard.server import Server
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import ts, ts_ms

MINUTE_MS = 60_000


@dataclass
class Api:
    jobs: pb_grpc.JobServiceStub
    workers: pb_grpc.WorkerServiceStub
    node: Node
    clock: FakeClock


@asynccontextmanager
async def serving() -> AsyncIterator[Api]:
    node, clock = make_node()
    server = Server(node, port=0)
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    try:
        yield Api(pb_grpc.JobServiceStub(channel), pb_grpc.WorkerServiceStub(channel), node, clock)
    finally:
        await channel.close(None)
        await server.stop(0)


def in_(seconds: float, key: str = "k", **kw: object) -> pb.ScheduleJobRequest:
    return pb.ScheduleJobRequest(
        type="t", payload=b"{}", delay=Duration(seconds=int(seconds)), idempotency_key=key, **kw
    )


def at(ms: int, key: str = "k", **kw: object) -> pb.ScheduleJobRequest:
    return pb.ScheduleJobRequest(type="t", payload=b"{}", run_at=ts(ms), idempotency_key=key, **kw)


async def refusal(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() is grpc.StatusCode.ALREADY_EXISTS, info.value.details()
    return info.value.details() or ""


async def test_the_same_key_at_another_time_is_refused_naming_both_times() -> None:
    async with serving() as api:
        first_at = api.clock.now_ms() + 60 * MINUTE_MS
        first = await api.jobs.ScheduleJob(at(first_at))
        assert first.created
        again = await api.jobs.ScheduleJob(at(first_at))
        assert not again.created and again.job.job_id == first.job.job_id
        msg = await refusal(api.jobs.ScheduleJob(at(first_at + 5 * MINUTE_MS)))
        assert f"idempotency key 'k' is already used by job {first.job.job_id}" in msg
        assert format_rfc3339(first_at) in msg and format_rfc3339(first_at + 5 * MINUTE_MS) in msg
        assert "if_exists=return" in msg
        assert len(list((await api.jobs.ListJobs(pb.ListJobsRequest())).jobs)) == 1


async def test_a_delay_counts_from_the_keys_first_request() -> None:
    """``--in 5m`` sent again, a few seconds or an hour later, is the same request (a client's
    retry, ``jobs load`` run again); ``--in 10m`` is not."""
    async with serving() as api:
        first = await api.jobs.ScheduleJob(in_(300))
        api.clock.advance(7)
        soon = await api.jobs.ScheduleJob(in_(300))
        assert not soon.created and soon.job.job_id == first.job.job_id
        msg = await refusal(api.jobs.ScheduleJob(in_(600)))
        assert "a delay counts from the key's first request" in msg
        api.clock.advance(3600)
        late = await api.jobs.ScheduleJob(in_(300))  # nothing ran it: no worker
        assert not late.created and late.job.job_id == first.job.job_id


async def test_a_time_just_past_means_now_for_a_repeat_too() -> None:
    """A run_at less than a minute ago is stored as "now"; sent again seconds later it is the
    same request, although "now" has moved."""
    async with serving() as api:
        past = api.clock.now_ms() - 20_000
        first = await api.jobs.ScheduleJob(at(past))
        assert ts_ms(first.job.run_at) == ts_ms(first.job.created_at)
        api.clock.advance(10)
        again = await api.jobs.ScheduleJob(at(past))
        assert not again.created and again.job.job_id == first.job.job_id


async def test_if_exists_return_gets_the_keys_job_whatever_the_request_says() -> None:
    async with serving() as api:
        first = await api.jobs.ScheduleJob(in_(300))
        other = at(api.clock.now_ms() + 99 * MINUTE_MS, if_exists=pb.IF_EXISTS_RETURN)
        other.payload = b'{"another": "body"}'
        got = await api.jobs.ScheduleJob(other)
        assert not got.created and got.job.job_id == first.job.job_id
        assert got.job.payload == b"{}" and got.job.run_at == first.job.run_at
        checked = in_(600, if_exists=pb.IF_EXISTS_CHECK)
        assert "a different time" in await refusal(api.jobs.ScheduleJob(checked))
        msg = await refusal(
            api.jobs.ScheduleJob(
                pb.ScheduleJobRequest(
                    type="t", payload=b"[]", delay=Duration(seconds=300), idempotency_key="k"
                )
            )
        )
        assert "with a different body (another payload)" in msg


async def test_a_batch_is_refused_whole_for_a_key_at_another_time() -> None:
    async with serving() as api:
        stored = await api.jobs.ScheduleJob(in_(300, key="stored"))
        msg = await refusal(
            api.jobs.ScheduleJobs(
                pb.ScheduleJobsRequest(jobs=[in_(60, key="new"), in_(900, key="stored")])
            )
        )
        assert f"is already used by job {stored.job.job_id}" in msg
        listed = (await api.jobs.ListJobs(pb.ListJobsRequest())).jobs
        assert [j.idempotency_key for j in listed] == ["stored"]  # "new" was not written
        msg = await refusal(
            api.jobs.ScheduleJobs(
                pb.ScheduleJobsRequest(jobs=[in_(60, key="twice"), in_(120, key="twice")])
            )
        )
        assert "jobs[1] reuses idempotency key 'twice' of an earlier job in this batch" in msg
        same = await api.jobs.ScheduleJobs(
            pb.ScheduleJobsRequest(jobs=[in_(60, key="twice"), in_(60, key="twice")])
        )
        assert [r.created for r in same.results] == [True, False]


async def run_first_delivery(api: Api, job_id: str, *, fail: bool) -> None:
    await wait_until(lambda: api.node.ready.count() == 1, what="the job ready")
    (claimed,) = await api.node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=30)
    assert claimed.job.job_id == job_id
    if fail:
        await api.node.attempts.fail(job_id, claimed.job.fence, "boom", permanent=False)
    else:
        await api.node.attempts.complete(job_id, claimed.job.fence)


async def test_the_time_is_not_compared_once_a_retry_moved_the_job() -> None:
    async with serving() as api:
        first = await api.jobs.ScheduleJob(in_(0))
        await run_first_delivery(api, first.job.job_id, fail=True)
        moved = await api.node.jobs.get(first.job.job_id)
        assert moved.state is JobState.SCHEDULED and moved.run_at > ts_ms(first.job.run_at)
        again = await api.jobs.ScheduleJob(in_(0))  # the first request, sent again
        assert not again.created and again.job.job_id == first.job.job_id


async def test_a_key_used_again_for_another_day_after_its_job_ran_is_refused() -> None:
    """The mistake of a key reused for the next run: its job ran (at its first time)."""
    async with serving() as api:
        first = await api.jobs.ScheduleJob(in_(0, key="nightly"))
        await run_first_delivery(api, first.job.job_id, fail=False)
        assert (await api.node.jobs.get(first.job.job_id)).state is JobState.SUCCEEDED
        api.clock.advance(600)
        msg = await refusal(api.jobs.ScheduleJob(in_(86_400 - 600, key="nightly")))
        assert "a different time" in msg


def test_an_asked_time_is_a_delay_or_a_time() -> None:
    assert AskedTime(delay_ms=5).run_at(100) == 105
    assert AskedTime(at_ms=50).run_at(100) == 100  # just past: now, as the first request
    assert AskedTime(at_ms=500).run_at(100) == 500
    with pytest.raises(ValueError):
        AskedTime()
    with pytest.raises(ValueError):
        AskedTime(delay_ms=1, at_ms=1)
