"""Waiting for jobs (``WaitJobs``, ``Client.wait``, ``timeshard jobs wait``): served by the node,
each job as soon as it is finished, also when another node wrote its result; bad input and
timeouts get clear statuses and exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from tests.unit.helpers import START_MS, embedded_server, owner_and_writer, running, settle
from timeshard.cli.main import main
from timeshard.client.proto import ProtoClient as Client
from timeshard.clock import FakeClock
from timeshard.coordinator.base import Member
from timeshard.errors import NotFound, WaitTimeout
from timeshard.model import Job, JobState
from timeshard.node import Beat, JobSpec, Node
from timeshard.node.waits import WAIT_REREAD_S
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur


async def claimed_jobs(node: Node, n: int, job_type: str = "t") -> list[Job]:
    now = node.clock.now_ms()
    for _ in range(n):
        await node.jobs.schedule(JobSpec(job_type=job_type, payload=b"", run_at=now))
    await wait_until(lambda: node.ready.count() >= n, what=f"{n} jobs ready")
    got = await node.claims.claim(worker="w", types=[job_type], limit=n, wait_s=0, lease_s=60)
    assert len(got) == n
    return [c.job for c in got]


class Waiter:
    """One ``Node.wait`` call running in the background; ``got`` fills as jobs come."""

    def __init__(self, node: Node, job_ids: list[str], timeout_s: float = 600) -> None:
        self.got: list[Job] = []
        self.task = asyncio.create_task(self._run(node.wait(job_ids, timeout_s)))

    async def _run(self, jobs: AsyncIterator[Job]) -> None:
        async for job in jobs:
            self.got.append(job)


async def test_a_finish_on_the_waiting_node_is_handed_over_at_once() -> None:
    """On a fake clock that does not move: the re-read never runs, so the job can only come
    from the node's own write."""
    async with running() as (node, _clock):
        a, b, c = await claimed_jobs(node, 3)
        waiter = Waiter(node, [a.job_id, b.job_id, c.job_id])
        await settle(node)
        assert waiter.got == []
        await node.attempts.complete(a.job_id, a.fence, b'"done"', "json")
        await wait_until(lambda: len(waiter.got) == 1, what="the completed job")
        assert waiter.got[0].state is JobState.SUCCEEDED and waiter.got[0].result == b'"done"'
        await node.attempts.fail(b.job_id, b.fence, "bad", True)
        await node.jobs.cancel(c.job_id)
        await asyncio.wait_for(waiter.task, 5)
        assert [(j.job_id, j.state) for j in waiter.got[1:]] == [
            (b.job_id, JobState.DEAD),
            (c.job_id, JobState.CANCELLED),
        ]
        assert node.waits.waited_for == 0  # nothing left registered


async def test_a_retried_failure_is_not_finished() -> None:
    async with running() as (node, _clock):
        (a,) = await claimed_jobs(node, 1)
        waiter = Waiter(node, [a.job_id])
        retried = await node.attempts.fail(a.job_id, a.fence, "try again", False)
        assert retried.state is JobState.SCHEDULED
        await settle(node)
        assert waiter.got == [] and not waiter.task.done()
        waiter.task.cancel()


async def test_a_result_reported_to_another_node_reaches_the_waiter(tmp_path: Path) -> None:
    """Node ``a`` serves the wait; the worker's result goes to node ``b`` (one SQLite file, two
    nodes). ``a`` hears of it at its next re-read, ``WAIT_REREAD_S`` later."""
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    async with owner_and_writer(db, clock, SqliteStore(db, num_shards=4)) as (a, b):
        (job,) = await claimed_jobs(a, 1)
        waiter = Waiter(a, [job.job_id])
        await settle(a)
        await b.attempts.complete(job.job_id, job.fence, b"[1,2]", "json")
        await settle(a)
        assert waiter.got == []  # not yet: a did not write it
        for _ in range(4):  # one re-read interval, in steps (each sleeper runs to register)
            clock.advance(WAIT_REREAD_S / 2)
            await settle(a)
        await asyncio.wait_for(waiter.task, 5)
        (got,) = waiter.got
        assert got.state is JobState.SUCCEEDED and got.result == b"[1,2]"


class AskedOf:
    """``b``'s transport to ``a``'s ``WaitFinished``, in process; records what was asked."""

    def __init__(self, a: Node, fail: bool = False) -> None:
        self.a = a
        self.fail = fail
        self.asked: list[list[str]] = []

    async def __call__(self, peer: Member, job_ids: Sequence[str], timeout_s: float) -> list[str]:
        assert peer.node_id == "a"
        self.asked.append(sorted(job_ids))
        if self.fail:
            raise ConnectionError("a is away")
        return await self.a.waits.finished_of(job_ids, timeout_s)


