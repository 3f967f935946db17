"""Retention on the embedded store: finished jobs and their idempotency keys go after the
retention period (dead letters after theirs), live jobs never."""

from __future__ import annotations

from pathlib import Path

from tests.contract.helpers import NOW, claim, create, make_job
from timeshard.clock import FakeClock
from timeshard.store.base import Retention
from timeshard.store.sqlite import SqliteStore


async def test_finished_jobs_are_swept_after_their_retention(tmp_path: Path) -> None:
    clock = FakeClock(NOW)
    store = SqliteStore(
        tmp_path / "r.db",
        num_shards=8,
        retention=Retention(finished_s=60, dead_s=600),
        clock=clock,
    )
    await store.open()
    try:
        done, dead, live = make_job("done", key="k-done"), make_job("dead"), make_job("live")
        await create(store, done, dead, live)
        [c1, c2] = await store.claim_jobs([claim(done), claim(dead)])
        assert c1.job is not None and c2.job is not None
        assert (await store.complete_job("done", c1.job.fence, NOW)).applied
        assert (await store.fail_job("dead", c2.job.fence, NOW, "boom", None)).applied
        clock.advance(59)
        assert await store.sweep() == 0
        clock.advance(2)  # past the 60 s of a succeeded job, not the 600 s of a dead one
        assert await store.sweep() == 1
        assert await store.get_job("done") is None
        assert await store.get_job("dead") is not None and await store.get_job("live")
        # The key went with its job: it can be used again.
        [again] = await create(store, make_job("done-2", key="k-done"))
        assert again.created and again.job.job_id == "done-2"
        clock.advance(600)
        assert await store.sweep() == 1
        assert await store.get_job("dead") is None
        assert await store.get_job("live") is not None  # scheduled: kept however old
    finally:
        await store.close()
