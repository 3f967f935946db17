"""A store may hold completions a few tens of milliseconds to share a write (each store's
``RESULT_LINGER_S``): the node lets it, except for a job under a concurrency limit, whose end
lets the next job of its type start (held, each of a type limited to 1 would start 50 ms later)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.contract.helpers import NOW, NUM_SHARDS, claimed, created
from tests.unit.helpers import START_MS, advance, running, wait_until
from timeshard.model import WriteResult
from timeshard.node import FinishItem, TypePolicy
from timeshard.store import sqlite as sqlite_store
from timeshard.store.base import Completion, Store
from timeshard.store.sqlite import SqliteStore


async def test_a_completion_may_linger_unless_a_concurrency_limit_waits_for_it() -> None:
    types = {"limited": TypePolicy(concurrency=1), "counted": TypePolicy(max_attempts=2)}
    async with running(types=types) as (node, clock):
        asked: list[tuple[list[str], bool]] = []
        store: Store = node.store
        original = store.complete_jobs

        async def complete_jobs(
            items: Sequence[Completion], now: int, *, linger: bool = False
        ) -> list[WriteResult]:
            asked.append(([c.job_id for c in items], linger))
            return await original(items, now, linger=linger)

        store.complete_jobs = complete_jobs  # type: ignore[method-assign]
        jobs = {
            t: (await node.schedule(job_type=t, payload=b"", run_at=START_MS))[0]
            for t in ("limited", "counted", "free")
        }
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == 3, what="three jobs ready")
        for t, job in jobs.items():
            [c] = await node.claim(worker="w", types=[t], limit=1, wait_s=0, lease_s=60)
            [done] = await node.finish([FinishItem(job_id=job.job_id, fence=c.job.fence)])
            assert not isinstance(done, Exception)
        assert asked == [
            ([jobs["limited"].job_id], False),  # the next "limited" job waits for this one
            ([jobs["counted"].job_id], True),
            ([jobs["free"].job_id], True),
        ]


async def _one_claimed(store: SqliteStore, job_id: str) -> Completion:
    job = await created(store, job_id)
    return Completion(job_id=job_id, fence=(await claimed(store, job)).fence)


async def test_sqlite_a_lingering_completion_shares_the_next_writes_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "RESULT_LINGER_S", 30.0)  # only company ends the wait
    store = SqliteStore(tmp_path / "s.db", num_shards=NUM_SHARDS)
    await store.open()
    try:
        done = await _one_claimed(store, "a")
        rounds = store.stats.paxos_rounds
        completing = asyncio.create_task(store.complete_jobs([done], NOW, linger=True))
        await asyncio.sleep(0.2)
        assert not completing.done(), "a lingering completion waits for another write"
        assert store.stats.paxos_rounds == rounds
        await created(store, "b")  # a write that may not wait: both go in its transaction
        [result] = await asyncio.wait_for(completing, 5)
        assert result.applied and result.job is not None and result.job.state.terminal
        assert store.stats.paxos_rounds == rounds + 1
    finally:
        await store.close()


async def test_sqlite_a_completion_lingers_no_longer_than_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "RESULT_LINGER_S", 0.3)
    store = SqliteStore(tmp_path / "s.db", num_shards=NUM_SHARDS)
    await store.open()
    try:
        done = [await _one_claimed(store, i) for i in ("a", "b")]
        rounds = store.stats.paxos_rounds
        first = asyncio.create_task(store.complete_jobs(done[:1], NOW, linger=True))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(store.complete_jobs(done[1:], NOW, linger=True))
        results = await asyncio.wait_for(asyncio.gather(first, second), 5)  # alone: written
        assert all(r.applied for [r] in results)
        assert store.stats.paxos_rounds == rounds + 1  # the two lingered together
        # Without linger a completion is written at once, whatever the window.
        third = await _one_claimed(store, "c")
        rounds = store.stats.paxos_rounds
        [r] = await asyncio.wait_for(store.complete_jobs([third], NOW), 0.25)
        assert r.applied and store.stats.paxos_rounds == rounds + 1
    finally:
        await store.close()


async def test_sqlite_closing_writes_a_lingering_completion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "RESULT_LINGER_S", 30.0)
    path = tmp_path / "s.db"
    store = SqliteStore(path, num_shards=NUM_SHARDS)
    await store.open()
    done = await _one_claimed(store, "a")
    completing = asyncio.create_task(store.complete_jobs([done], NOW, linger=True))
    await asyncio.sleep(0.1)
    await asyncio.wait_for(store.close(), 5)
    [result] = await completing
    assert result.applied
    reopened = SqliteStore(path, num_shards=NUM_SHARDS)
    await reopened.open()
    try:
        job = await reopened.get_job("a")
        assert job is not None and job.state.terminal
    finally:
        await reopened.close()
