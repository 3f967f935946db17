"""Cron schedule rows: created once, updated conditionally on their version, listed, deleted;
each with the bucket entry of its next fire; a person's change written with its revision."""

from __future__ import annotations

import pytest

from tests.contract.conftest import OpenStore
from tests.contract.helpers import NOW, NUM_SHARDS
from timeshard.errors import InvalidArgument
from timeshard.limits import REVISIONS_KEPT
from timeshard.model import Change, ChangeKind, MisfirePolicy, OverlapPolicy, Schedule
from timeshard.sharding import minute_of, shard_of
from timeshard.store.base import Store, schedule_entry

CREATE, PAUSE, DELETE = ChangeKind.CREATE, ChangeKind.PAUSE, ChangeKind.DELETE


def make_schedule(schedule_id: str, *, next_fire: int = NOW + 3_600_000) -> Schedule:
    return Schedule(
        schedule_id=schedule_id,
        shard=shard_of(schedule_id, NUM_SHARDS),
        cron="0 2 * * *",
        timezone="Europe/Berlin",
        dst_gap="shift",
        job_type="invoices.generate",
        payload=b'{"all":true}',
        max_attempts=5,
        misfire=MisfirePolicy.ALL,
        misfire_grace_ms=30_000,
        max_catchup=3,
        overlap=OverlapPolicy.QUEUE,
        max_concurrent=2,
        jitter_ms=250,
        next_fire=next_fire,
        created_at=NOW,
        active=("nightly@1", "nightly@2"),
    )


async def entry_times(store: Store, s: Schedule, at: int) -> list[int]:
    page = await store.read_bucket(s.shard, minute_of(at), due_from=0, due_to=2**62)
    return [e.due_at for e in page if e.job_id == s.entry_id]


