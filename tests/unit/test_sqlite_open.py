"""Opening the embedded store while other processes open or write the same file: servers started
together on one new file must all come up, never exit with ``database is
locked``."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from timeshard.errors import StoreUnavailable
from timeshard.store import sqlitedb
from timeshard.store.sqlite import SqliteStore

# One round of racing stores lost about 3 times in 100 before the fix; 150 rounds of 8 make a
# regression show (and take about three seconds).
ROUNDS = 150
RACERS = 8


async def test_stores_opening_one_new_file_at_once_all_open(tmp_path: Path) -> None:
    for i in range(ROUNDS):
        path = tmp_path / f"r{i}.db"
        stores = [SqliteStore(path, num_shards=16) for _ in range(RACERS)]
        results = await asyncio.gather(*(s.open() for s in stores), return_exceptions=True)
        try:
            failed = [r for r in results if isinstance(r, BaseException)]
            assert not failed, f"round {i}: {failed[0]!r}"
            # Every store works on the shared, migrated file.
            applied, _ = await stores[-1].acquire_shard(0, "n", 0, 0)
            assert applied
            assert (await stores[0].get_shard(0)).epoch == 1
        finally:
            await asyncio.gather(*(s.close() for s in stores))


OPEN_IN_CHILD = """
import asyncio, sys, time
from timeshard.store.sqlite import SqliteStore
async def main():
    store = SqliteStore(sys.argv[1], num_shards=16)
    while time.time() < float(sys.argv[2]):
        pass
    await store.open()
    await store.acquire_shard(int(sys.argv[3]), "p", 0, 0)
    await store.close()
