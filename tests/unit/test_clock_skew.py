"""Invariant 4 and clock skew: the skew the design tolerates is stated (``max_skew_s``), a node
whose clock is off by more is detected and logged, and within the bound nothing is lost."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.unit.helpers import START_MS, FixedCoordinator, advance, owner_and_writer
from timeshard.clock import FakeClock
from timeshard.node import JobSpec, Node, clockcheck
from timeshard.node.dispatcher import DispatchConfig
from timeshard.store.sqlite import SqliteStore


class StoreWithClock(SqliteStore):
    def __init__(self, path: Path, reference: FakeClock, offset_ms: int) -> None:
        super().__init__(path, num_shards=4)
        self._reference = reference
        self.offset_ms = offset_ms

    async def clock_ms(self) -> int | None:
        return self._reference.now_ms() + self.offset_ms


class OffsetClock(FakeClock):
    """A machine whose wall clock is ``offset_ms`` off another's (same fake time source)."""

    def __init__(self, base: FakeClock, offset_ms: int) -> None:
        super().__init__(START_MS)
        self._base = base
        self._offset = offset_ms

    def now_ms(self) -> int:
        return self._base.now_ms() + self._offset

    def monotonic(self) -> float:
        return self._base.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self._base.sleep(seconds)


async def test_a_clock_beyond_the_bound_is_logged_and_one_within_it_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(START_MS)
    store = StoreWithClock(tmp_path / "s.db", clock, offset_ms=1_500)
    await store.open()
    try:
        with caplog.at_level(logging.WARNING, logger="timeshard.node.clockcheck"):
            reading = await clockcheck.check(store, clock, 2.0, "n1")
            assert reading is not None and reading.offset_ms == 1_500
            assert not caplog.records
            store.offset_ms = -2_500
            reading = await clockcheck.check(store, clock, 2.0, "n1")
            assert reading is not None and reading.beyond(2.0)
        [record] = caplog.records
        assert "off by 2500 ms" in record.getMessage() and "n1" in record.getMessage()
    finally:
        await store.close()


async def test_the_node_measures_its_offset_when_it_starts(tmp_path: Path) -> None:
    clock = FakeClock(START_MS)
    node = Node(
        store=StoreWithClock(tmp_path / "n.db", clock, offset_ms=-700),
        coordinator=FixedCoordinator(range(4)),
        clock=clock,
        node_id="n",
    )
    await node.start()
    try:
        from timeshard.testing.waits import wait_until

        await wait_until(lambda: node.clock_offset_ms is not None, what="a clock reading")
        assert node.clock_offset_ms == -700
    finally:
        await node.stop()


def test_the_config_refuses_a_reread_window_shorter_than_the_skew_it_must_cover() -> None:
    with pytest.raises(ValueError, match="reread_s"):
        DispatchConfig(reread_s=3.0, reland_after_s=1.0, max_skew_s=2.0, refresh_s=1.0)
    with pytest.raises(ValueError, match="settle_s"):
        DispatchConfig(
            settle_s=3.0, reland_after_s=1.0, max_skew_s=2.0, refresh_s=1.0, reread_s=5.0
        )


def test_the_config_refuses_a_lookahead_a_refresh_can_not_cover() -> None:
    """An entry a node writes due past what its last refresh read is not held (the next
    refresh reads it): with ``lookahead_s`` under ``refresh_s`` that refresh came after it was
    due (a node on a two-minute refresh ran its own due-now jobs up to two minutes late)."""
    with pytest.raises(ValueError, match="lookahead_s"):
        DispatchConfig(lookahead_s=5.0, refresh_s=120.0, reread_s=125.0, settle_s=125.0)
    with pytest.raises(ValueError, match="lookahead_s"):
        DispatchConfig(lookahead_s=1.0, refresh_s=1.0)
    DispatchConfig(lookahead_s=1.5, refresh_s=1.0)


async def test_a_writer_behind_by_the_whole_bound_loses_nothing(tmp_path: Path) -> None:
    """Node ``b``'s clock is 1.9 s behind the owner's (within max_skew_s = 2 s): its due-now
    jobs carry due times the owner has already read past; the re-read still finds them."""
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    writer = SqliteStore(db, num_shards=4)
    async with owner_and_writer(db, clock, writer, OffsetClock(clock, -1_900)) as (a, b):
        await advance(a, clock, 3)
        jobs = []
        for _ in range(6):
            job, _ = await b.jobs.schedule(
                JobSpec(job_type="t", payload=b"{}", run_at=b.clock.now_ms())
            )
            jobs.append(job.job_id)
            await advance(a, clock, 0.4, step=0.2)
        await advance(a, clock, 3)
        claimed = await a.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
        assert sorted(c.job.job_id for c in claimed) == sorted(jobs)
