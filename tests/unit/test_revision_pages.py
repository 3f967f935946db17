"""ListScheduleRevisions reads a page, not the whole history: each page asks the store for its
own revisions (and one more, to know whether another page follows), never the hundred kept."""

from __future__ import annotations

import grpc
import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.limits import REVISIONS_KEPT
from timeshard.model import Schedule, ScheduleRevision
from timeshard.node import Node
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1.timeshard_pb2_grpc import JobServiceStub


class CountedRevisions(SqliteStore):
    """Records how many revisions each read of a history returned."""

    read: list[int]

    async def schedule_revisions(
        self, schedule_id: str, *, below: int | None = None, limit: int = REVISIONS_KEPT
    ) -> list[ScheduleRevision]:
        found = await super().schedule_revisions(schedule_id, below=below, limit=limit)
        self.read.append(len(found))
        return found


def sched() -> Schedule:
    return Schedule(
        schedule_id="s1",
        shard=0,
        cron="* * * * *",
        timezone="UTC",
        job_type="cron.t",
        payload=b"{}",
        next_fire=0,
        created_at=0,
    )


async def test_each_page_reads_only_its_revisions() -> None:
    store = CountedRevisions(":memory:", num_shards=4)
    store.read = []
    node = Node(store=store, coordinator=LocalCoordinator(), clock=SystemClock(), node_id="n")
    server = Server(node, port=0)
    await server.start()
    try:
        await node.schedules.create(sched())
        for i in range(REVISIONS_KEPT + 9):  # revisions 2-110; 11-110 kept
            await (node.schedules.pause if i % 2 == 0 else node.schedules.resume)("s1")
        store.read.clear()
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = JobServiceStub(channel)

            async def page(size: int, token: str) -> tuple[list[int], str]:
                req = pb.ListScheduleRevisionsRequest(
                    schedule_id="s1", page_size=size, page_token=token
                )
                reply = await stub.ListScheduleRevisions(req)
                return [r.revision for r in reply.revisions], reply.next_page_token

            assert await page(3, "") == ([110, 109, 108], "108")
            assert store.read == [4]  # the page and one more, not the 100 kept
            assert await page(3, "108") == ([107, 106, 105], "105")
            assert await page(0, "") == (list(range(110, 90, -1)), "91")  # 0: 20
            assert await page(REVISIONS_KEPT, "13") == ([12, 11], "")
            assert store.read == [4, 4, 21, 2]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await page(REVISIONS_KEPT + 1, "")
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await page(3, "ghost")
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ListScheduleRevisions(
                    pb.ListScheduleRevisionsRequest(schedule_id="ghost", page_token="5")
                )
            assert info.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(0)
