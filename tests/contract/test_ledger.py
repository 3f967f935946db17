"""The occurrence ledger on every store: its rows are written by the schedule's conditional
update that carries them, and only when it applies (they cannot disagree with the decision);
read back newest first, a later decision for the same occurrence replacing the earlier one,
a run of occurrences found from any time inside it."""

from __future__ import annotations

from tests.contract.conftest import OpenStore
from tests.contract.helpers import NOW
from tests.contract.test_schedules import make_schedule
from timeshard.ledger import DAY_MS, LedgerRow, Reason
from timeshard.store.base import schedule_entry

MIN = 60_000


def row(nominal: int, reason: Reason = Reason.CREATED, **kw: object) -> LedgerRow:
    fields: dict[str, object] = {
        "schedule_id": "nightly",
        "nominal": nominal,
        "reason": reason,
        "node": "node-a",
        "epoch": 3,
        "decided_at": nominal + 5,
        "revision": 2,
    }
    fields.update(kw)
    return LedgerRow(**fields)  # type: ignore[arg-type]


async def test_rows_are_written_with_the_update_that_applies(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("nightly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        made = row(NOW, job_id="nightly@1", run_at=NOW + 250, notes=("spread: runs 0.25s after",))
        skipped = row(NOW + MIN, Reason.SKIPPED_OVERLAP, notes=("1 earlier run still going",))
        ok, after = await store.update_schedule(s, 0, None, ledger=[made, skipped])
        assert ok and after is not None
        assert await store.read_ledger("nightly", at_or_before=NOW + MIN, limit=10) == [
            skipped,
            made,
        ]
        assert await store.read_ledger("nightly", at_or_before=NOW, limit=10) == [made]
        assert await store.read_ledger("nightly", at_or_before=NOW + MIN, limit=1) == [skipped]
        assert await store.read_ledger("other", at_or_before=NOW + MIN, limit=10) == []


async def test_an_update_that_does_not_apply_writes_no_row(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("nightly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        assert (await store.update_schedule(s, 0, None))[0]
        stale, _ = await store.update_schedule(s, 0, None, ledger=[row(NOW)])  # version 1 now
        assert not stale
        ghost, _ = await store.update_schedule(make_schedule("ghost"), 0, None, ledger=[row(NOW)])
        assert not ghost
        assert await store.read_ledger("nightly", at_or_before=NOW + DAY_MS, limit=10) == []
        assert await store.read_ledger("ghost", at_or_before=NOW + DAY_MS, limit=10) == []
        # (read again through a fresh open: nothing was left to copy either)
    async with open_store() as again:
        assert await again.get_schedule("nightly") is not None
        assert await again.read_ledger("nightly", at_or_before=NOW + DAY_MS, limit=10) == []


async def test_a_later_decision_for_an_occurrence_replaces_the_earlier(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        s = make_schedule("nightly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        await store.update_schedule(s, 0, None, ledger=[row(NOW, Reason.QUEUED)])
        ran = row(NOW, Reason.CREATED, job_id="nightly@x", decided_at=NOW + MIN)
        await store.update_schedule(s, 1, None, ledger=[ran])
        assert await store.read_ledger("nightly", at_or_before=NOW, limit=10) == [ran]


async def test_a_run_of_occurrences_spanning_days_is_one_row(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("nightly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        first, last = NOW - 2 * DAY_MS, NOW
        dropped = row(first, Reason.MISSED_SKIPPED, last=last, count=2880, decided_at=NOW + 1)
        caught = row(NOW + MIN, Reason.CAUGHT_UP, job_id="nightly@c", decided_at=NOW + 1)
        await store.update_schedule(s, 0, None, ledger=[dropped, caught])
        inside = await store.read_ledger("nightly", at_or_before=NOW - DAY_MS, limit=1)
        assert inside == [dropped] and dropped.covers(NOW - DAY_MS)
        every = await store.read_ledger("nightly", at_or_before=NOW + DAY_MS, limit=10)
        assert every == [caught, dropped]  # each once, though kept in each day it spans


async def test_the_latest_decision_survives_a_reopen(open_store: OpenStore) -> None:
    async with open_store() as store:
        s = make_schedule("nightly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        await store.update_schedule(s, 0, None, ledger=[row(NOW)])
    async with open_store() as again:
        assert await again.read_ledger("nightly", at_or_before=NOW, limit=5) == [row(NOW)]


async def test_a_dst_skip_row_keeps_its_millisecond_key_inside_a_run_of_misses(
    open_store: OpenStore,
) -> None:
    """The rows of a gap the DST rule skipped are keyed 1 ms before the transition (never a
    fire time): a store keeps that millisecond, sorts the row between the runs around it, and
    a run of missed occurrences decided with it is still found from inside it."""
    async with open_store() as store:
        s = make_schedule("nightly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        transition = NOW + 60 * MIN
        missed = row(NOW, Reason.MISSED_SKIPPED, last=transition + 30 * MIN, count=5)
        gap = row(transition - 1, Reason.SKIPPED_DST_GAP, last=transition - 1, count=4)
        fold = row(NOW + DAY_MS, Reason.SKIPPED_DST_FOLD, last=NOW + DAY_MS + 45 * MIN, count=4)
        await store.update_schedule(s, 0, None, ledger=[missed, gap, fold])
        assert await store.read_ledger("nightly", at_or_before=transition - 1, limit=1) == [gap]
        around = await store.read_ledger("nightly", at_or_before=transition, limit=3)
        assert around == [gap, missed] and missed.covers(transition)
        inside = await store.read_ledger("nightly", at_or_before=NOW + DAY_MS + MIN, limit=1)
        assert inside == [fold] and fold.covers(NOW + DAY_MS + 15 * MIN)
