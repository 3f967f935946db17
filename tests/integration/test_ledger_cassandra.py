"""The occurrence ledger on real Cassandra: the rows of a decision live in the schedule row's
conditional write (its outbox), so a copy to the ledger table cut off after the write applied
is made by the next read of the row, before any other update can overwrite them; and the
rows have the ledger retention as their time to live."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.helpers import NOW
from tests.contract.test_ledger import row
from tests.contract.test_schedules import make_schedule
from timeshard.errors import StoreUnavailable
from timeshard.ledger import DAY_MS
from timeshard.store.base import Retention, schedule_entry
from timeshard.store.cassandra import CassandraStore
from timeshard.store.cassandra.ledger import LedgerTable

pytestmark = pytest.mark.timeout(300)


def url(address: str, keyspace: str) -> str:
    return f"cassandra://{address}/{keyspace}"


async def test_a_copy_cut_off_is_made_by_the_next_read_of_the_row(
    cassandra_address: str, keyspace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=8)
    await crashed.open()
    s = make_schedule("nightly")
    await crashed.create_schedule(s, schedule_entry(s, s.next_fire, NOW))

    async def cut_off(self: LedgerTable, rows: Any, texts: Any = ()) -> None:
        raise StoreUnavailable("the node died after the conditional write applied")

    with monkeypatch.context() as m:
        m.setattr(LedgerTable, "copy", cut_off)
        applied, _ = await crashed.update_schedule(s, 0, None, ledger=[row(NOW)])
    assert applied  # (the copy is left to the next read)
    await crashed.close()
    # The decision applied; its row is in the schedule row only.
    other = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=8)
    await other.open()
    try:
        assert await other.read_ledger("nightly", at_or_before=NOW, limit=5) == []
        current = await other.get_schedule("nightly")  # what every updater reads first
        assert current is not None and current.version == 1
        assert await other.read_ledger("nightly", at_or_before=NOW, limit=5) == [row(NOW)]
        applied, _ = await other.update_schedule(current, 1, None, ledger=[row(NOW + 60_000)])
        assert applied
        both = await other.read_ledger("nightly", at_or_before=NOW + DAY_MS, limit=5)
        assert both == [row(NOW + 60_000), row(NOW)]
    finally:
        await other.close()


async def test_rows_live_for_the_ledger_retention(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    store = CassandraStore.from_url(
        url(cassandra_address, keyspace), num_shards=8, retention=Retention(ledger_s=3 * 86400)
    )
    await store.open()
    try:
        s = make_schedule("nightly")
        await store.create_schedule(s, schedule_entry(s, s.next_fire, NOW))
        await store.update_schedule(s, 0, None, ledger=[row(NOW)])
    finally:
        await store.close()
    found = cassandra_admin.execute(
        f"SELECT TTL(row) AS ttl FROM {keyspace}.schedule_ledger WHERE schedule_id = %s "
        "AND day = %s",
        ("nightly", NOW // DAY_MS),
    ).one()
    ttl = found["ttl"] if isinstance(found, dict) else found.ttl
    assert 3 * 86400 - 60 < ttl <= 3 * 86400