async def test_a_wait_for_another_nodes_job_asks_that_node_and_hears_at_once(
    tmp_path: Path,
) -> None:
    """``b`` serves the wait for jobs ``a`` dispatches, on a clock that never moves: its store
    re-read never runs, so only ``a``'s answer can bring the jobs, as soon as ``a`` writes them."""
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    async with owner_and_writer(db, clock, SqliteStore(db, num_shards=4)) as (a, b):
        ask = AskedOf(a)
        b.waits.use_peers(lambda job_id: Member(node_id="a", address="a:1"), ask)
        first, second = await claimed_jobs(a, 2)
        waiter = Waiter(b, [first.job_id])
        await wait_until(lambda: ask.asked == [[first.job_id]], what="b to ask a")
        later = Waiter(b, [second.job_id])  # a new job to ask about: asked again, with both
        await wait_until(
            lambda: ask.asked[-1:] == [sorted([first.job_id, second.job_id])], what="the new ask"
        )
        await a.attempts.complete(first.job_id, first.fence, b'"one"', "json")
        await asyncio.wait_for(waiter.task, 5)
        assert [(j.job_id, j.state, j.result) for j in waiter.got] == [
            (first.job_id, JobState.SUCCEEDED, b'"one"')
        ]
        await a.jobs.cancel(second.job_id)
        await asyncio.wait_for(later.task, 5)
        assert [(j.job_id, j.state) for j in later.got] == [(second.job_id, JobState.CANCELLED)]
        assert b.waits.waited_for == 0


async def test_a_peer_that_does_not_answer_leaves_the_wait_to_the_reread(tmp_path: Path) -> None:
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    async with owner_and_writer(db, clock, SqliteStore(db, num_shards=4)) as (a, b):
        ask = AskedOf(a, fail=True)
        b.waits.use_peers(lambda job_id: Member(node_id="a", address="a:1"), ask)
        (job,) = await claimed_jobs(a, 1)
        waiter = Waiter(b, [job.job_id])
        await wait_until(lambda: ask.asked, what="b to ask a")
        await a.attempts.complete(job.job_id, job.fence, b"", "")
        for _ in range(4):  # one re-read interval, in steps (each sleeper runs to register)
            clock.advance(WAIT_REREAD_S / 2)
            await settle(b)
        await asyncio.wait_for(waiter.task, 5)
        assert [j.state for j in waiter.got] == [JobState.SUCCEEDED]


async def test_finished_of_answers_with_what_is_finished_or_unknown() -> None:
    async with running() as (node, _clock):
        a, b = await claimed_jobs(node, 2)
        await node.attempts.complete(a.job_id, a.fence, b"", "")
        assert await node.waits.finished_of([a.job_id, b.job_id], 30) == [a.job_id]
        assert await node.waits.finished_of(["never-made", b.job_id], 30) == ["never-made"]
        assert await node.waits.finished_of([b.job_id], 0) == []  # none, no wait
        asked = asyncio.create_task(node.waits.finished_of([b.job_id], 600))
        await settle(node)
        assert not asked.done()
        await node.attempts.complete(b.job_id, b.fence, b"", "")
        assert await asyncio.wait_for(asked, 5) == [b.job_id]
        assert node.waits.waited_for == 0
        # A stopping node answers its peers' open waits at once (with what is finished).
        c, d = await claimed_jobs(node, 2)
        asked = asyncio.create_task(node.waits.finished_of([c.job_id], 600))
        await settle(node)
        assert not asked.done()
        await node.attempts.complete(d.job_id, d.fence, b"", "")
        node.waits.stop_answering()
        assert await asyncio.wait_for(asked, 5) == []
        assert await node.waits.finished_of([c.job_id], 600) == []  # no wait once stopping


async def test_a_lease_expiry_that_kills_a_job_is_handed_over() -> None:
    async with running() as (node, clock):
        now = clock.now_ms()
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="t", payload=b"", run_at=now, max_attempts=1)
        )
        await wait_until(lambda: node.ready.count() == 1, what="ready")
        (c,) = await node.claims.claim(worker="w", types=["t"], limit=1, wait_s=0, lease_s=1)
        # Then it hung:
        node.attempts.notice_starts([Beat(job.job_id, c.job.fence, 0.0, clock.now_ms())])
        waiter = Waiter(node, [job.job_id])
        for _ in range(10):
            clock.advance(0.5)
            await settle(node)
            if waiter.task.done():
                break
        await asyncio.wait_for(waiter.task, 5)
        assert [(j.state, j.last_error) for j in waiter.got] == [(JobState.DEAD, "lease expired")]


async def test_an_unknown_id_is_not_found_and_naming_it() -> None:
    async with running() as (node, _clock):
        (a,) = await claimed_jobs(node, 1)
        with pytest.raises(NotFound, match="'no-such-job'"):
            async for _ in node.wait([a.job_id, "no-such-job"], 5):
                pass
        assert node.waits.waited_for == 0


