"""The Cassandra store against real Cassandra: contention between separate clients, a node that
crashes and comes back, and what only Cassandra has (migrations, table options, URL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.contract.helpers import NOW, NUM_SHARDS, claim, create, entries_of, make_job
from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.model import BucketEntry, JobState
from timeshard.sharding import minute_of, shard_of
from timeshard.stack import CassandraProcess
from timeshard.store.base import Retention, Store
from timeshard.store.cassandra import CassandraStore, bucket_ttl, parse_url
from timeshard.testing.services import free_port
from timeshard.testing.waits import wait_until

pytestmark = pytest.mark.timeout(300)


def url(address: str, keyspace: str) -> str:
    return f"cassandra://{address}/{keyspace}"


async def test_sixteen_claimers_on_one_job_have_exactly_one_winner(
    cassandra_address: str, keyspace: str
) -> None:
    # Sixteen separate clients (as on sixteen nodes), opened together: the migration runs once.
    stores = [
        CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=8) for _ in range(16)
    ]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        jobs = [make_job(f"contended-{i}") for i in range(5)]
        await create(stores[0], *jobs)
        for job in jobs:
            outs = await asyncio.gather(
                *(s.claim_jobs([claim(job, worker=f"worker-{i}")]) for i, s in enumerate(stores))
            )
            winners = [(i, o) for i, [o] in enumerate(outs) if o.applied]
            assert len(winners) == 1, f"{job.job_id}: {len(winners)} claims applied"
            i, won = winners[0]
            stored = await stores[0].get_job(job.job_id)
            assert stored is not None and stored == won.job
            assert (stored.lease_owner, stored.fence, stored.attempt) == (f"worker-{i}", 1, 1)
            assert len(stored.history) == 1
            for [o] in outs:  # every loser saw the winner's row
                assert o.job is not None and o.job.lease_owner == f"worker-{i}"
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_migrations_are_recorded_once(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    for _ in range(2):
        store = CassandraStore.from_url(url(cassandra_address, keyspace))
        await store.open()
        await store.close()
    rows = list(cassandra_admin.execute(f"SELECT * FROM {keyspace}.schema_migrations"))
    assert sorted((r.version, r.done) for r in rows) == [
        (1, True),
        (2, True),
        (3, True),
        (4, True),
        (5, True),
        (6, True),
        (7, True),
        (8, True),
        (9, True),
        (10, True),
    ]
    table = cassandra_admin.execute(
        "SELECT compaction, default_time_to_live FROM system_schema.tables "
        "WHERE keyspace_name = %s AND table_name = 'buckets'",
        (keyspace,),
    ).one()
    assert table.compaction["class"].endswith("TimeWindowCompactionStrategy")
    assert table.default_time_to_live == 7 * 24 * 3600
    replication = cassandra_admin.execute(
        "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)
    ).one()
    assert replication.replication["replication_factor"] == "1"


async def test_a_store_at_an_older_version_gets_the_newer_migrations(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    store = CassandraStore.from_url(url(cassandra_address, keyspace))
    await store.open()
    await store.close()
    # Back to version 1: as a keyspace made before schedules existed.
    cassandra_admin.execute(f"DROP TABLE {keyspace}.schedules")
    cassandra_admin.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = 2")
    # (and before migrations 5, 8 and 9, which add columns to it)
    cassandra_admin.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = 5")
    cassandra_admin.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = 8")
    cassandra_admin.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = 9")
    store = CassandraStore.from_url(url(cassandra_address, keyspace))
    await store.open()
    try:
        assert await store.get_schedule("nightly") is None  # the table is back
    finally:
        await store.close()
    rows = cassandra_admin.execute(f"SELECT version, done FROM {keyspace}.schema_migrations")
    assert sorted((r.version, r.done) for r in rows) == [
        (1, True),
        (2, True),
        (3, True),
        (4, True),
        (5, True),
        (6, True),
        (7, True),
        (8, True),
        (9, True),
        (10, True),
    ]


async def test_a_keyspace_from_before_results_gets_their_columns(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    """Migration 4 on a keyspace at version 3 with a running job in it: the job reads as
    having no result, and its completion stores one."""
    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=NUM_SHARDS)
    await store.open()
    try:
        [made] = await create(store, make_job("old-1"))
        [out] = await store.claim_jobs([claim(made.job)])
        assert made.created and out.applied and out.job is not None
    finally:
        await store.close()
    cassandra_admin.execute(f"ALTER TABLE {keyspace}.job_rows DROP (result, result_encoding)")
    cassandra_admin.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = 4")
    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=NUM_SHARDS)
    await store.open()
    try:
        running = await store.get_job("old-1")
        assert running is not None and (running.result, running.result_encoding) == (b"", "")
        done = await store.complete_job(
            "old-1", running.fence, NOW + 5, result=b'"ok"', result_encoding="json"
        )
        assert done.applied and (await store.get_job("old-1")) == done.job
        assert done.job is not None and done.job.result == b'"ok"'
    finally:
        await store.close()
    rows = cassandra_admin.execute(f"SELECT version, done FROM {keyspace}.schema_migrations")
    assert (4, True) in {(r.version, r.done) for r in rows}


async def test_a_keyspace_from_before_deadlines_gets_their_columns(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    """Migration 5 on a keyspace at version 4 with a job and a schedule in it: they read as
    having no deadline, priority 0 and no spread, and a job made after has its deadline."""
    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=NUM_SHARDS)
    await store.open()
    try:
        [made] = await create(store, make_job("old-5"))
        assert made.created
    finally:
        await store.close()
    cassandra_admin.execute(f"ALTER TABLE {keyspace}.job_rows DROP (deadline, priority)")
    cassandra_admin.execute(f"ALTER TABLE {keyspace}.schedules DROP spread_ms")
    cassandra_admin.execute(
        f"INSERT INTO {keyspace}.schedules (schedule_id, shard, cron, timezone, dst_gap, "
        "dst_fold, type, payload, max_attempts, misfire, misfire_grace_ms, max_catchup, "
        "overlap, max_concurrent, jitter_ms, paused, next_fire, created_at, version, active, "
        "queued_at, skipped, last_skip_at, last_fire_at) VALUES ('old-s', 0, '0 * * * *', "
        "'UTC', '', '', 't', 0x, 0, 'once', 60000, 10, 'skip', 1, 0, false, 0, 0, 0, '[]', "
        "0, 0, 0, 0)"
    )
    cassandra_admin.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = 5")
    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=NUM_SHARDS)
    await store.open()
    try:
        old = await store.get_job("old-5")
        assert old is not None and (old.deadline, old.priority) == (0, 0)
        schedule = await store.get_schedule("old-s")
        assert schedule is not None and schedule.spread_ms == 0
        [new] = await create(store, replace(make_job("new-5"), deadline=NOW + 9, priority=3))
        got = await store.get_job("new-5")
        assert new.created and got is not None and (got.deadline, got.priority) == (NOW + 9, 3)
    finally:
        await store.close()
    rows = cassandra_admin.execute(f"SELECT version, done FROM {keyspace}.schema_migrations")
    assert (5, True) in {(r.version, r.done) for r in rows}


async def test_a_keyspace_from_before_the_dead_letter_index_gets_its_dead_jobs_in_it(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    """Migration 6 on a keyspace at version 5 with a dead job, a live one and a succeeded one
    in it: the dead one (only) is counted, with what was left of its time to live."""
    retention = Retention(finished_s=3600, dead_s=7200)
    store = CassandraStore.from_url(
        url(cassandra_address, keyspace), num_shards=NUM_SHARDS, retention=retention
    )
    await store.open()
    try:
        made = await create(store, make_job("old-dead"), make_job("old-ok"), make_job("old-live"))
        outs = await store.claim_jobs([claim(m.job) for m in made[:2]])
        dead_job, ok_job = (o.job for o in outs)
        assert dead_job is not None and ok_job is not None
        assert (await store.fail_job("old-dead", dead_job.fence, NOW + 5, "no", None)).applied
        assert (await store.complete_job("old-ok", ok_job.fence, NOW + 5)).applied
    finally:
        await store.close()
    cassandra_admin.execute(f"DROP TABLE {keyspace}.dead_letters")
    cassandra_admin.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = 6")
    store = CassandraStore.from_url(
        url(cassandra_address, keyspace), num_shards=NUM_SHARDS, retention=retention
    )
    await store.open()
    try:
        count, latest = await store.dead_letters(limit=100, latest=5)
        assert count == 1 and [j.job_id for j in latest] == ["old-dead"]
    finally:
        await store.close()
    ttl = cassandra_admin.execute(f"SELECT TTL(finished_at) AS ttl FROM {keyspace}.dead_letters")
    assert 7000 < ttl.one().ttl <= 7200
    rows = cassandra_admin.execute(f"SELECT version, done FROM {keyspace}.schema_migrations")
    assert (6, True) in {(r.version, r.done) for r in rows}


async def test_the_dead_letter_count_reads_the_dead_jobs_not_every_job(
    cassandra_address: str, keyspace: str
) -> None:
    """Counting the queue reads its index only: at a million stored jobs a scan of every job
    cost the node most of a core at every count."""
    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=NUM_SHARDS)
    await store.open()
    try:
        made = await create(store, *(make_job(f"many-{i}") for i in range(20)))
        [out] = await store.claim_jobs([claim(made[0].job)])
        assert out.job is not None
        assert (await store.fail_job("many-0", out.job.fence, NOW + 5, "no", None)).applied
        before = dict(store.stats.operations)
        count, latest = await store.dead_letters(limit=100, latest=5)
        assert count == 1 and [j.job_id for j in latest] == ["many-0"]
        read = {k: n - before.get(k, 0) for k, n in store.stats.operations.items()}
        assert read.get("scan_dead") == 1 and not read.get("scan_listing"), read
    finally:
        await store.close()


async def test_a_key_left_without_its_job_is_completed_by_the_repeat(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=8)
    await store.open()
    try:
        body = make_job("whatever", key="pay-42")
        # As if a client crashed after writing the key, before the job row.
        cassandra_admin.execute(
            f"INSERT INTO {keyspace}.idempotency_keys (key, job_id, digest) VALUES (%s, %s, %s)",
            ("pay-42", "first-try", body.body_digest()),
        )
        [result] = await create(store, make_job("second-try", key="pay-42"))
        assert result.created and result.job.job_id == "first-try"
        assert result.job.shard == shard_of("first-try", 8)
        assert await store.get_job("second-try") is None
        assert [e.job_id for e in await entries_of(store, result.job, result.job.run_at)] == [
            "first-try"
        ]
        cassandra_admin.execute(
            f"INSERT INTO {keyspace}.idempotency_keys (key, job_id, digest) VALUES (%s, %s, %s)",
            ("pay-43", "lost", "another-digest"),
        )
        with pytest.raises(InvalidArgument, match="idempotency_key"):
            await create(store, make_job("third", key="pay-43"))
    finally:
        await store.close()


async def test_a_read_longer_than_a_driver_page_returns_every_row(
    cassandra_address: str, keyspace: str
) -> None:
    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=8)
    await store.open()
    try:
        entries = [
            BucketEntry(shard=1, minute=minute_of(NOW), due_at=NOW + i % 60_000, job_id=f"p{i}")
            for i in range(7_000)  # the driver fetches 5000 rows a page
        ]
        await store.add_entries(entries)
        page = await store.read_bucket(1, minute_of(NOW), due_from=0, due_to=2**62, limit=10_000)
        assert page == sorted(entries, key=lambda e: (e.due_at, e.job_id))
    finally:
        await store.close()


async def test_no_cassandra_is_store_unavailable() -> None:
    store = CassandraStore.from_url(f"cassandra://127.0.0.1:{free_port()}/nothing_here")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="NoHostAvailable"):
        await store.open()
    assert time.monotonic() - started < 30
    with pytest.raises(StoreUnavailable):
        await store.get_job("x")


def test_urls_are_parsed_and_checked() -> None:
    cfg = parse_url("cassandra://u:p%40ss@10.0.0.1:9142,10.0.0.2/ks_1?dc=dc1:3,dc2:2&serial=serial")
    assert cfg.contact_points == (("10.0.0.1", 9142), ("10.0.0.2", 9042))
    assert cfg.keyspace == "ks_1" and (cfg.username, cfg.password) == ("u", "p@ss")
    assert cfg.replication == {"class": "NetworkTopologyStrategy", "dc1": 3, "dc2": 2}
    assert cfg.serial_consistency == "serial" and cfg.consistency == "local_quorum"
    assert parse_url("cassandra://h/ks?rf=3").replication == {
        "class": "SimpleStrategy",
        "replication_factor": 3,
    }
    for bad in ("cassandra://h:port/ks", "cassandra://h:9042", "sqlite:///x", "cassandra://h/k-s"):
        with pytest.raises(InvalidArgument):
            CassandraStore.from_url(bad)


def test_bucket_entries_live_a_week_past_their_due_time() -> None:
    assert bucket_ttl(NOW + 3_600_000, NOW) == 3600 + 7 * 24 * 3600
    assert bucket_ttl(NOW - 3_600_000, NOW) == 7 * 24 * 3600  # late: a week from now
    assert bucket_ttl(NOW + 30 * 365 * 86_400_000, NOW) == 0  # past Cassandra's limit: forever


# -- a node that crashes and comes back ----------------------------------------------------------


async def _wait_available(store: Store, timeout: float) -> float:
    """Seconds until the store answers again."""
    started = time.monotonic()

    async def answers() -> bool:
        try:
            await store.get_shard(0)
        except StoreUnavailable:
            return False
        return True

    await wait_until(answers, timeout, "the store to answer again", every=0.5)
    return time.monotonic() - started


@pytest.mark.timeout(600)
async def test_a_killed_node_is_unavailable_then_loses_nothing(
    own_node: CassandraProcess,
) -> None:
    store = CassandraStore.from_url(url(own_node.address, "crash"), num_shards=8)
    await store.open()
    try:
        jobs = [make_job(f"before-{i:03d}", run_at=NOW + i * 1000) for i in range(60)]
        assert all(r.created for r in await create(store, *jobs))
        claimed = await store.claim_jobs([claim(j, worker="w") for j in jobs[:20]])
        assert all(o.applied for o in claimed)
        for out in claimed[:10]:
            assert out.job is not None
            assert (await store.complete_job(out.job.job_id, out.job.fence, NOW + 5)).applied
        ok, shard = await store.acquire_shard(3, "node-a", 0, 100)
        assert ok
        acknowledged = await store.get_jobs([j.job_id for j in jobs])

        own_node.kill()  # SIGKILL: no flush, no goodbye
        started = time.monotonic()
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: create(store, make_job("during")),
            lambda: store.get_job("before-000"),
            lambda: store.claim_jobs([claim(jobs[30], worker="w2")]),
            lambda: store.complete_job("before-010", 1, NOW),
            lambda: store.read_bucket(0, 0, due_from=0, due_to=1),
            lambda: store.acquire_shard(3, "node-b", 1, 0),
            lambda: store.save_cursor(3, 1, 200),
        ]
        for attempt in attempts:
            with pytest.raises(StoreUnavailable):
                await attempt()
        assert time.monotonic() - started < 120, "unavailability must be reported, not hang"

        own_node.start(timeout=240)
        waited = await _wait_available(store, timeout=120)
        assert waited < 120

        after = await store.get_jobs([j.job_id for j in jobs])
        assert after == acknowledged  # every acknowledged write survived, nothing else changed
        for job in jobs:
            assert await entries_of(store, job, job.run_at), f"{job.job_id} lost its entry"
        assert await store.get_shard(3) == shard
        # And it carries on: the rest are claimed and completed, new jobs are taken.
        rest = [j for j in after.values() if j.state is JobState.SCHEDULED]
        for out in await store.claim_jobs([claim(j, worker="w3") for j in rest]):
            assert out.applied and out.job is not None
            assert (await store.complete_job(out.job.job_id, out.job.fence, NOW + 9)).applied
        [new] = await create(store, make_job("after"))
        assert new.created
    finally:
        await store.close()


async def test_statements_bound_for_a_batch_carry_what_the_driver_would_bind(
    cassandra_address: str, keyspace: str
) -> None:
    """The batches bind their rows without the driver's ``bind`` (a third of its CPU): each
    value must be serialized as it would, by name or by position, None as null."""
    from timeshard.store.cassandra.driver import _bound

    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=NUM_SHARDS)
    await store.open()
    try:
        prepared = store._conn._prepared
        samples: dict[str, Any] = {
            "update_state": {
                "state": "running",
                "run_at": NOW,
                "attempt": 1,
                "fence": 2,
                "lease_owner": "wörker",
                "lease_until": NOW + 30_000,
                "started_at": NOW,
                "finished_at": None,
                "last_error": "",
                "history": "[]",
                "shard": 3,
                "minute": 29_000_000,
                "job_id": "j-1",
                "was_state": "scheduled",
                "was_fence": 1,
                "was_run_at": NOW,
                "was_lease_until": 0,
                "was_attempt": 0,
            },
            "insert_dead_at": (3, "j-1", NOW, 3600, NOW * 1000),
            "delete_dead_at": (NOW * 1000, 3, "j-1"),
            "insert_entry": (3, 29_000_000, NOW, "j-1", 29_000_000, 600),
        }
        for name, params in samples.items():
            stmt = prepared[name]
            assert _bound(stmt, params).values == stmt.bind(params).values, name
        with pytest.raises(TypeError):
            _bound(prepared["insert_dead_at"], (3, "j-1", "not a number", 3600, 0))
    finally:
        await store.close()


async def test_a_request_leaves_no_garbage_for_the_collector(
    cassandra_address: str, keyspace: str
) -> None:
    """Each request's objects go when it is answered, not at a garbage collection: the
    driver's timeout timer and our callbacks made cycles that kept every request (a batch's
    bound values with it) alive until one, and after a million jobs loaded a single
    collection took 1.5 s of the node's loop."""
    import gc

    store = CassandraStore.from_url(url(cassandra_address, keyspace), num_shards=NUM_SHARDS)
    await store.open()
    try:
        await create(store, make_job("warm-up"))
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            made = await create(store, *(make_job(f"gc-{i}") for i in range(50)))
            [out] = await store.claim_jobs([claim(made[0].job)])
            assert out.applied and out.job is not None
            assert (await store.complete_job("gc-0", out.job.fence, NOW + 5)).applied
            await store.get_jobs([f"gc-{i}" for i in range(50)])
            await store.list_jobs(state=None, job_type=None, limit=10, page_token="")
            gc.collect()
            kinds = sorted({type(o).__name__ for o in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert "ResponseFuture" not in kinds and "BatchStatement" not in kinds, kinds
    finally:
        await store.close()
