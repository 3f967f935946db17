"""Creating, reading and listing jobs (invariant 1: durable before acknowledged, and
idempotency keys)."""

from __future__ import annotations

import asyncio

import pytest

from tests.contract.conftest import OpenStore
from tests.contract.helpers import NOW, claimed, create, created, entries_of, make_job
from timeshard.errors import InvalidArgument
from timeshard.model import JobState
from timeshard.store.base import entry_for


async def test_created_job_and_its_entry_are_readable_from_another_connection(
    open_store: OpenStore,
) -> None:
    job = make_job("job-1", run_at=NOW + 90_000)
    async with open_store() as store:
        [result] = await create(store, job)
        assert result.created and not result.conflict and result.job == job
    async with open_store() as again:  # the same storage, opened anew
        assert await again.get_job("job-1") == job
        [entry] = await entries_of(again, job, NOW + 90_000)
        assert entry.due_at == NOW + 90_000 and entry.shard == job.shard


async def test_entry_of_a_job_due_in_the_past_is_due_now(open_store: OpenStore) -> None:
    job = make_job("late", run_at=NOW - 5 * 60_000)
    async with open_store() as store:
        await create(store, job, now=NOW)
        assert [e.due_at for e in await entries_of(store, job, NOW)] == [NOW]
        assert await entries_of(store, job, NOW - 5 * 60_000) == []


async def test_get_jobs_returns_only_those_that_exist(open_store: OpenStore) -> None:
    async with open_store() as store:
        a = await created(store, "a")
        b = await created(store, "b")
        assert await store.get_jobs(["a", "missing", "b", "a"]) == {"a": a, "b": b}
        assert await store.get_job("missing") is None


async def test_same_id_again_returns_the_stored_job(open_store: OpenStore) -> None:
    async with open_store() as store:
        first = await created(store, "dup")
        [same] = await create(store, make_job("dup", run_at=NOW + 99_000))
        assert not same.created and not same.conflict and same.job == first
        [other] = await create(store, make_job("dup", payload=b'{"n":2}'))
        assert not other.created and other.conflict and other.job == first
        assert await store.get_job("dup") == first


async def test_a_repeat_after_the_job_moved_on_returns_it_as_it_is(open_store: OpenStore) -> None:
    async with open_store() as store:
        job = await created(store, "moved")
        running = await claimed(store, job)
        [again] = await create(store, make_job("moved"))
        assert not again.created and again.job == running


async def test_idempotency_key_creates_once(open_store: OpenStore) -> None:
    async with open_store() as store:
        [first] = await create(store, make_job("k-a", key="order-17"))
        [repeat] = await create(store, make_job("k-b", key="order-17"))
        assert first.created
        assert not repeat.created and not repeat.conflict
        assert repeat.job == first.job and repeat.job.job_id == "k-a"
        assert await store.get_job("k-b") is None
        assert await entries_of(store, make_job("k-b"), NOW + 10_000) == []


async def test_idempotency_key_with_another_body_is_a_conflict(open_store: OpenStore) -> None:
    async with open_store() as store:
        [first] = await create(store, make_job("c-a", key="order-18"))
        [clash] = await create(store, make_job("c-b", key="order-18", payload=b'{"n":99}'))
        assert not clash.created and clash.conflict and clash.job == first.job
        [clash_type] = await create(store, make_job("c-c", key="order-18", job_type="other"))
        assert clash_type.conflict
        assert await store.get_jobs(["c-b", "c-c"]) == {}


async def test_a_batch_reports_each_job_in_order(open_store: OpenStore) -> None:
    async with open_store() as store:
        await created(store, "old")
        batch = [
            make_job("new-1"),
            make_job("old", payload=b"{}"),
            make_job("new-2", key="k"),
            make_job("new-3", key="k"),
            make_job("new-4", payload=b"{}"),
        ]
        results = await create(store, *batch)
        assert [r.job.job_id for r in results[:2]] == ["new-1", "old"]
        assert [r.created for r in results[:2]] == [True, False] and results[1].conflict
        assert results[4].created and results[4].job == batch[4]
        # One key, one job: whichever of the two the store took first.
        keyed = {r.job.job_id for r in results[2:4]}
        assert len(keyed) == 1 and sorted(r.created for r in results[2:4]) == [False, True]
        found = await store.get_jobs([j.job_id for j in batch])
        assert sorted(found) == sorted({"new-1", "old", "new-4", *keyed})


