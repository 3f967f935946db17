"""Waiting for jobs on every store: the waiting node (``node.waits.JobWaits``) reads the jobs it
waits for from its own store, so a job finished through another node's store (another
connection, another process) reaches the waiter at its next re-read; an unknown id is
``NotFound`` and a timeout names what is left."""

from __future__ import annotations

import asyncio

import pytest

from tests.contract.conftest import OpenStore
from tests.contract.helpers import NOW, claimed, created
from timeshard.clock import FakeClock
from timeshard.errors import NotFound, WaitTimeout
from timeshard.model import Job, JobState
from timeshard.node.waits import WAIT_REREAD_S, JobWaits


async def collect(waits: JobWaits, job_ids: list[str], timeout_s: float, got: list[Job]) -> None:
    async for job in waits.wait(job_ids, timeout_s):
        got.append(job)


async def step(clock: FakeClock, seconds: float, until: asyncio.Task[None]) -> None:
    """Move the fake clock in small steps, letting the store answer between them."""
    for _ in range(round(seconds / 0.25)):
        if until.done():
            return
        clock.advance(0.25)
        for _ in range(20):
            await asyncio.sleep(0.01)


async def test_a_job_finished_through_another_store_reaches_the_waiter(
    open_store: OpenStore,
) -> None:
    clock = FakeClock(NOW)
    async with open_store(name="shared") as mine, open_store(name="shared") as theirs:
        done_before = await claimed(mine, await created(mine, "w-done"))
        assert (await mine.complete_job("w-done", done_before.fence, NOW + 1)).applied
        running = await claimed(mine, await created(mine, "w-run"))
        waits = JobWaits(mine, clock)
        got: list[Job] = []
        task = asyncio.create_task(collect(waits, ["w-done", "w-run"], 60, got))
        for _ in range(200):  # the finished one comes first, without the clock moving
            if got:
                break
            await asyncio.sleep(0.01)
        assert [j.job_id for j in got] == ["w-done"]
        out = await theirs.complete_job(
            "w-run", running.fence, NOW + 2, result=b'{"by":"another node"}', result_encoding="json"
        )
        assert out.applied
        await step(clock, 4 * WAIT_REREAD_S, task)
        await asyncio.wait_for(task, 10)
        assert [(j.job_id, j.state) for j in got] == [
            ("w-done", JobState.SUCCEEDED),
            ("w-run", JobState.SUCCEEDED),
        ]
        assert got[1].result == b'{"by":"another node"}'
        assert waits.waited_for == 0
        await waits.close()


async def test_an_unknown_id_and_a_timeout(open_store: OpenStore) -> None:
    clock = FakeClock(NOW)
    async with open_store() as store:
        await created(store, "w-waiting")
        waits = JobWaits(store, clock)
        with pytest.raises(NotFound, match="'w-unknown'"):
            await collect(waits, ["w-waiting", "w-unknown"], 60, [])
        got: list[Job] = []
        task = asyncio.create_task(collect(waits, ["w-waiting"], 2, got))
        await step(clock, 3, task)
        with pytest.raises(WaitTimeout, match="'w-waiting'"):
            await asyncio.wait_for(task, 10)
        assert got == [] and waits.waited_for == 0
        await waits.close()