asyncio.run(main())
"""


def test_processes_opening_one_new_file_at_once_all_open(tmp_path: Path) -> None:
    for i in range(2):
        path = tmp_path / f"p{i}.db"
        start_at = time.time() + 1.5  # after every child has imported timeshard
        children = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_IN_CHILD, str(path), str(start_at), str(shard)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for shard in range(4)
        ]
        for child in children:
            _, err = child.communicate(timeout=60)
            assert child.returncode == 0, err[-2000:]
        db = sqlite3.connect(path)
        try:
            assert db.execute("SELECT count(*) FROM shards").fetchone()[0] == 4
        finally:
            db.close()


def hold_write_lock(path: Path, seconds: float, held: threading.Event) -> threading.Thread:
    """Another connection takes the file's exclusive lock (as a process migrating or writing a
    long batch would) and keeps it for ``seconds``."""

    def run() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        db.execute("CREATE TABLE holder (x)")
        held.set()
        time.sleep(seconds)
        db.execute("COMMIT")
        db.close()

    thread = threading.Thread(target=run, name="lock-holder")
    thread.start()
    return thread


async def test_open_waits_past_the_busy_timeout_for_a_lock_to_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlitedb, "BUSY_TIMEOUT_S", 0.05)
    path = tmp_path / "held.db"
    held = threading.Event()
    holder = hold_write_lock(path, 0.6, held)
    held.wait(5)
    store = SqliteStore(path, num_shards=16, open_timeout=30)
    try:
        await store.open()  # the lock outlives several busy timeouts; open waits it out
        assert (await store.get_shard(3)).shard == 3
    finally:
        await store.close()
        holder.join()


async def test_open_gives_up_at_its_deadline_with_store_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlitedb, "BUSY_TIMEOUT_S", 0.05)
    path = tmp_path / "held.db"
    held = threading.Event()
    holder = hold_write_lock(path, 1.5, held)
    held.wait(5)
    store = SqliteStore(path, num_shards=16, open_timeout=0.3)
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.open()
    finally:
        holder.join()
    await store.open()  # a failed open can be tried again once the lock is gone
    await store.close()


async def test_a_database_from_before_results_gets_their_columns(tmp_path: Path) -> None:
    """A file whose jobs table predates results (no result columns), with a running job in
    it: opening it adds the columns; the job reads as having no result, and its completion
    stores one."""
    from tests.contract.helpers import claim, create, make_job

    path = tmp_path / "old.db"
    store = SqliteStore(path, num_shards=8)
    await store.open()
    [made] = await create(store, make_job("old-1"))
    [running] = await store.claim_jobs([claim(made.job)])
    await store.close()
    with sqlite3.connect(path) as db:  # back to the jobs table as it was before results
        db.execute("ALTER TABLE jobs DROP COLUMN result_encoding")
        db.execute("ALTER TABLE jobs DROP COLUMN result")
    store = SqliteStore(path, num_shards=8)
    await store.open()
    try:
        before = await store.get_job("old-1")
        assert before is not None and running.job is not None
        assert (before.result, before.result_encoding, before.fence) == (b"", "", running.job.fence)
        out = await store.complete_job(
            "old-1", before.fence, before.started_at + 5, result=b"[1]", result_encoding="json"
        )
        assert out.applied and await store.get_job("old-1") == out.job
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(jobs)")]
    assert columns[-2:] == ["result", "result_encoding"]


async def test_a_database_from_before_deadlines_gets_their_columns(tmp_path: Path) -> None:
    """A file whose tables predate deadlines, priorities and spreads: opening it adds the
    columns; old rows read as none and 0, new ones keep what they are given."""
    from dataclasses import replace

    from tests.contract.helpers import NOW, create, make_job
    from timeshard.model import Schedule
    from timeshard.store.base import schedule_entry

    path = tmp_path / "old.db"
    store = SqliteStore(path, num_shards=8)
    await store.open()
    await create(store, make_job("old-1"))
    s = Schedule(
        schedule_id="old-s",
        shard=0,
        cron="0 * * * *",
        timezone="UTC",
        job_type="t",
        next_fire=NOW,
        created_at=NOW,
    )
    await store.create_schedule(s, schedule_entry(s, NOW, NOW))
    await store.close()
    with sqlite3.connect(path) as db:  # back to the tables as they were before
        db.execute("ALTER TABLE jobs DROP COLUMN priority")
        db.execute("ALTER TABLE jobs DROP COLUMN deadline")
        db.execute("ALTER TABLE schedules DROP COLUMN spread_ms")
    store = SqliteStore(path, num_shards=8)
    await store.open()
    try:
        old = await store.get_job("old-1")
        assert old is not None and (old.deadline, old.priority) == (0, 0)
        got = await store.get_schedule("old-s")
        assert got is not None and got.spread_ms == 0
        await create(store, replace(make_job("new-1"), deadline=NOW + 7, priority=2))
        new = await store.get_job("new-1")
        assert new is not None and (new.deadline, new.priority) == (NOW + 7, 2)
    finally:
        await store.close()


async def test_a_database_with_the_old_state_index_gets_the_due_one(tmp_path: Path) -> None:
    """A file made with ``jobs_by_state (state, type, job_id)``, which no listing used: opening
    it drops that index and makes ``jobs_by_state_due``, which a listing of dead letters
    then finds its jobs by (the job in it is listed)."""
    from tests.contract.helpers import create, make_job
    from timeshard.model import JobState
    from timeshard.store.listing import JobQuery

    path = tmp_path / "old.db"
    store = SqliteStore(path, num_shards=8)
    await store.open()
    await create(store, make_job("old-1"))
    await store.close()
    with sqlite3.connect(path) as db:  # back to the index as it was
        db.execute("DROP INDEX jobs_by_state_due")
        db.execute("CREATE INDEX jobs_by_state ON jobs (state, type, job_id)")
    store = SqliteStore(path, num_shards=8)
    await store.open()
    try:
        found = await store.select_jobs(
            JobQuery(states=frozenset({JobState.SCHEDULED})), limit=10, after=None, count=True
        )
        assert [j.job_id for j in found.jobs] == ["old-1"] and found.total == 1
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        indexes = {row[1] for row in db.execute("PRAGMA index_list(jobs)")}
    assert "jobs_by_state_due" in indexes and "jobs_by_state" not in indexes


@pytest.mark.parametrize("order", ["due", "created", "id"])
def test_a_listing_by_state_reads_the_state_index_not_every_job(order: str) -> None:
    """The plan SQLite makes for a listing of some states (and its count) searches
    ``jobs_by_state_due``; one of every state is the only listing that scans the table
    (in due or created order) or walks the job ids (in id order)."""
    db = sqlite3.connect(":memory:")
    db.executescript(sqlitedb.Q["schema"])
    params = {
        "states": '["dead"]',
        "type": None,
        "due_from": None,
        "due_to": None,
        "key_prefix": None,
        "occurrences": None,
        "occurrences_end": None,
        "after_value": -1,
        "after_id": "",
        "limit": 10,
    }

    def plan(name: str) -> str:
        rows = db.execute(f"EXPLAIN QUERY PLAN {sqlitedb.Q[name]}", params).fetchall()
        return " | ".join(row[3] for row in rows)

    for name in (f"find_jobs_by_{order}_in_states", "count_jobs_in_states"):
        assert "USING INDEX jobs_by_state_due (state=?" in plan(name), plan(name)
    for states in ('["scheduled"]', None):  # the listings that read every job
        params["states"] = states
        for name in (f"find_jobs_by_{order}", "count_jobs"):
            assert "jobs_by_state_due" not in plan(name), plan(name)


async def test_a_listing_reads_the_state_index_only_for_states_that_hold_few_jobs(
    tmp_path: Path,
) -> None:
    """Of 40 jobs, 4 dead: a listing of the dead letters reads them from the index, one of the
    scheduled jobs (36) reads every job; both list exactly their jobs, in due order, counted."""
    from dataclasses import replace

    from tests.contract.helpers import NOW, create, make_job
    from timeshard.model import JobState
    from timeshard.store.listing import JobQuery
    from timeshard.store.sqlite import _few_jobs_in

    store = SqliteStore(tmp_path / "x.db", num_shards=8)
    await store.open()
    try:
        jobs = [replace(make_job(f"j{i:02d}"), run_at=NOW + 1000 - i) for i in range(40)]
        dead = {j.job_id for j in jobs[::10]}
        await create(
            store, *(replace(j, state=JobState.DEAD) if j.job_id in dead else j for j in jobs)
        )
        by_state = {
            state: await store.select_jobs(
                JobQuery(states=frozenset({state})), limit=100, after=None, count=True
            )
            for state in (JobState.DEAD, JobState.SCHEDULED)
        }
        reader = sqlite3.connect(tmp_path / "x.db")
        chosen = {s: _few_jobs_in(reader, f'["{s.value}"]') for s in by_state}
        reader.close()
    finally:
        await store.close()
    assert chosen == {JobState.DEAD: True, JobState.SCHEDULED: False}
    due_order = [j.job_id for j in sorted(jobs, key=lambda j: (j.run_at, j.job_id))]
    for state, found in by_state.items():
        want = [i for i in due_order if (i in dead) == (state is JobState.DEAD)]
        assert [j.job_id for j in found.jobs] == want and found.total == len(want)
