"""The operator console's audit (``Store.add_audit``, ``Store.audit``): every node's actions in
one place, newest first across days, kept for the retention and no longer."""

from __future__ import annotations

from tests.contract.conftest import OpenStore

DAY_MS = 86_400_000
NOW = 1_800_000_000_000


async def test_the_newest_actions_come_first_across_days_and_old_ones_are_gone(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        await store.add_audit(NOW - 3 * DAY_MS, "n1-a", '{"n": "three days ago"}')
        await store.add_audit(NOW - 10, "n2-b", '{"n": "just now"}')
        await store.add_audit(NOW - 20, "n1-c", '{"n": "a moment before"}')
        await store.add_audit(NOW - 91 * DAY_MS, "n1-d", '{"n": "past retention"}')
        await store.add_audit(NOW - 10, "n2-b", '{"n": "just now, written again"}')
        assert await store.audit(now_ms=NOW, limit=10) == [
            '{"n": "just now, written again"}',
            '{"n": "a moment before"}',
            '{"n": "three days ago"}',
        ]
        assert await store.audit(now_ms=NOW, limit=2) == [
            '{"n": "just now, written again"}',
            '{"n": "a moment before"}',
        ]
    async with open_store() as again:  # durable: another connection sees them
        assert len(await again.audit(now_ms=NOW, limit=10)) == 3
