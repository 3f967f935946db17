"""Bucket partitions: ``(shard, minute)``, ordered by ``(due_at, job_id)``, insert-only,
read by range and in pages."""

from __future__ import annotations

from tests.contract.conftest import OpenStore
from tests.contract.helpers import NOW
from timeshard.model import BucketEntry
from timeshard.sharding import minute_of
from timeshard.store.base import Store

MINUTE = minute_of(NOW)


def entry(due_offset_ms: int, job_id: str, *, shard: int = 3) -> BucketEntry:
    due = NOW + due_offset_ms
    return BucketEntry(shard=shard, minute=minute_of(due), due_at=due, job_id=job_id)


async def read(store: Store, **kw: object) -> list[tuple[int, str]]:
    args: dict[str, object] = {"due_from": 0, "due_to": 2**62} | kw
    page = await store.read_bucket(3, MINUTE, **args)  # type: ignore[arg-type]
    return [(e.due_at - NOW, e.job_id) for e in page]


async def test_a_bucket_reads_in_due_then_id_order(open_store: OpenStore) -> None:
    async with open_store() as store:
        await store.add_entries(
            [entry(500, "b"), entry(100, "z"), entry(500, "a"), entry(59_999, "m"), entry(0, "q")]
        )
        assert await read(store) == [(0, "q"), (100, "z"), (500, "a"), (500, "b"), (59_999, "m")]


async def test_other_partitions_are_not_read(open_store: OpenStore) -> None:
    async with open_store() as store:
        await store.add_entries(
            [entry(1_000, "mine"), entry(1_000, "shard4", shard=4), entry(60_000, "next-minute")]
        )
        assert await read(store) == [(1_000, "mine")]
        page = await store.read_bucket(4, MINUTE, due_from=0, due_to=2**62)
        assert [e.job_id for e in page] == ["shard4"]
        page = await store.read_bucket(3, MINUTE + 1, due_from=0, due_to=2**62)
        assert page == [entry(60_000, "next-minute")]


async def test_due_range_is_half_open(open_store: OpenStore) -> None:
    async with open_store() as store:
        await store.add_entries([entry(ms, f"j{ms}") for ms in (0, 999, 1_000, 1_500, 2_000)])
        got = await read(store, due_from=NOW + 1_000, due_to=NOW + 2_000)
        assert got == [(1_000, "j1000"), (1_500, "j1500")]
        assert await read(store, due_from=NOW + 2_001, due_to=NOW + 60_000) == []
        assert await read(store, due_from=NOW, due_to=NOW + 1) == [(0, "j0")]


async def test_entries_are_insert_only_and_idempotent(open_store: OpenStore) -> None:
    async with open_store() as store:
        e = entry(2_000, "same")
        await store.add_entries([e])
        await store.add_entries([e, e])
        assert await read(store) == [(2_000, "same")]
        await store.add_entries([entry(3_000, "same")])  # another time: another entry
        assert await read(store) == [(2_000, "same"), (3_000, "same")]


async def test_paging_with_after_visits_each_entry_once(open_store: OpenStore) -> None:
    async with open_store() as store:
        expected = sorted((ms, f"p{i:02d}") for i, ms in enumerate([100, 100, 100, 200, 300] * 5))
        await store.add_entries([entry(ms, job_id) for ms, job_id in expected])
        seen: list[tuple[int, str]] = []
        after: tuple[int, str] | None = None
        while True:
            page = await store.read_bucket(
                3, MINUTE, due_from=NOW, due_to=NOW + 60_000, after=after, limit=4
            )
            assert len(page) <= 4
            if not page:
                break
            seen += [(e.due_at - NOW, e.job_id) for e in page]
            after = (page[-1].due_at, page[-1].job_id)
        assert seen == expected


async def test_after_and_due_from_together_take_the_later_bound(open_store: OpenStore) -> None:
    async with open_store() as store:
        await store.add_entries([entry(ms, f"e{ms}") for ms in (100, 200, 300, 400)])
        # after is before due_from: due_from decides
        got = await read(store, due_from=NOW + 300, after=(NOW + 100, "e100"))
        assert got == [(300, "e300"), (400, "e400")]
        # after is past due_from: after decides, strictly
        got = await read(store, due_from=NOW + 100, after=(NOW + 200, "e200"))
        assert got == [(300, "e300"), (400, "e400")]
        got = await read(store, due_from=NOW, after=(NOW + 200, "e1"), due_to=NOW + 300)
        assert got == [(200, "e200")]


async def test_many_partitions_read_at_once_each_get_their_own_first_page(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        await store.add_entries(
            [
                *(entry(ms, f"s3-{ms}") for ms in (100, 200, 300, 400)),
                entry(150, "s5", shard=5),
                entry(5_000, "s5-late", shard=5),  # outside the range read
                entry(60_100, "s5-next-minute", shard=5),
                entry(100, "s69", shard=69),  # beyond the first request's partitions
            ]
        )
        shards = list(range(70))  # more than one request's worth on a store that splits them
        pages = await store.read_buckets(
            shards, MINUTE, due_from=NOW + 100, due_to=NOW + 5_000, limit=3
        )
        assert sorted(pages) == shards  # every shard asked for has a page, most of them empty
        got = {s: [(e.due_at - NOW, e.job_id) for e in page] for s, page in pages.items() if page}
        assert got == {
            3: [(100, "s3-100"), (200, "s3-200"), (300, "s3-300")],  # a full page: more to read
            5: [(150, "s5")],
            69: [(100, "s69")],
        }
