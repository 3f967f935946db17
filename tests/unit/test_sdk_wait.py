"""The typed clients wait for jobs on the server's stream (``WaitJobs``) and read their results
and tracebacks: ``Client.wait`` / ``wait_many`` / ``as_finished`` and ``AsyncClient``'s."""

from __future__ import annotations

import pytest

from timeshard.errors import NotFound, WaitTimeout
from timeshard.model import JobState
from timeshard.testing import local, local_async
from timeshard.worker import JobContext, Worker


def _worker() -> Worker:
    worker = Worker(lease_s=5)

    @worker.handler("sum", timeout=10)
    async def total(ctx: JobContext) -> dict[str, int]:
        return {"total": sum(ctx.json()["values"])}

    @worker.handler("raw", timeout=10)
    async def raw(ctx: JobContext) -> bytes:
        return b"\x00\x01"

    @worker.handler("boom", timeout=10)
    async def boom(ctx: JobContext) -> None:
        raise KeyError("missing")

    return worker


def test_wait_returns_the_finished_job_with_its_result() -> None:
    with local(_worker()) as client:
        job = client.schedule("sum", {"values": [1, 2, 3]})
        done = client.wait(job.job_id, timeout=30)
        assert done.state is JobState.SUCCEEDED
        assert done.result == {"total": 6}
        raw = client.wait(client.schedule("raw").job_id, timeout=30)
        assert raw.result == b"\x00\x01" and raw.result_encoding == "bytes"


def test_wait_many_and_a_failure_with_its_traceback() -> None:
    with local(_worker()) as client:
        ids = [client.schedule("sum", {"values": [i]}).job_id for i in range(5)]
        failing = client.schedule("boom", max_attempts=1).job_id
        jobs = client.wait_many([*ids, failing], timeout=30)
        assert list(jobs) == [*ids, failing]
        assert [jobs[i].result for i in ids] == [{"total": i} for i in range(5)]
        dead = jobs[failing]
        assert dead.state is JobState.DEAD and dead.result is None
        assert "KeyError" in dead.history[-1].traceback


def test_wait_many_takes_any_iterable_of_ids_once() -> None:
    """A generator of ids is read once: the answer has every job, in the order given."""
    with local(_worker()) as client:
        ids = [client.schedule("sum", {"values": [i]}).job_id for i in range(3)]
        jobs = client.wait_many((job_id for job_id in ids), timeout=30)
        assert list(jobs) == ids
        assert [jobs[i].result for i in ids] == [{"total": i} for i in range(3)]


def test_waiting_on_an_unknown_job_or_past_the_timeout_is_a_clear_error() -> None:
    with local() as client:
        with pytest.raises(NotFound):
            client.wait("no-such-job", timeout=5)
        nobody = client.schedule("nobody.handles.this").job_id
        with pytest.raises(WaitTimeout) as caught:
            client.wait(nobody, timeout=0.3)
        assert nobody in str(caught.value)


async def test_the_async_client_waits_too() -> None:
    async with local_async(_worker()) as client:
        job = await client.schedule("sum", {"values": [4, 5]})
        done = await client.wait(job.job_id, timeout=30)
        assert done.result == {"total": 9}
        seen = [j.job_id async for j in client.as_finished([job.job_id], timeout=5)]
        assert seen == [job.job_id]