async def test_one_key_twice_in_a_batch_with_another_body_is_a_conflict(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        a, b = make_job("kb-a", key="kb"), make_job("kb-b", key="kb", payload=b'{"n":3}')
        first, clash = await create(store, a, b)
        assert first.created and first.job == a
        assert not clash.created and clash.conflict and clash.job == a
        assert await store.get_jobs(["kb-a", "kb-b"]) == {"kb-a": a}


async def test_many_keyed_jobs_in_one_batch_are_each_created_once(open_store: OpenStore) -> None:
    jobs = [make_job(f"keyed-{i:03d}", key=f"key-{i % 40}") for i in range(60)]
    async with open_store() as store:
        results = await create(store, *jobs)
        assert [r.created for r in results] == [True] * 40 + [False] * 20
        assert [r.job.job_id for r in results[40:]] == [f"keyed-{i:03d}" for i in range(20)]
        assert not any(r.conflict for r in results)
        again = await create(store, *jobs[:40])
        assert [r.job.job_id for r in again] == [j.job_id for j in jobs[:40]]
        assert not any(r.created for r in again)
        stored = await store.get_jobs([j.job_id for j in jobs])
        assert sorted(stored) == [f"keyed-{i:03d}" for i in range(40)]


async def test_a_large_batch_is_written_whole(open_store: OpenStore) -> None:
    jobs = [make_job(f"bulk-{i:04d}", run_at=NOW + i) for i in range(300)]
    async with open_store() as store:
        results = await create(store, *jobs)
        assert all(r.created for r in results)
        stored = await store.get_jobs([j.job_id for j in jobs])
        assert stored == {j.job_id: j for j in jobs}


async def test_list_jobs_pages_through_everything_once(open_store: OpenStore) -> None:
    async with open_store() as store:
        ids = {f"list-{i:02d}" for i in range(11)}
        await create(store, *(make_job(i) for i in sorted(ids)))
        seen: list[str] = []
        token = ""
        pages = 0
        while True:
            page = await store.list_jobs(state=None, job_type=None, limit=3, page_token=token)
            assert len(page.jobs) <= 3
            seen += [j.job_id for j in page.jobs]
            pages += 1
            token = page.next_token
            if not token:
                break
        assert sorted(seen) == sorted(ids) and len(seen) == len(ids)
        assert pages == 4
        again = await store.list_jobs(state=None, job_type=None, limit=3, page_token="")
        first = await store.list_jobs(state=None, job_type=None, limit=3, page_token="")
        assert again == first  # a stable order


async def test_list_jobs_filters_by_state_and_type(open_store: OpenStore) -> None:
    async with open_store() as store:
        await create(store, *(make_job(f"t-{i}", job_type="mail") for i in range(4)))
        await create(store, *(make_job(f"u-{i}", job_type="sms") for i in range(3)))
        running = await claimed(store, (await store.get_job("t-1")) or make_job("t-1"))

        async def ids(state: JobState | None, job_type: str | None) -> list[str]:
            out: list[str] = []
            token = ""
            while True:
                page = await store.list_jobs(
                    state=state, job_type=job_type, limit=2, page_token=token
                )
                assert all(state is None or j.state is state for j in page.jobs)
                assert all(job_type is None or j.job_type == job_type for j in page.jobs)
                out += [j.job_id for j in page.jobs]
                if not (token := page.next_token):
                    return sorted(out)

        assert await ids(None, "sms") == ["u-0", "u-1", "u-2"]
        assert await ids(JobState.RUNNING, None) == [running.job_id]
        assert await ids(JobState.SCHEDULED, "mail") == ["t-0", "t-2", "t-3"]
        assert await ids(JobState.DEAD, None) == []


def altered(token: str) -> str:
    """``token`` with one character in its middle changed."""
    i = len(token) // 2
    return token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]


async def test_a_page_token_the_store_never_gave_out_is_refused(open_store: OpenStore) -> None:
    """A made-up, cut, altered or foreign token is InvalidArgument naming ``page_token``,
    never a page from wherever it happens to point."""
    async with open_store() as store:
        await create(store, *(make_job(f"list-{i:02d}", job_type="mail") for i in range(5)))
        page = await store.list_jobs(state=None, job_type=None, limit=2, page_token="")
        token = page.next_token
        mail = await store.list_jobs(state=None, job_type="mail", limit=2, page_token="")
        assert token and mail.next_token
        for bad in ["list-01", "bGlzdC0wMQ==", "zzzz", altered(token), token[:-3]]:
            with pytest.raises(InvalidArgument) as info:
                await store.list_jobs(state=None, job_type=None, limit=2, page_token=bad)
            assert info.value.field == "page_token"
        with pytest.raises(InvalidArgument, match="other filters"):  # another listing's
            await store.list_jobs(state=None, job_type=None, limit=2, page_token=mail.next_token)
        again = await store.list_jobs(state=None, job_type=None, limit=2, page_token=token)
        assert len(again.jobs) == 2


async def test_the_shard_count_is_fixed_when_the_store_is_created(open_store: OpenStore) -> None:
    async with open_store(num_shards=8, name="fixed") as store:
        await created(store, "x")
    with pytest.raises(InvalidArgument, match="8 shards"):
        async with open_store(num_shards=16, name="fixed"):
            pass


async def test_concurrent_single_creates_are_each_durable(open_store: OpenStore) -> None:
    """Calls of one fresh job each, all at once (they share group commits on Cassandra): each
    answered call's row, entry and index are there for another connection."""
    jobs = [make_job(f"one-{i:02d}", run_at=NOW + 60_000 + i) for i in range(40)]
    async with open_store() as store:
        results = await asyncio.gather(
            *(store.create_jobs([(j, entry_for(j, j.run_at, NOW))], fresh={j.job_id}) for j in jobs)
        )
        assert [r.created and r.job == j for (r,), j in zip(results, jobs, strict=True)] == [
            True
        ] * len(jobs)
    async with open_store() as again:
        assert await again.get_jobs([j.job_id for j in jobs]) == {j.job_id: j for j in jobs}
        for j in jobs[:5]:
            assert await again.get_job(j.job_id) == j  # found through its index on Cassandra
            assert [e.due_at for e in await entries_of(again, j, j.run_at)] == [j.run_at]


async def test_concurrent_calls_with_one_key_create_one_job(open_store: OpenStore) -> None:
    jobs = [make_job(f"race-{i}", key="order-99") for i in range(8)]
    async with open_store() as store:
        results = await asyncio.gather(*(create(store, j) for j in jobs))
        owners = {r.job.job_id for (r,) in results}
        assert len(owners) == 1
        assert sum(r.created for (r,) in results) == 1
        assert not any(r.conflict for (r,) in results)
        stored = await store.get_jobs([j.job_id for j in jobs])
        assert list(stored) == list(owners)