async def test_create_stores_the_schedule_and_its_entry(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("nightly")
        created, stored = await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        assert created and stored == s
        assert await store.get_schedule("nightly") == s
        assert await entry_times(store, s, s.next_fire) == [s.next_fire]
        other = make_schedule("nightly", next_fire=NOW + 60_000).with_(cron="* * * * *")
        again, found = await store.create_schedule(other, schedule_entry(other, NOW, NOW))
        assert not again and found == s
        assert await store.get_schedule("nightly") == s
        assert await store.get_schedule("missing") is None


async def test_update_applies_only_at_the_expected_version(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("hourly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        later = s.next_fire + 3_600_000
        moved = s.with_(next_fire=later, last_fire_at=s.next_fire, active=("hourly@9",))
        ok, after = await store.update_schedule(moved, 0, schedule_entry(moved, later, NOW))
        assert ok and after == moved.with_(version=1)
        assert await store.get_schedule("hourly") == after
        assert await entry_times(store, s, later) == [later]
        stale, found = await store.update_schedule(s.with_(paused=True), 0, None)
        assert not stale and found == after
        ok, paused = await store.update_schedule(after.with_(paused=True), 1, None)
        assert ok and paused is not None and paused.paused and paused.version == 2
        missing, none = await store.update_schedule(make_schedule("ghost"), 0, None)
        assert not missing and none is None
        assert await store.get_schedule("ghost") is None


async def test_schedules_list_in_pages(open_store: OpenStore) -> None:
    async with open_store() as store:
        ids = [f"sched-{i}" for i in range(7)]
        for i in ids:
            s = make_schedule(i)
            await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        seen: list[str] = []
        token = ""
        while True:
            page, token = await store.list_schedules(limit=3, page_token=token)
            assert len(page) <= 3
            seen += [s.schedule_id for s in page]
            if not token:
                break
        assert sorted(seen) == ids and len(seen) == len(ids)


async def test_a_schedule_page_token_the_store_never_gave_out_is_refused(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        for i in range(4):
            s = make_schedule(f"sched-{i}")
            await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        _, token = await store.list_schedules(limit=2, page_token="")
        assert token
        i = len(token) // 2
        altered = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]
        for bad in ["sched-1", "c2NoZWQtMQ==", altered, token[:-3]]:
            with pytest.raises(InvalidArgument) as info:
                await store.list_schedules(limit=2, page_token=bad)
            assert info.value.field == "page_token"
        page, _ = await store.list_schedules(limit=2, page_token=token)
        assert len(page) == 2


def said(kind: ChangeKind, at: int = NOW, **kw: str) -> Change:
    return Change(kind=kind, at_ms=at, **kw)


async def revisions_of(store: Store, sid: str) -> list[tuple[int, ChangeKind]]:
    return [(r.revision, r.change.kind) for r in await store.schedule_revisions(sid)]


async def test_delete_hides_the_row_and_keeps_its_revisions(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("gone").with_(revision=1)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        stale, found = await store.delete_schedule(s.with_(revision=2), 5, said(DELETE))
        assert not stale and found == s
        ok, none = await store.delete_schedule(s.with_(revision=2), 0, said(DELETE, actor="ann"))
        assert ok and none is None
        assert await store.get_schedule("gone") is None
        again, none = await store.delete_schedule(s.with_(revision=3), 1, said(DELETE))
        assert not again and none is None
        page, token = await store.list_schedules(limit=10, page_token="")
        assert page == [] and token == ""
        kept = await store.schedule_revisions("gone")
        assert [(r.revision, r.change.kind, r.change.actor) for r in kept] == [
            (2, DELETE, "ann"),
            (1, CREATE, "anonymous"),
        ]
        assert kept[0].schedule == s.with_(revision=2, active=(), version=0)


async def test_a_create_on_a_deleted_id_goes_on_from_its_revisions(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("again").with_(revision=1)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        await store.delete_schedule(s.with_(revision=2), 0, said(DELETE))
        new = s.with_(cron="*/5 * * * *")  # (revision 1 asked: the store knows better)
        created, stored = await store.create_schedule(
            new, schedule_entry(new, new.next_fire, NOW), said(CREATE, reason="back")
        )
        assert created and stored == new.with_(revision=3, version=2)
        assert await store.get_schedule("again") == stored
        assert [s.schedule_id for s in (await store.list_schedules(limit=5, page_token=""))[0]] == [
            "again"
        ]
        assert await revisions_of(store, "again") == [(3, CREATE), (2, DELETE), (1, CREATE)]
        dup, found = await store.create_schedule(new, schedule_entry(new, NOW, NOW), said(CREATE))
        assert not dup and found == stored
        assert len(await store.schedule_revisions("again")) == 3


async def test_a_change_and_its_revision_are_one_conditional_write(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("revised").with_(revision=1)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        first = await store.schedule_revision("revised", 1)
        assert first is not None and first.schedule == s.with_(active=(), version=0)
        assert first.change == said(CREATE)
        paused = s.with_(paused=True, revision=2)
        stale, _ = await store.update_schedule(paused, 7, None, said(PAUSE))
        assert not stale and await revisions_of(store, "revised") == [(1, CREATE)]
        why = "maintenance window"
        ok, after = await store.update_schedule(paused, 0, None, said(PAUSE, reason=why))
        assert ok and after == paused.with_(version=1)
        two = await store.schedule_revision("revised", 2)
        assert two is not None and two.change.reason == why and two.schedule.paused
        # A fire (no change) moves the version and leaves the revision as it is.
        fired = after.with_(last_fire_at=NOW, revision=1)
        ok, after = await store.update_schedule(fired, 1, None)
        assert (
            ok
            and after is not None
            and (await store.get_schedule("revised")) == fired.with_(version=2, revision=2)
        )
        assert await revisions_of(store, "revised") == [(2, PAUSE), (1, CREATE)]
        assert await store.schedule_revision("revised", 3) is None
        assert await store.schedule_revisions("never-made") == []


async def test_the_newest_revisions_are_kept(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("busy").with_(revision=1)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        for n in range(2, REVISIONS_KEPT + 4):
            ok, _ = await store.update_schedule(
                s.with_(paused=n % 2 == 0, revision=n), n - 2, None, said(PAUSE)
            )
            assert ok
        kept = [r for r, _ in await revisions_of(store, "busy")]
        assert kept == list(range(REVISIONS_KEPT + 3, 3, -1))


async def test_a_page_of_revisions_is_the_kept_ones_below_a_number(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("paged").with_(revision=1)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        newest = REVISIONS_KEPT + 3
        for n in range(2, newest + 1):
            ok, _ = await store.update_schedule(
                s.with_(paused=n % 2 == 0, revision=n), n - 2, None, said(PAUSE)
            )
            assert ok

        async def page(below: int | None, limit: int) -> list[int]:
            found = await store.schedule_revisions("paged", below=below, limit=limit)
            return [r.revision for r in found]

        assert await page(None, 3) == [newest, newest - 1, newest - 2]
        assert await page(newest - 2, 2) == [newest - 3, newest - 4]
        assert await page(6, 5) == [5, 4]  # the oldest kept is 4
        assert await page(4, 5) == [] and await page(1, 5) == []
        assert await page(None, 1) == [newest]
        one = await store.schedule_revision("paged", 50)
        assert one is not None and one.revision == 50 and one.schedule.paused
        assert await store.schedule_revision("paged", 3) is None  # dropped
        assert await store.schedule_revision("paged", newest + 1) is None
        assert await store.schedule_revisions("never-made", below=5, limit=2) == []
        assert await store.schedule_revision("never-made", 1) is None


async def test_a_deleted_schedule_is_purged_once_its_delete_is_old_enough(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        s = make_schedule("old").with_(revision=1)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        assert await store.purge_schedule("old", deleted_before=NOW + 10**9) is None  # live
        assert await store.purge_schedule("never-made", deleted_before=NOW) is None
        deleted_at = NOW + 5_000
        await store.delete_schedule(s.with_(revision=2), 0, said(DELETE, at=deleted_at))
        assert await store.purge_schedule("old", deleted_before=deleted_at - 1) == deleted_at
        assert await revisions_of(store, "old") == [(2, DELETE), (1, CREATE)]  # unchanged
        assert await store.purge_schedule("old", deleted_before=deleted_at) == 0
        assert await store.schedule_revisions("old") == []
        assert await store.schedule_revision("old", 2) is None
        assert await store.get_schedule("old") is None
        assert await store.purge_schedule("old", deleted_before=deleted_at) is None
        # The id is new again: its history starts over.
        created, stored = await store.create_schedule(
            s, schedule_entry(s, s.next_fire, NOW), said(CREATE)
        )
        assert created and stored == s and await revisions_of(store, "old") == [(1, CREATE)]


async def test_a_deleted_schedule_created_again_is_not_purged(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("back").with_(revision=1)
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        await store.delete_schedule(s.with_(revision=2), 0, said(DELETE))
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW), said(CREATE))
        assert await store.purge_schedule("back", deleted_before=NOW + 10**9) is None
        assert await revisions_of(store, "back") == [(3, CREATE), (2, DELETE), (1, CREATE)]
        assert await store.get_schedule("back") is not None
