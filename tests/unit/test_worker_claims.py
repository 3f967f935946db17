"""How a worker asks for jobs: each type's free slots are asked for whatever the other
types do, and a handler's concurrency holds per worker, across every node it claims from. Real
gRPC, in-process nodes on the embedded store and the system clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from tests.unit.test_worker_handler_ends import make_server, wait_job, worker, working
from timeshard.model import JobState, WriteResult
from timeshard.node import JobSpec
from timeshard.node.claims import Claimed
from timeshard.server import Server
from timeshard.store.base import JobClaim
from timeshard.testing.waits import wait_until
from timeshard.worker import JobContext


def record_claims(srv: Server) -> list[tuple[tuple[str, ...], int, int]]:
    """(types, limit, jobs granted) of each claim the node answers."""
    seen: list[tuple[tuple[str, ...], int, int]] = []
    claim = srv.node.claims.claim

    async def recording(*, types: Sequence[str], limit: int, **kw: object) -> list[Claimed]:
        out = await claim(types=types, limit=limit, **kw)  # type: ignore[arg-type]
        seen.append((tuple(types), limit, len(out)))
        return out

    srv.node.claims.claim = recording  # type: ignore[method-assign]
    return seen


async def test_an_idle_type_does_not_stall_a_busy_one() -> None:
    """Type a's two slots fill; the long poll then asked for b alone (idle) and nothing cut it
    short when a's slots freed: 40 short jobs of a took a long poll (here 20 s) per pair. They
    must finish about as fast as with a alone — here, well within one long poll."""
    srv = make_server(types=("a", "b"))
    w = worker(lease_s=60.0)
    w.claim_wait_s = 20.0
    assert w._poll_wait_s() == 20.0

    @w.handler("a", timeout=60, concurrency=2)
    async def a(ctx: JobContext) -> None:
        await asyncio.sleep(0.01)

    @w.handler("b", timeout=60, concurrency=1)
    async def b(ctx: JobContext) -> None:
        pass

    async with working(w, [srv]):
        jobs = [
            (await srv.node.jobs.schedule(JobSpec(job_type="a", payload=b"", run_at=0)))[0]
            for _ in range(40)
        ]
        for job in jobs:
            done = await wait_job(srv, job, lambda j: j.state.terminal, timeout=18, what="a jobs")
            assert done.state is JobState.SUCCEEDED


async def test_a_type_with_one_slot_does_not_cap_the_claims_of_another() -> None:
    """``max_jobs = min(free)`` made every claim take one job while any type had one slot."""
    srv = make_server(types=("a", "b"))
    seen = record_claims(srv)
    w = worker(claim_polls=1)

    @w.handler("a", timeout=60, concurrency=8)
    async def a(ctx: JobContext) -> None:
        await asyncio.sleep(0.2)

    @w.handler("b", timeout=60, concurrency=1)
    async def b(ctx: JobContext) -> None:
        pass

    await srv.start()
    jobs = [
        (await srv.node.jobs.schedule(JobSpec(job_type="a", payload=b"", run_at=0)))[0]
        for _ in range(8)
    ]
    # All eight ready before the worker's first claim (a job still on its way to the ready
    # queue when the claim looked made it take seven: not what this test is about).
    await wait_until(lambda: srv.node.ready.count() == 8, what="eight jobs ready")
    async with working(w, [srv], started=True):
        for job in jobs:
            await wait_job(srv, job, lambda j: j.state.terminal, what="a jobs")
    granted = [n for types, _, n in seen if "a" in types]
    assert max(granted) == 8, seen  # one claim took all eight


async def test_a_handlers_concurrency_holds_across_the_nodes_it_claims_from() -> None:
    """A worker claiming from two nodes ran two jobs of a ``concurrency=1`` handler at once."""
    nodes = [make_server(), make_server()]
    w = worker()
    active: list[str] = []
    most = [0]

    @w.handler("t", timeout=60, concurrency=1)
    async def handle(ctx: JobContext) -> None:
        active.append(ctx.job_id)
        most[0] = max(most[0], len(active))
        await asyncio.sleep(0.1)
        active.remove(ctx.job_id)

    jobs = []
    for srv in nodes:
        await srv.start()
        for _ in range(4):
            jobs.append(
                (
                    srv,
                    (await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=0)))[0],
                )
            )
    async with working(w, nodes, started=True):
        for srv, job in jobs:
            done = await wait_job(srv, job, lambda j: j.state.terminal, what="every job")
            assert done.state is JobState.SUCCEEDED and done.attempt == 1, done
    assert most[0] == 1, f"{most[0]} jobs of a concurrency=1 handler ran at once"


async def test_a_job_due_while_a_claim_is_written_is_claimed_by_the_next_poll() -> None:
    """With one long poll per type, a job that came due while a claim was being written (a
    Paxos round per partition on Cassandra) waited for that write to end, and for the next
    poll: most of a job's lateness on Cassandra. The second poll takes it at once."""
    srv = make_server()
    released = asyncio.Event()
    store_claim = srv.node.store.claim_jobs
    writes: list[list[str]] = []

    async def slow_first(claims: Sequence[JobClaim]) -> list[WriteResult]:
        writes.append([c.job_id for c in claims])
        if len(writes) == 1:
            await released.wait()  # the first claim's write takes its time
        return await store_claim(claims)

    srv.node.store.claim_jobs = slow_first  # type: ignore[method-assign]
    w = worker(claim_polls=2)

    @w.handler("t", timeout=60, concurrency=4)
    async def handle(ctx: JobContext) -> None:
        pass

    await srv.start()
    async with working(w, [srv], started=True):
        first = (await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=0)))[0]
        await wait_until(lambda: len(writes) == 1, 10, "the first claim's write")
        second = (await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=0)))[0]
        done = await wait_job(srv, second, lambda j: j.state.terminal, what="the second job")
        assert done.state is JobState.SUCCEEDED
        # claimed on its own while the first write still waited (not after that claim gave up)
        assert writes[:2] == [[first.job_id], [second.job_id]] and not released.is_set()
        released.set()
        await wait_job(srv, first, lambda j: j.state.terminal, what="the first job")


def test_claim_polls_must_be_positive() -> None:
    with pytest.raises(ValueError, match="claim_polls"):
        worker(claim_polls=0)
