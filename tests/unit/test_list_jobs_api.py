"""ListJobs over gRPC: its filters, orders and count as the API names them, and a bad filter
answered with INVALID_ARGUMENT naming the request's field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from tests.unit.helpers import embedded_server
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, ts, ts_ms

HOUR_MS = 3_600_000


@asynccontextmanager
async def jobs_service() -> AsyncIterator[pb_grpc.JobServiceStub]:
    async with embedded_server() as server:
        channel = grpc.aio.insecure_channel(server.address)
        try:
            yield pb_grpc.JobServiceStub(channel)
        finally:
            await channel.close(None)


async def listed(jobs: pb_grpc.JobServiceStub, **fields: object) -> tuple[list[str], int]:
    """The keys of the jobs a listing finds, page after page of 2, and the total it says
    (the same on every page)."""
    keys: list[str] = []
    totals = set()
    token = ""
    while True:
        page = await jobs.ListJobs(pb.ListJobsRequest(page_size=2, page_token=token, **fields))
        keys += [j.idempotency_key for j in page.jobs]
        totals.add(page.total)
        if not (token := page.next_page_token):
            break
    assert len(totals) == 1, totals
    return keys, totals.pop()


async def test_list_jobs_filters_orders_and_counts() -> None:
    async with jobs_service() as jobs:
        made = {}
        for key, job_type, hours in [
            ("order-1:mail", "mail", 3),
            ("order-2:mail", "mail", 1),
            ("order-1:sms", "sms", 2),
            ("audit-7", "audit", 4),
        ]:
            resp = await jobs.ScheduleJob(
                pb.ScheduleJobRequest(
                    type=job_type, delay=dur(hours * HOUR_MS), idempotency_key=key
                )
            )
            made[key] = resp.job
        await jobs.CancelJob(pb.CancelJobRequest(job_id=made["audit-7"].job_id))
        base = ts_ms(made["order-2:mail"].run_at)  # the earliest, an hour from now

        by_due = ["order-2:mail", "order-1:sms", "order-1:mail", "audit-7"]
        assert await listed(jobs) == (by_due, 4)
        by_created = sorted(made, key=lambda k: (ts_ms(made[k].created_at), made[k].job_id))
        assert await listed(jobs, order=pb.JOB_ORDER_CREATED) == (by_created, 4)
        by_id = sorted(made, key=lambda k: made[k].job_id)
        assert await listed(jobs, order=pb.JOB_ORDER_ID) == (by_id, 4)
        assert await listed(jobs, type="mail") == (["order-2:mail", "order-1:mail"], 2)
        assert await listed(jobs, state=pb.JOB_STATE_CANCELLED) == (["audit-7"], 1)
        both = [pb.JOB_STATE_CANCELLED, pb.JOB_STATE_SCHEDULED]
        assert await listed(jobs, states=both) == (by_due, 4)
        window = {"run_at_from": ts(base + HOUR_MS // 2), "run_at_to": ts(base + 2 * HOUR_MS)}
        assert await listed(jobs, **window) == (["order-1:sms", "order-1:mail"], 2)
        assert await listed(jobs, idempotency_key="order-1:sms") == (["order-1:sms"], 1)
        prefix = await listed(jobs, idempotency_key_prefix="order-1:")
        assert prefix == (["order-1:sms", "order-1:mail"], 2)
        assert await listed(jobs, schedule_id="nightly") == ([], 0)
        none = await jobs.ListJobs(pb.ListJobsRequest(type="nothing.here"))
        assert list(none.jobs) == [] and none.total == 0 and none.next_page_token == ""


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"order": 7}, "order"),
        ({"states": [pb.JOB_STATE_SCHEDULED, 42]}, "states[1]"),
        ({"state": 42}, "state"),
        ({"run_at_from": ts(2 * HOUR_MS), "run_at_to": ts(HOUR_MS)}, "run_at_to"),
        ({"run_at_to": ts(-5)}, "run_at_to"),
        ({"idempotency_key": "a", "idempotency_key_prefix": "a"}, "idempotency_key_prefix"),
        ({"idempotency_key_prefix": "k" * 300}, "idempotency_key_prefix"),
        ({"schedule_id": "not/an id"}, "schedule_id"),
        ({"type": "not a type"}, "type"),
        ({"page_size": 1001}, "page_size"),
    ],
)
async def test_a_bad_filter_is_invalid_argument_naming_its_field(
    request_fields: dict[str, object], field: str
) -> None:
    async with jobs_service() as jobs:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await jobs.ListJobs(pb.ListJobsRequest(**request_fields))  # type: ignore[arg-type]
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith(f"{field}: "), info.value.details()


async def test_the_python_client_lists_with_the_same_filters() -> None:
    from datetime import UTC, datetime, timedelta

    from timeshard.client import AsyncClient
    from timeshard.errors import InvalidArgument

    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        for n, minutes in ((1, 30), (2, 10), (3, 20)):
            await c.schedule("mail", {}, delay=timedelta(minutes=minutes), key=f"order-{n}")
        await c.schedule("sms", {}, delay=timedelta(minutes=5), key="order-9")
        keys = [j.idempotency_key async for j in c.list_jobs(key_prefix="order-", page_size=2)]
        assert keys == ["order-9", "order-2", "order-3", "order-1"]
        soon = datetime.now(UTC) + timedelta(minutes=15)
        later = [j.idempotency_key async for j in c.list_jobs(job_type="mail", due_from=soon)]
        assert later == ["order-3", "order-1"]
        states = [j.job_id async for j in c.list_jobs(states=["running", "dead"])]
        assert states == []
        with pytest.raises(InvalidArgument, match="order"):
            c.list_jobs(order="newest")
        with pytest.raises(InvalidArgument, match="state"):
            c.list_jobs(states=["finished"])
