"""A store may hold completions a while to share a write (``Store.complete_jobs``'s
``linger_s``): the node lets it, 50 ms, or the claims-ahead reach when claims ahead are on (four
windows, at most 2 s: at a trickle a shard's claims ahead go out about that often, and a result
rides the next one's Paxos round), at most 250 ms when heartbeats wait for their answer with it;
never for a job under a concurrency limit, whose end lets the next job of its type start (held,
each of a type limited to 1 would start that much later)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from tests.contract.helpers import NOW, create, make_job
from tests.unit.helpers import START_MS, advance, running
from tests.unit.test_worker_stream import Stream, serving
from tests.unit.test_worker_stream import schedule as stream_schedule
from timeshard.clock import FakeClock
from timeshard.model import JobState, WriteResult
from timeshard.node import FinishItem, JobSpec, TypePolicy
from timeshard.store.base import Completion, JobClaim, Retention, Store
from timeshard.store.cassandra.jobrows import LINGER_UNKNOWN_S, JobRows
from timeshard.store.cassandra.rows import Found
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur


@pytest.mark.parametrize(
    ("claim_ahead_ms", "linger_s"), [(0, 0.05), (10, 0.05), (400, 1.6), (1000, 2.0)]
)
async def test_a_completion_may_linger_unless_a_concurrency_limit_waits_for_it(
    claim_ahead_ms: int, linger_s: float
) -> None:
    types = {"limited": TypePolicy(concurrency=1), "counted": TypePolicy(max_attempts=2)}
    async with running(types=types, claim_ahead_ms=claim_ahead_ms) as (node, clock):
        asked: list[tuple[list[str], float]] = []
        store: Store = node.store
        original = store.complete_jobs

        async def complete_jobs(
            items: Sequence[Completion], now: int, *, linger_s: float = 0.0
        ) -> list[WriteResult]:
            asked.append(([c.job_id for c in items], linger_s))
            return await original(items, now, linger_s=linger_s)

        store.complete_jobs = complete_jobs  # type: ignore[method-assign]
        jobs = {
            t: (await node.jobs.schedule(JobSpec(job_type=t, payload=b"", run_at=START_MS)))[0]
            for t in ("limited", "counted", "free", "beside")
        }
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == 4, what="four jobs ready")
        for t, job in jobs.items():
            [c] = await node.claims.claim(worker="w", types=[t], limit=1, wait_s=0, lease_s=60)
            item = FinishItem(job_id=job.job_id, fence=c.job.fence)
            [done] = await node.attempts.finish([item], beside_beats=t == "beside")
            assert not isinstance(done, Exception)
        assert asked == [
            ([jobs["limited"].job_id], 0.0),  # the next "limited" job waits for this one
            ([jobs["counted"].job_id], linger_s),
            ([jobs["free"].job_id], linger_s),
            ([jobs["beside"].job_id], min(linger_s, 0.25)),  # heartbeats wait with it
        ]


async def test_results_sent_with_heartbeats_on_a_stream_linger_no_longer_than_250_ms() -> None:
    """A worker stream's request with heartbeats and results is answered as one: the results
    then linger at most 250 ms, so a lease is never answered up to the reach late; a request
    of results alone lingers as long as the node allows."""
    async with serving() as (srv, channel):
        asked: list[bool] = []
        finish = srv.node.attempts.finish

        async def spying(items: Any, *, beside_beats: bool = False) -> Any:
            asked.append(beside_beats)
            return await finish(items, beside_beats=beside_beats)

        srv.node.attempts.finish = spying  # type: ignore[method-assign]
        await stream_schedule(srv, 2)
        s = Stream(channel)
        await s.hello(t=2)
        a, b = await s.until_jobs(2)
        beat = pb.HeartbeatRequest(job_id=b.job.job_id, fence=b.fence, lease=dur(5000))
        seq = await s.send(
            heartbeats=[beat], results=[pb.FinishItem(job_id=a.job.job_id, fence=a.fence)]
        )
        assert (await s.answer(seq)).results[0].code == 0
        seq = await s.send(results=[pb.FinishItem(job_id=b.job.job_id, fence=b.fence)])
        assert (await s.answer(seq)).results[0].code == 0
        assert asked == [True, False]


@pytest.mark.parametrize(
    ("lease_left_ms", "asked_s", "lingers_s"),
    [
        (60_000, 1.6, 1.6),  # a long lease: as asked
        (2_000, 1.6, 0.5),  # a quarter of the lease left
        (0, 1.6, 0.0),  # over: at once
        (2_000, 0.0, 0.0),  # not asked to linger
    ],
)
def test_a_completion_lingers_at_most_a_quarter_of_its_lease_left(
    lease_left_ms: int, asked_s: float, lingers_s: float
) -> None:
    """On Cassandra a completion waits for a claim of its partition (``JobRows``), but not so
    long that the worker's next results, sent once it is answered, find their leases over."""
    clock = FakeClock(START_MS)
    rows = JobRows(None, clock, 4, Retention())  # type: ignore[arg-type]  # (no writes here)
    job = make_job("j1").with_(state=JobState.RUNNING, lease_until=START_MS + lease_left_ms)
    assert rows._linger_bound(Found.of(job), asked_s) == pytest.approx(lingers_s)
    assert rows._linger_bound(None, asked_s) == min(asked_s, LINGER_UNKNOWN_S)


async def test_the_embedded_store_commits_lingering_results_with_the_next_write(
    tmp_path: Any,
) -> None:
    """SQLite: results that may linger wait for the next write and share its commit (one
    transaction, one fsync); alone, they are written once the linger is over (at most
    ``LINGER_MAX_S``, however long the caller allows)."""
    from timeshard.store.sqlite import SqliteStore
    from timeshard.store.sqlitedb import LINGER_MAX_S

    store = SqliteStore(tmp_path / "t.db", num_shards=4)
    await store.open()
    try:
        await create(store, *(make_job(f"j{n}") for n in range(3)))
        claims = [
            JobClaim(job_id=f"j{n}", expect_fence=0, worker="w", now=NOW, lease_until=NOW + 30_000)
            for n in range(3)
        ]
        ran = await store.claim_jobs(claims)
        assert all(r.applied for r in ran)
        rounds = store.stats.paxos_rounds
        lingering = asyncio.create_task(
            store.complete_jobs([Completion("j0", 1, b"", "")], NOW, linger_s=60.0)
        )
        await asyncio.sleep(0.01)
        assert not lingering.done() and store.stats.paxos_rounds == rounds
        await store.complete_jobs([Completion("j1", 1, b"", "")], NOW)  # not lingering
        (done,) = await asyncio.wait_for(lingering, 5)
        assert done.applied and store.stats.paxos_rounds == rounds + 1  # one commit for both
        began = time.monotonic()
        (alone,) = await asyncio.wait_for(
            store.complete_jobs([Completion("j2", 1, b"", "")], NOW, linger_s=60.0), 5
        )
        assert alone.applied and time.monotonic() - began < LINGER_MAX_S + 1.0
    finally:
        await store.close()
