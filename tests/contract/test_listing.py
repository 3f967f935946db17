"""Finding jobs (``Store.find_jobs``): every filter, each order, a count on every page, and
page tokens that only go on with the listing that gave them out."""

from __future__ import annotations

import pytest

from tests.contract.conftest import OpenStore
from tests.contract.helpers import NOW, claimed, create, make_job
from timeshard.errors import InvalidArgument
from timeshard.model import Job, JobState
from timeshard.store.base import Store
from timeshard.store.listing import JobOrder, JobQuery

MIN = 60_000


def job(job_id: str, *, at: int = 0, made: int = 0, **kw: object) -> Job:
    """A job due ``at`` minutes after NOW, created ``made`` ms after NOW."""
    j = make_job(job_id, run_at=NOW + at * MIN, **kw)  # type: ignore[arg-type]
    return j.with_(created_at=NOW + made)


async def everything(store: Store, query: JobQuery, limit: int = 2) -> tuple[list[str], set[int]]:
    """The ids ``query`` finds, page after page of ``limit``, and the totals the pages gave."""
    ids: list[str] = []
    totals: set[int] = set()
    token = ""
    while True:
        page = await store.find_jobs(query, limit=limit, page_token=token, count=True)
        assert len(page.jobs) <= limit
        assert page.total is not None
        ids += [j.job_id for j in page.jobs]
        totals.add(page.total)
        if not (token := page.next_token):
            return ids, totals


async def test_each_order_lists_every_job_once_and_counts_them(open_store: OpenStore) -> None:
    async with open_store() as store:
        await create(
            store,
            job("c", at=5, made=1),
            job("a", at=30, made=3),
            job("b", at=5, made=2),  # due with c: the id decides
            job("e", at=1, made=5),
            job("d", at=90, made=4),
        )
        assert await everything(store, JobQuery()) == (["e", "b", "c", "a", "d"], {5})
        by_created = JobQuery(order=JobOrder.CREATED)
        assert await everything(store, by_created) == (["c", "b", "a", "d", "e"], {5})
        by_id = JobQuery(order=JobOrder.ID)
        assert await everything(store, by_id, limit=3) == (["a", "b", "c", "d", "e"], {5})
        exact = await store.find_jobs(JobQuery(), limit=5, page_token="", count=True)
        assert len(exact.jobs) == 5 and exact.next_token == ""  # no empty page after it


async def test_every_filter_and_all_of_them_together(open_store: OpenStore) -> None:
    async with open_store() as store:
        await create(
            store,
            job("m1", at=1, job_type="mail", key="order-1:mail"),
            job("m2", at=2, job_type="mail", key="order-2:mail"),
            job("m3", at=3, job_type="mail"),
            job("s1", at=4, job_type="sms", key="order-1:sms"),
            job("nightly@100", at=5, job_type="report"),
            job("nightly@200", at=6, job_type="report"),
            job("nightly-2@100", at=7, job_type="report"),
            job("nightlyA", at=8, job_type="report"),
        )
        m2 = await store.get_job("m2")
        assert m2 is not None
        await claimed(store, m2)  # (claimed once due)
        running = frozenset([JobState.RUNNING])

        async def ids(**filters: object) -> list[str]:
            found, totals = await everything(store, JobQuery(**filters))  # type: ignore[arg-type]
            assert totals == {len(found)}
            return found

        assert await ids(job_type="mail") == ["m1", "m2", "m3"]
        assert await ids(states=running) == ["m2"]
        both = frozenset([JobState.RUNNING, JobState.SCHEDULED])
        assert await ids(states=both, job_type="mail") == ["m1", "m2", "m3"]
        assert await ids(states=frozenset([JobState.DEAD])) == []
        assert await ids(due_from=NOW + 2 * MIN, due_to=NOW + 4 * MIN) == ["m2", "m3"]
        assert await ids(due_from=NOW + 7 * MIN) == ["nightly-2@100", "nightlyA"]
        assert await ids(due_to=NOW + 2 * MIN) == ["m1"]
        assert await ids(key="order-1:sms") == ["s1"]
        assert await ids(key="order-1:sms", job_type="mail") == []
        assert await ids(key="order-1") == []  # exact, not a prefix
        assert await ids(key_prefix="order-1:") == ["m1", "s1"]
        assert await ids(key_prefix="order-") == ["m1", "m2", "s1"]
        assert await ids(schedule_id="nightly") == ["nightly@100", "nightly@200"]
        assert await ids(schedule_id="nightly-2") == ["nightly-2@100"]
        assert await ids(schedule_id="nightly", due_from=NOW + 6 * MIN) == ["nightly@200"]
        assert await ids(key_prefix="order-", states=running, job_type="mail") == ["m2"]


async def test_a_page_goes_on_after_the_last_job_listed_whatever_changed(
    open_store: OpenStore,
) -> None:
    """Cancelling the jobs of a page (as a bulk cancel does) moves none of the rest past the
    next page's start: each is listed once."""
    async with open_store() as store:
        await create(store, *(job(f"j{i}", at=i) for i in range(7)))
        query = JobQuery(states=frozenset([JobState.SCHEDULED]))
        seen: list[str] = []
        token = ""
        while True:
            page = await store.find_jobs(query, limit=2, page_token=token)
            for j in page.jobs:
                assert (await store.cancel_job(j.job_id, JobState.SCHEDULED, j.fence, NOW)).applied
            seen += [j.job_id for j in page.jobs]
            if not (token := page.next_token):
                break
        assert seen == [f"j{i}" for i in range(7)]
        empty = await store.find_jobs(query, limit=2, page_token="", count=True)
        assert empty.jobs == [] and empty.total == 0 and empty.next_token == ""


async def test_a_token_only_goes_on_with_the_listing_that_gave_it_out(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        await create(store, *(job(f"j{i}", at=i, job_type="mail") for i in range(4)))
        query = JobQuery(job_type="mail")
        token = (await store.find_jobs(query, limit=1, page_token="")).next_token
        assert token
        for other in [
            JobQuery(),
            JobQuery(job_type="mail", order=JobOrder.ID),
            JobQuery(job_type="mail", due_from=NOW),
            JobQuery(job_type="mail", states=frozenset([JobState.SCHEDULED])),
        ]:
            with pytest.raises(InvalidArgument, match="other filters or another sort"):
                await store.find_jobs(other, limit=1, page_token=token)
        with pytest.raises(InvalidArgument, match="another listing"):
            await store.list_schedules(limit=1, page_token=token)
        _, schedules_token = await store.list_schedules(limit=1, page_token="")
        assert schedules_token == ""  # none stored: no token to carry over
        page = await store.find_jobs(JobQuery(job_type="mail"), limit=1, page_token=token)
        assert [j.job_id for j in page.jobs] == ["j1"]


def test_a_query_checks_its_filters_naming_the_api_fields() -> None:
    cases = [
        ({"job_type": "no spaces"}, "type"),
        ({"key": "k" * 201}, "idempotency_key"),
        ({"key": "a", "key_prefix": "a"}, "idempotency_key_prefix"),
        ({"schedule_id": "bad@id"}, "schedule_id"),
        ({"due_from": NOW, "due_to": NOW}, "run_at_to"),
    ]
    for filters, field in cases:
        with pytest.raises(InvalidArgument) as info:
            JobQuery(**filters)  # type: ignore[arg-type]
        assert info.value.field == field
