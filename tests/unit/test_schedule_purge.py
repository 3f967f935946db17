"""A deleted schedule's history is kept for the ledger retention, so `schedules history` and
`why` still answer after the delete, then purged: the entry the delete wrote for that time comes
due and the row goes with its revisions. On the embedded store and the fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.unit.helpers import START_MS, advance
from timeshard.clock import FakeClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import NotFound
from timeshard.model import ChangeKind, Schedule
from timeshard.node import Node
from timeshard.store.base import Retention
from timeshard.store.sqlite import SqliteStore

KEEP_S = 600
"""The ledger retention of these tests (ten minutes: the dispatcher walks every minute of it)."""


def sched(cron: str = "* * * * *") -> Schedule:
    return Schedule(
        schedule_id="s1",
        shard=0,
        cron=cron,
        timezone="UTC",
        job_type="cron.t",
        payload=b"{}",
        next_fire=0,
        created_at=0,
    )


@asynccontextmanager
async def kept_for(tmp_path: Path) -> AsyncIterator[tuple[Node, FakeClock]]:
    clock = FakeClock(START_MS)
    store = SqliteStore(
        tmp_path / "p.db", num_shards=4, retention=Retention(ledger_s=KEEP_S), clock=clock
    )
    node = Node(store=store, coordinator=LocalCoordinator(), clock=clock, node_id="n")
    await node.start()
    try:
        yield node, clock
    finally:
        await node.stop()


async def test_a_deleted_schedule_answers_for_the_ledger_retention_then_is_purged(
    tmp_path: Path,
) -> None:
    async with kept_for(tmp_path) as (node, clock):
        await answers_then_purged(node, clock)


async def test_a_schedule_created_again_on_the_id_is_not_purged(tmp_path: Path) -> None:
    async with kept_for(tmp_path) as (node, clock):
        await created_again_stays(node, clock)


async def answers_then_purged(node: Node, clock: FakeClock) -> None:
    """(Also run on Cassandra: tests/integration/test_schedule_purge_cassandra.py.)"""
    await node.schedules.create(sched())
    await advance(node, clock, 120, step=5)  # two occurrences, with their ledger rows
    fired = START_MS + 60_000
    deleted_at = clock.now_ms()
    await node.schedules.delete("s1", actor="erin", reason="retired")
    why = await node.explain.occurrence("s1", fired)
    assert why.found and why.row is not None and why.row.job_id
    assert any("deleted at" in step and "erin" in step for step in why.steps)
    after = await node.explain.occurrence("s1", deleted_at + 60_000)
    assert "deleted before it was due" in after.steps[-1]
    await advance(node, clock, KEEP_S - 10, step=10)
    kinds = [(r.revision, r.change.kind) for r in await node.schedules.history("s1")]
    assert kinds == [(2, ChangeKind.DELETE), (1, ChangeKind.CREATE)]
    assert (await node.explain.occurrence("s1", fired)).found
    assert await node.store.purge_schedule("s1", deleted_before=deleted_at - 1) == deleted_at
    await advance(node, clock, 20, step=5)  # past the retention: the purge entry is due
    for call in (
        node.schedules.history("s1"),
        node.schedules.revision("s1", 1),
        node.explain.occurrence("s1", fired),
    ):
        with pytest.raises(NotFound):
            await call
    assert await node.store.purge_schedule("s1", deleted_before=clock.now_ms()) is None
    again = await node.schedules.create(sched())
    assert again.revision == 1  # a new id's history: the old one is gone


async def created_again_stays(node: Node, clock: FakeClock) -> None:
    await node.schedules.create(sched())
    await node.schedules.delete("s1")
    await advance(node, clock, 60, step=10)
    await node.schedules.create(sched(cron="0 * * * *"))
    await advance(node, clock, KEEP_S, step=10)  # the delete's purge entry came due
    assert (await node.schedules.get("s1")).cron == "0 * * * *"
    kinds = [r.change.kind for r in await node.schedules.history("s1")]
    assert kinds == [ChangeKind.CREATE, ChangeKind.DELETE, ChangeKind.CREATE]
