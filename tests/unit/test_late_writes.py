"""Invariant 4 with two nodes: an entry written by a node that does not own the shard, due
before what the owner has already read, must still be found.

Two nodes share one SQLite file. The owner ``a`` owns every shard and re-reads like a node of a
cluster (it is not the only writer); ``b`` owns none. ``b``'s store is slow: its write lands
after ``a`` has read past the entry's due time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.unit.helpers import START_MS, advance, all_entries, owner_and_writer, settle
from tests.unit.test_schedules import drain, occ, occurrences, sched
from timeshard.clock import FakeClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import BucketEntry, Job, JobState
from timeshard.node import JobSpec, Node
from timeshard.node.schedules import FireResult, ScheduleFirer
from timeshard.sharding import MINUTE_MS, minute_of
from timeshard.store.base import CreateResult
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until


class SlowStore(SqliteStore):
    """Creates land ``delay_s`` (fake seconds) after the call began, and entries written on
    their own ``entries_delay_s`` after it."""

    def __init__(
        self, path: Path, clock: FakeClock, delay_s: float, entries_delay_s: float = 0.0
    ) -> None:
        super().__init__(path, num_shards=4)
        self._clock = clock
        self.delay_s = delay_s
        self.entries_delay_s = entries_delay_s

    async def create_jobs(
        self, jobs: Sequence[tuple[Job, BucketEntry]], *, fresh: Collection[str] = frozenset()
    ) -> list[CreateResult]:
        await self._clock.sleep(self.delay_s)
        return await super().create_jobs(jobs, fresh=fresh)

    async def add_entries(self, entries: Sequence[BucketEntry]) -> None:
        if self.entries_delay_s:
            await self._clock.sleep(self.entries_delay_s)
        await super().add_entries(entries)


@asynccontextmanager
async def slow_writer(
    tmp_path: Path, delay_s: float, entries_delay_s: float = 0.0
) -> AsyncIterator[tuple[Node, Node]]:
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    store = SlowStore(db, clock, delay_s, entries_delay_s)
    async with owner_and_writer(db, clock, store) as nodes:
        yield nodes


async def _schedule_slowly(a: Node, b: Node, clock: FakeClock, delay_s: float) -> Job:
    """``b`` schedules a job due now; its write lands ``delay_s`` later, while ``a`` reads."""
    await advance(a, clock, 3)  # a has read ahead to now + lookahead
    task = asyncio.create_task(
        b.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms()))
    )
    await settle(a)
    await advance(a, clock, delay_s + 0.1, step=0.25)  # the write lands in here
    await wait_until(task.done, what="the slow schedule to return")
    job, created = task.result()
    assert created
    return job


async def test_a_late_entry_from_another_node_is_read_again(tmp_path: Path) -> None:
    """Landed 2 s after its due time: the owner's re-read of the last ``reread_s`` finds it
    (before the fix the re-read began where the previous refresh began, after its time)."""
    async with slow_writer(tmp_path, delay_s=2.0) as (a, b):
        clock = a.clock
        assert isinstance(clock, FakeClock)
        job = await _schedule_slowly(a, b, clock, 2.0)
        await advance(a, clock, 2)
        claimed = await a.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]
        assert claimed[0].job.started_at >= job.run_at


async def test_an_entry_that_landed_very_late_is_written_again_due_now(tmp_path: Path) -> None:
    """Landed 20 s after its due time, beyond any re-read window: the writer writes the entry
    again, due now, and the owner finds that one."""
    async with slow_writer(tmp_path, delay_s=20.0) as (a, b):
        clock = a.clock
        assert isinstance(clock, FakeClock)
        job = await _schedule_slowly(a, b, clock, 20.0)
        await advance(a, clock, 3)
        claimed = await a.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [job.job_id]


async def _advance_until_done(a: Node, clock: FakeClock, task: asyncio.Future[Any]) -> None:
    for _ in range(400):
        if task.done():
            return
        await advance(a, clock, 0.25, step=0.25)
    raise AssertionError("the call did not return within 100 fake seconds")


async def test_a_create_is_acknowledged_only_once_its_late_entry_is_written_again(
    tmp_path: Path,
) -> None:
    """The write again of an entry that landed late is part of the create: the reply waits
    for it. Before the fix it was spawned and forgotten, so a node that died right after the
    reply left an acknowledged job whose only entry was behind what the owner reads."""
    async with slow_writer(tmp_path, delay_s=20.0, entries_delay_s=0.5) as (a, b):
        clock = a.clock
        assert isinstance(clock, FakeClock)
        await advance(a, clock, 3)  # a has read ahead to now + lookahead
        landed_by = clock.now_ms() + 20_000
        task = asyncio.create_task(
            b.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms()))
        )
        await _advance_until_done(a, clock, task)
        job, created = task.result()
        assert created
        written = [e.due_at for e in await all_entries(a, job)]
        assert max(written) >= landed_by, f"at the reply: entries due at {written}"


async def test_a_fire_cut_off_after_making_its_occurrence_still_runs_it(tmp_path: Path) -> None:
    """A fire made its occurrence (its write landed late) and died before writing the entry
    again or moving the schedule on. The next fire of the schedule finds the occurrence made;
    its entry is behind what the owner reads, so that fire writes one again, due now. Before
    the fix it saw "made already" and moved the schedule on: the run never happened."""

    async def crash(entries: Sequence[BucketEntry], *, again: Sequence[BucketEntry] = ()) -> None:
        raise RuntimeError("the node died here")

    async with slow_writer(tmp_path, delay_s=20.0) as (a, b):
        clock = a.clock
        assert isinstance(clock, FakeClock)
        s = await a.schedules.create(sched())
        await a.schedules.pause("s1")
        await advance(a, clock, 60.5)  # a's dispatcher saw its entry come due while paused
        paused = await a.schedules.get("s1")
        await a.store.update_schedule(paused.with_(paused=False), paused.version, None)
        cut_off = asyncio.ensure_future(
            ScheduleFirer(b.store, clock, 3, land=crash).fire("s1", s.next_fire)
        )
        await _advance_until_done(a, clock, cut_off)
        assert isinstance(cut_off.exception(), RuntimeError)
        assert await occurrences(a) == {occ(1): JobState.SCHEDULED}
        await advance(a, clock, 5)
        assert await drain(a) == []  # its entry landed where a no longer reads
        again = ScheduleFirer(a.store, clock, 3, land=a._land)  # the shard's next owner
        assert await again.fire("s1", s.next_fire) is FireResult.HANDLED
        assert (await a.schedules.get("s1")).next_fire == START_MS + 2 * MINUTE_MS
        await advance(a, clock, 1)
        assert await drain(a) == [occ(1)]


async def test_an_entry_whose_writer_died_before_writing_it_again_is_found_before_the_cursor_passes(
    tmp_path: Path,
) -> None:
    """Landed 20 s late, behind every re-read window, and its writer never wrote it again (it
    died: here its second write never ends, and the create was never acknowledged). The owner
    reads the cursor's minute whole once more before passing it, and finds the job there.
    Before, the job stayed scheduled for ever."""
    async with slow_writer(tmp_path, delay_s=20.0, entries_delay_s=10_000) as (a, b):
        clock = a.clock
        assert isinstance(clock, FakeClock)
        await advance(a, clock, 3)
        task = asyncio.create_task(
            b.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms()))
        )
        try:
            await advance(a, clock, 25, step=0.25)  # landed at 23 s; its second write hangs
            assert not task.done()
            assert (
                await a.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5) == []
            )
            await advance(a, clock, 45, step=0.5)  # minute 0 ended at 60 s, settled at 65 s
            claimed = await a.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
            assert len(claimed) == 1 and claimed[0].job.run_at == START_MS + 3000
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@asynccontextmanager
async def slow_embedded(tmp_path: Path, delay_s: float) -> AsyncIterator[tuple[Node, SlowStore]]:
    """One node on the embedded coordinator (the only writer), its creates landing late."""
    clock = FakeClock(START_MS)
    store = SlowStore(tmp_path / "one.db", clock, delay_s)
    node = Node(store=store, coordinator=LocalCoordinator(), clock=clock, node_id="only")
    await node.start()
    try:
        yield node, store
    finally:
        await node.stop()


async def test_the_only_writer_writes_a_slow_entry_again_only_when_it_is_behind_its_cursor(
    tmp_path: Path,
) -> None:
    """On the embedded coordinator the node is the only writer, so "late" is exact: behind its
    own dispatcher's cursor. A create that lands 5 s late, in a minute the cursor has not
    passed, is written once (before, every write slower than ``reland_after_s`` was written
    again, and on an overloaded machine each create cost up to four writes); one that lands
    after the cursor passed its minute is written again, and runs."""
    async with slow_embedded(tmp_path, delay_s=5.0) as (node, store):
        clock = node.clock
        assert isinstance(clock, FakeClock)
        await advance(node, clock, 3)
        task = asyncio.create_task(
            node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms()))
        )
        await _advance_until_done(node, clock, task)
        job, created = task.result()
        assert created
        written = [e.due_at for e in await all_entries(node, job)]
        assert len(written) == 1 and written[0] < job.run_at + 1000, f"entries due at {written}"
        claimed = await node.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=600)
        assert [c.job.job_id for c in claimed] == [job.job_id]

        store.delay_s = 90.0  # lands in the second minute from now, the cursor past its own
        task = asyncio.create_task(
            node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=clock.now_ms()))
        )
        await _advance_until_done(node, clock, task)
        late, created = task.result()
        assert created
        cursor = (await node.store.get_shard(late.shard)).cursor
        assert cursor > minute_of(late.run_at), "the cursor did not pass the entry's minute"
        assert [e for e in await all_entries(node, late) if e.minute >= cursor], (
            "no entry of the job where a restarted node reads"
        )
        await advance(node, clock, 1)
        claimed = await node.claims.claim(worker="w", types=["t"], limit=10, wait_s=0, lease_s=5)
        assert [c.job.job_id for c in claimed] == [late.job_id]


class GatedCursorStore(SqliteStore):
    """``save_cursor`` waits for ``gate`` once ``hold`` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, num_shards=4)
        self.hold = False
        self.saving = asyncio.Event()
        self.gate = asyncio.Event()
        self.saving_shard = -1

    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        if self.hold:
            self.saving_shard = shard
            self.saving.set()
            await self.gate.wait()
        return await super().save_cursor(shard, epoch, cursor)


async def test_an_entry_notified_while_the_cursor_is_saved_past_its_minute_counts_as_late(
    tmp_path: Path,
) -> None:
    """The cursor's save is in flight: an entry of a minute it is moving past is not taken by
    the dispatcher (a restart reads from the saved cursor) and the only writer writes it
    again. Taken, it would have been held in memory only."""
    clock = FakeClock(START_MS)
    store = GatedCursorStore(tmp_path / "one.db")
    node = Node(store=store, coordinator=LocalCoordinator(), clock=clock, node_id="only")
    await node.start()
    try:
        await advance(node, clock, 3)
        store.hold = True
        task = asyncio.create_task(advance(node, clock, 70))  # minute 0 ends, is passed
        await asyncio.wait_for(store.saving.wait(), 10)
        d = node.dispatchers[store.saving_shard]
        e = BucketEntry(shard=d.shard, minute=d.cursor, due_at=START_MS + 30_000, job_id="j")
        assert node._notify([e]) == [e]
        store.gate.set()
        await task
        assert d.cursor > e.minute
    finally:
        store.gate.set()
        await node.stop()