async def test_a_timeout_names_the_jobs_not_finished() -> None:
    async with running() as (node, clock):
        a, b = await claimed_jobs(node, 2)
        await node.attempts.complete(a.job_id, a.fence)
        got: list[str] = []

        async def wait() -> None:
            async for job in node.wait([a.job_id, b.job_id], 3):
                got.append(job.job_id)

        task = asyncio.create_task(wait())
        await wait_until(lambda: got == [a.job_id], what="the finished job first")
        for _ in range(8):  # (the waiter's sleep starts when it next runs: step and settle)
            clock.advance(0.5)
            await settle(node)
        assert task.done()
        expected = f"1 job\\(s\\) not finished within 3 s: '{b.job_id}'"
        with pytest.raises(WaitTimeout, match=expected):
            await task


async def test_wait_jobs_over_grpc_and_the_client() -> None:
    async with embedded_server() as srv:
        node = srv.node
        a, b = await claimed_jobs(node, 2)
        await node.attempts.complete(a.job_id, a.fence, b'{"ok":true}', "json")
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = pb_grpc.JobServiceStub(channel)

            async def statuses(req: pb.WaitJobsRequest) -> tuple[grpc.StatusCode, str, list[str]]:
                seen: list[str] = []
                try:
                    async for resp in stub.WaitJobs(req):
                        seen.append(resp.job.job_id)
                except grpc.aio.AioRpcError as exc:
                    return exc.code(), exc.details() or "", seen
                return grpc.StatusCode.OK, "", seen

            code, msg, seen = await statuses(
                pb.WaitJobsRequest(job_ids=[a.job_id, b.job_id, a.job_id], timeout=dur(0))
            )
            assert code is grpc.StatusCode.DEADLINE_EXCEEDED and b.job_id in msg
            assert seen == [a.job_id]  # once, though asked twice
            code, msg, _ = await statuses(pb.WaitJobsRequest(job_ids=["nope"]))
            assert code is grpc.StatusCode.NOT_FOUND and "'nope'" in msg
            code, msg, _ = await statuses(pb.WaitJobsRequest(job_ids=[]))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "job_ids" in msg
            code, msg, _ = await statuses(pb.WaitJobsRequest(job_ids=["x"] * 1001))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "at most 1000" in msg
            code, msg, _ = await statuses(pb.WaitJobsRequest(job_ids=["bad id!"]))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "job_ids[0]" in msg
            negative = pb.WaitJobsRequest(job_ids=[a.job_id])
            negative.timeout.seconds = -1
            code, msg, _ = await statuses(negative)
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "timeout" in msg

        with Client(srv.address) as c:
            with pytest.raises(WaitTimeout) as timed_out:
                await asyncio.to_thread(c.wait_many, [a.job_id, b.job_id], 0.2)
            assert timed_out.value.pending == [b.job_id]
            waiting = asyncio.create_task(asyncio.to_thread(c.wait_many, [b.job_id, a.job_id], 30))
            await wait_until(lambda: node.waits.waited_for == 2, timeout=10, what="the waiter")
            await node.attempts.complete(b.job_id, b.fence, b"\x00\x01", "bytes")
            done = await waiting
            assert list(done) == [b.job_id, a.job_id]
            assert (done[b.job_id].result, done[b.job_id].result_encoding) == (b"\x00\x01", "bytes")
            with pytest.raises(NotFound, match="'nope'"):
                await asyncio.to_thread(c.wait, "nope", 5)


async def test_jobs_wait_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    async with embedded_server() as srv:
        node = srv.node
        ok, dead, slow = await claimed_jobs(node, 3)
        await node.attempts.complete(ok.job_id, ok.fence)
        address = ["--server", srv.address, "jobs", "wait"]

        assert await asyncio.to_thread(main, [*address, ok.job_id]) == 0
        assert ok.job_id in capsys.readouterr().out

        code = await asyncio.to_thread(main, [*address, ok.job_id, slow.job_id, "--timeout", "0.2"])
        captured = capsys.readouterr()
        assert code == 6 and ok.job_id in captured.out
        assert f"not finished within 0.2 s: '{slow.job_id}'" in captured.err

        await node.attempts.fail(dead.job_id, dead.fence, "bad input", True)
        code = await asyncio.to_thread(main, [*address, ok.job_id, dead.job_id])
        captured = capsys.readouterr()
        assert code == 8 and f"job {dead.job_id} (t) ended dead: bad input" in captured.err

        code = await asyncio.to_thread(main, [*address, "nope"])
        captured = capsys.readouterr()
        assert code == 3 and "'nope' not found" in captured.err

        code = await asyncio.to_thread(main, [*address, ok.job_id, dead.job_id, "--json"])
        shown = json.loads(capsys.readouterr().out)
        assert code == 8 and [j["state"] for j in shown] == ["succeeded", "dead"]

        code = await asyncio.to_thread(main, [*address, ok.job_id, "--timeout", "soon"])
        assert code == 2 and "--timeout" in capsys.readouterr().err
