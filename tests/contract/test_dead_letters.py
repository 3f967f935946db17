"""The dead-letter queue: a dead job is replayed or purged, each conditional on its fence."""

from __future__ import annotations

import asyncio

from tests.contract.conftest import OpenStore
from tests.contract.helpers import (
    NOW,
    assert_stored,
    assert_unchanged,
    claim,
    claimed,
    create,
    created,
    entries_of,
    make_job,
)
from timeshard.model import Job, JobState
from timeshard.store.base import Store


async def dead(store: Store, job_id: str, at: int = NOW + 10, **kw: object) -> Job:
    running = await claimed(store, await created(store, job_id, **kw))
    out = await store.fail_job(job_id, running.fence, at, "bad input", None)
    return await assert_stored(store, out)


async def test_the_queue_counts_its_dead_jobs_and_names_the_latest(open_store: OpenStore) -> None:
    """The size of the queue for the metrics and the status page: the dead jobs only, the
    latest first; a replayed or purged job leaves it (at once on the node that did it)."""
    async with open_store() as store:
        assert await store.dead_letters(limit=100, latest=2) == (0, [])
        await created(store, "dl-live")
        done = await claimed(store, await created(store, "dl-done"))
        assert (await store.complete_job("dl-done", done.fence, NOW + 10)).applied
        for i in (1, 2, 3):
            await dead(store, f"dl-c{i}", at=NOW + 10 * i)

        async def queue(latest: int = 2) -> tuple[int, list[str]]:
            count, jobs = await store.dead_letters(limit=100, latest=latest)
            assert all(j.state is JobState.DEAD for j in jobs)
            return count, [j.job_id for j in jobs]

        assert await queue() == (3, ["dl-c3", "dl-c2"])
        again = await store.get_job("dl-c3")
        assert again is not None
        assert (await store.replay_job("dl-c3", again.fence, NOW + 60_000, NOW + 40)).applied
        assert await queue() == (2, ["dl-c2", "dl-c1"])
        purged = await store.get_job("dl-c2")
        assert purged is not None and (await store.purge_job("dl-c2", purged.fence)).applied
        assert await queue(latest=5) == (1, ["dl-c1"])


async def test_replay_schedules_a_dead_job_again(open_store: OpenStore) -> None:
    async with open_store() as store:
        gone = await dead(store, "dl-1", key="dl-key")
        at = NOW + 7 * 60_000
        out = await store.replay_job("dl-1", gone.fence, at, NOW + 20)
        again = await assert_stored(store, out)
        assert again.state is JobState.SCHEDULED and again.run_at == at
        assert (again.attempt, again.finished_at, again.fence) == (0, 0, gone.fence)
        assert again.history == gone.history and again.idempotency_key == "dl-key"
        assert [e.due_at for e in await entries_of(store, again, at)] == [at]
        [out2] = await store.claim_jobs([claim(again)])
        assert (await assert_stored(store, out2)).attempt == 1


async def test_replay_needs_a_dead_job_with_its_fence(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "dl-2")
        not_dead = await store.replay_job("dl-2", 0, NOW, NOW)
        await assert_unchanged(store, not_dead, job)
        gone = await dead(store, "dl-3")
        stale = await store.replay_job("dl-3", gone.fence + 1, NOW + 60_000, NOW)
        await assert_unchanged(store, stale, gone)
        missing = await store.replay_job("dl-none", 0, NOW, NOW)
        assert not missing.applied and missing.job is None


async def test_purge_deletes_a_dead_job(open_store: OpenStore) -> None:
    async with open_store() as store:
        gone = await dead(store, "dl-4")
        out = await store.purge_job("dl-4", gone.fence)
        assert out.applied and out.job == gone  # the row as it was
        assert await store.get_job("dl-4") is None
        again = await store.purge_job("dl-4", gone.fence)
        assert not again.applied and again.job is None


async def test_purge_needs_a_dead_job_with_its_fence(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "dl-5"))
        out = await store.purge_job("dl-5", running.fence)
        await assert_unchanged(store, out, running)
        gone = await dead(store, "dl-6")
        stale = await store.purge_job("dl-6", gone.fence - 1)
        await assert_unchanged(store, stale, gone)


async def test_a_purged_keyed_job_can_be_created_again(open_store: OpenStore) -> None:
    async with open_store() as store:
        gone = await dead(store, "dl-7", key="again-key")
        assert (await store.purge_job("dl-7", gone.fence)).applied
        [result] = await create(store, make_job("dl-8", key="again-key"))
        assert result.created and result.job.job_id == "dl-7"  # the key keeps its job id
        await asyncio.sleep(0.5)  # nothing the purge left in flight may undo the new job
        stored = await store.get_job("dl-7")
        assert stored is not None and stored.state is JobState.SCHEDULED
        [repeat] = await create(store, make_job("dl-9", key="again-key"))
        assert not repeat.created and repeat.job.job_id == "dl-7"
        assert await store.get_job("dl-9") is None
