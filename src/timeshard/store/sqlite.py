"""The embedded store: stdlib sqlite3 in WAL mode, the same contract as Cassandra, no server.

Each operation is a function of the connection run by the database's writer thread
(``sqlitedb.Database``), which commits every call waiting when it wakes in one transaction:
group commit, so a burst of schedules or claims costs one fsync, not one each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from timeshard.clock import Clock, SystemClock
from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.ledger import LedgerRow
from timeshard.limits import DEFAULT_MAX_UNSTARTED, REVISIONS_KEPT
from timeshard.model import (
    BucketEntry,
    Change,
    ChangeKind,
    Job,
    JobState,
    Schedule,
    ScheduleRevision,
    ShardState,
    WriteResult,
    validate_result,
)
from timeshard.sharding import DEFAULT_NUM_SHARDS, shard_of, validate_num_shards
from timeshard.store import sqliteschedules as S
from timeshard.store import transitions as T
from timeshard.store.base import (
    Completion,
    CreateResult,
    JobClaim,
    MaxUnstarted,
    Retention,
    RetryAt,
    Store,
    entry_for,
)
from timeshard.store.codec import job_columns, job_from_row
from timeshard.store.listing import JobQuery, JobSlice
from timeshard.store.meta import (
    TYPE_POLICY_PREFIX,
    type_policies_of,
    type_setting_key,
    type_settings_of,
)
from timeshard.store.sqlitedb import OPEN_TIMEOUT_S, Database, Q, WriterConnection
from timeshard.store.stats import StoreStats

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 10.0
SWEEP_ROWS = 5000
#: ``get_jobs`` of at most this many ids reads on the event loop through a reader connection
#: (WAL: a reader sees the last commit and never waits for the writer), not through the writer
#: queue, where the dispatcher's read of a due job waited behind a commit's fsync. Larger reads
#: go to the writer thread, so a burst does not hold up the event loop.
INLINE_READ_MAX = 64
#: A listing of some states reads them through their index when they hold at most this share
#: of the jobs stored (``_few_jobs_in``), and reads every job otherwise.
STATE_INDEX_SHARE = 0.25


_FINISHED = (JobState.SUCCEEDED.value, JobState.CANCELLED.value, JobState.EXPIRED.value)
"""Finished states kept for ``Retention.finished_s`` (dead letters have their own)."""


def _select(db: sqlite3.Connection, job_id: str) -> Job | None:
    row = db.execute(Q["select_job"], (job_id,)).fetchone()
    return job_from_row(row) if row is not None else None


def _stored_num_shards(db: sqlite3.Connection) -> int:
    return int(db.execute(Q["select_meta"], ("num_shards",)).fetchone()[0])


def _put_entry(db: sqlite3.Connection, e: BucketEntry) -> None:
    db.execute(Q["insert_entry"], (e.shard, e.minute, e.due_at, e.job_id))


def _apply(db: WriterConnection, job_id: str, t: T.Transition) -> WriteResult:
    """Read the row (the job as this connection last wrote it, when it keeps it: ``KeptJobs``),
    and if the transition's condition holds write the changed row and the entry it needs —
    atomic because the writer thread is the only one."""
    found = db.kept_jobs.get(job_id) or _select(db, job_id)
    if found is None or not t.condition(found):
        return WriteResult(applied=False, job=found)
    new = t.change(found)
    db.execute(Q["update_job"], job_columns(new))
    db.kept_jobs.put(new)
    at = t.entry_at(new)
    if at is not None:
        _put_entry(db, entry_for(new, at, t.now))
    return WriteResult(applied=True, job=new)


def _few_jobs_in(db: sqlite3.Connection, states: str | None) -> bool:
    """Whether a listing of ``states`` (a JSON array) reads them from ``jobs_by_state_due``:
    when they hold at most ``STATE_INDEX_SHARE`` of the jobs (their index entries counted, as
    far as that share). Otherwise a read of every job in table order is the faster (each job
    the index finds is one more step into the table: 1.7x slower than the scan when a state
    holds all jobs)."""
    if states is None:
        return False
    few = int(STATE_INDEX_SHARE * db.execute(Q["rowid_span"]).fetchone()[0])
    return bool(db.execute(Q["count_in_states"], (states, few + 1)).fetchone()[0] <= few)


class SqliteStore(Store):
    def __init__(
        self,
        path: str | Path,
        *,
        num_shards: int = DEFAULT_NUM_SHARDS,
        synchronous: str = "FULL",
        open_timeout: float = OPEN_TIMEOUT_S,
        retention: Retention | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.path = str(path)
        self.retention = retention or Retention()
        self._clock: Clock = clock or SystemClock()
        self._sweeper: asyncio.Task[None] | None = None
        self._sweep_after = 0
        self.num_shards = validate_num_shards(num_shards)
        self.stats = StoreStats()
        self._db = Database(
            self.path, synchronous=synchronous, open_timeout=open_timeout, stats=self.stats
        )

    @classmethod
    def from_url(
        cls, url: str, *, num_shards: int = DEFAULT_NUM_SHARDS, retention: Retention | None = None
    ) -> SqliteStore:
        """``sqlite:///abs/path.db`` or ``sqlite://relative.db`` or ``sqlite://:memory:``."""
        rest = url.removeprefix("sqlite://")
        return cls(rest or ":memory:", num_shards=num_shards, retention=retention)

    # -- the database ---------------------------------------------------------------------

    async def open(self) -> None:
        if self._db.is_open:
            return
        await self._db.open()
        await self._db.call(self._check_shard_count)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name=f"sweep:{self.path}")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        await self._db.close()

    def _check_shard_count(self, db: sqlite3.Connection) -> None:
        db.execute(Q["insert_meta"], ("num_shards", str(self.num_shards)))
        stored = int(db.execute(Q["select_meta"], ("num_shards",)).fetchone()[0])
        if stored != self.num_shards:
            raise InvalidArgument(
                "num_shards",
                f"this store was created with {stored} shards, not {self.num_shards}; "
                "the shard count is fixed when a cluster is created",
            )

    # -- retention ------------------------------------------------------------------------

    async def _sweep_forever(self, every_s: float = SWEEP_EVERY_S) -> None:
        while True:
            await self._clock.sleep(every_s)
            try:
                await self.sweep()
            except StoreUnavailable as exc:
                log.warning("retention sweep skipped: %s", exc)

    async def sweep(self, limit: int = SWEEP_ROWS) -> int:
        """Delete the finished jobs past their retention among the next ``limit`` rows (and
        their idempotency keys), and up to ``limit`` ledger rows past theirs; returns how
        many. Bounded work per call, wrapping around."""
        now = self._clock.now_ms()

        def run(db: WriterConnection) -> int:
            rows = db.execute(Q["sweep_scan"], (self._sweep_after, limit)).fetchall()
            self._sweep_after = rows[-1][0] if len(rows) == limit else 0
            gone = 0
            for rowid, job_id, state, finished_at, key in rows:
                if state == JobState.DEAD.value:
                    keep_ms = self.retention.dead_s * 1000
                elif state in _FINISHED:
                    keep_ms = self.retention.finished_s * 1000
                else:
                    continue
                if finished_at + keep_ms <= now:
                    db.execute(Q["sweep_delete"], (rowid, finished_at, state))
                    db.kept_jobs.drop(job_id)
                    if key:
                        db.execute(Q["sweep_key"], (key, job_id))
                    gone += 1
            expired = db.execute(Q["sweep_ledger"], (now, limit)).rowcount
            return gone + max(expired, 0)

        return await self._db.call(run)

    # -- jobs -----------------------------------------------------------------------------

    async def create_jobs(
        self, jobs: Sequence[tuple[Job, BucketEntry]], *, fresh: Collection[str] = frozenset()
    ) -> list[CreateResult]:
        def run(db: WriterConnection) -> list[CreateResult]:
            return [self._create_one(db, job, entry) for job, entry in jobs]

        return await self._db.call(run)

    @staticmethod
    def _create_one(db: WriterConnection, job: Job, entry: BucketEntry) -> CreateResult:
        if job.idempotency_key:
            db.execute(Q["insert_key"], (job.idempotency_key, job.job_id, job.body_digest()))
            owner_id, digest = db.execute(Q["select_key"], (job.idempotency_key,)).fetchone()
            if owner_id != job.job_id:
                existing = _select(db, owner_id)
                if existing is not None:
                    return CreateResult(
                        created=False, job=existing, conflict=digest != job.body_digest()
                    )
                if digest != job.body_digest():
                    raise InvalidArgument("idempotency_key", "in use by another job body")
                # Finish a half-done create under the key: the key's job id, and its shard.
                shard = shard_of(owner_id, _stored_num_shards(db))
                job = job.with_(job_id=owner_id, shard=shard)
                entry = BucketEntry(
                    shard=shard, minute=entry.minute, due_at=entry.due_at, job_id=owner_id
                )
        if db.execute(Q["insert_job"], job_columns(job)).rowcount == 0:  # the id exists
            existing = _select(db, job.job_id)
            assert existing is not None  # (this transaction holds the write lock)
            return CreateResult(
                created=False, job=existing, conflict=existing.body_digest() != job.body_digest()
            )
        db.kept_jobs.put(job)
        _put_entry(db, entry)
        return CreateResult(created=True, job=job)

    async def key_owners(self, keys: Sequence[str]) -> dict[str, str]:
        def run(db: sqlite3.Connection) -> dict[str, str]:
            rows = ((k, db.execute(Q["select_key"], (k,)).fetchone()) for k in keys)
            return {k: row[0] for k, row in rows if row is not None}

        return await self._db.call(run) if keys else {}

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        ids = json.dumps(list(job_ids))

        def run(db: sqlite3.Connection) -> dict[str, Job]:
            rows = db.execute(Q["select_jobs"], (ids,))
            return {row[0]: job_from_row(row) for row in rows}

        reader = self._db.reader() if len(job_ids) <= INLINE_READ_MAX else None
        if reader is None:
            return await self._db.call(run)
        try:
            return run(reader)
        except sqlite3.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def select_jobs(
        self, query: JobQuery, *, limit: int, after: tuple[int, str] | None, count: bool
    ) -> JobSlice:
        states = json.dumps(sorted(s.value for s in query.states)) if query.states else None
        params = {
            "states": states,
            "type": query.job_type or None,
            "due_from": query.due_from,
            "due_to": query.due_to,
            "key_prefix": query.key_prefix or None,
            "occurrences": query.occurrence_prefix or None,
            "occurrences_end": f"{query.schedule_id}A" if query.schedule_id else None,
            "after_value": after[0] if after else -1,
            "after_id": after[1] if after else "",
            "limit": limit + 1,
        }
        order = query.order.value

        def run(db: sqlite3.Connection) -> tuple[list[tuple[Any, ...]], int | None]:
            some = "_in_states" if _few_jobs_in(db, states) else ""
            rows = db.execute(Q[f"find_jobs_by_{order}{some}"], params).fetchall()
            total = db.execute(Q[f"count_jobs{some}"], params).fetchone()[0] if count else None
            return rows, total

        rows, total = await self._db.read_apart(run)
        more = len(rows) > limit
        jobs = [job_from_row(r[:-1]) for r in rows[:limit]]
        resume = (rows[limit - 1][-1], jobs[-1].job_id) if more else None
        return JobSlice(jobs=jobs, resume=resume, total=total)

    # -- buckets --------------------------------------------------------------------------

    async def add_entries(self, entries: Sequence[BucketEntry]) -> None:
        def run(db: sqlite3.Connection) -> None:
            for e in entries:
                _put_entry(db, e)

        await self._db.call(run)

    async def read_bucket(
        self,
        shard: int,
        minute: int,
        *,
        due_from: int,
        due_to: int,
        after: tuple[int, str] | None = None,
        limit: int = 1000,
    ) -> list[BucketEntry]:
        after_due, after_id = after if after is not None else (-1, "")
        args = (shard, minute, due_from, due_to, after_due, after_id, limit)
        self.stats.bucket_partitions_read += 1

        def run(db: sqlite3.Connection) -> list[BucketEntry]:
            return [
                BucketEntry(shard=r[0], minute=r[1], due_at=r[2], job_id=r[3])
                for r in db.execute(Q["read_bucket"], args)
            ]

        return await self._db.call(run)

    async def read_buckets(
        self,
        shards: Sequence[int],
        minute: int,
        *,
        due_from: int,
        due_to: int,
        limit: int = 1000,
    ) -> dict[int, list[BucketEntry]]:
        """Every shard's first page in one trip to the store's thread (one indexed query each)."""
        self.stats.bucket_partitions_read += len(shards)

        def run(db: sqlite3.Connection) -> dict[int, list[BucketEntry]]:
            out: dict[int, list[BucketEntry]] = {}
            for shard in shards:
                args = (shard, minute, due_from, due_to, -1, "", limit)
                out[shard] = [
                    BucketEntry(shard=r[0], minute=r[1], due_at=r[2], job_id=r[3])
                    for r in db.execute(Q["read_bucket"], args)
                ]
            return out

        return await self._db.call(run)

    # -- conditional job writes -----------------------------------------------------------

    async def claim_jobs(self, claims: Sequence[JobClaim]) -> list[WriteResult]:
        return await self._db.call(lambda db: [_apply(db, c.job_id, T.claim(c)) for c in claims])

    async def heartbeat(
        self,
        job_id: str,
        fence: int,
        lease_until: int,
        *,
        started: bool = False,
        worker: str = "",
    ) -> WriteResult:
        return await self._db.call(
            lambda db: _apply(db, job_id, T.heartbeat(fence, lease_until, started, worker))
        )

    async def complete_job(
        self,
        job_id: str,
        fence: int,
        now: int,
        *,
        result: bytes = b"",
        result_encoding: str = "",
        worker: str = "",
    ) -> WriteResult:
        validate_result(result, result_encoding)  # refused before anything is written
        transition = T.complete(fence, now, result, result_encoding, worker)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def complete_jobs(
        self, items: Sequence[Completion], now: int, *, linger_s: float = 0.0
    ) -> list[WriteResult]:
        for c in items:
            validate_result(c.result, c.encoding)  # refused before anything is written
        changes = [
            (c.job_id, T.complete(c.fence, now, c.result, c.encoding, c.worker)) for c in items
        ]
        return await self._db.call(
            lambda db: [_apply(db, job_id, t) for job_id, t in changes],
            linger_s=linger_s,
        )

    async def fail_job(
        self,
        job_id: str,
        fence: int,
        now: int,
        error: str,
        retry_at: RetryAt,
        *,
        traceback: str = "",
        worker: str = "",
    ) -> WriteResult:
        transition = T.fail(fence, now, error, retry_at, traceback, worker)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def release_lease(
        self,
        job_id: str,
        fence: int,
        now: int,
        retry_at: RetryAt,
        *,
        started: bool = False,
        max_unstarted: MaxUnstarted = DEFAULT_MAX_UNSTARTED,
    ) -> WriteResult:
        transition = T.release(fence, now, retry_at, started=started, max_unstarted=max_unstarted)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def give_back_job(
        self,
        job_id: str,
        fence: int,
        now: int,
        reason: str,
        *,
        not_started: bool = False,
        max_unstarted: MaxUnstarted = DEFAULT_MAX_UNSTARTED,
    ) -> WriteResult:
        transition = T.give_back(
            fence, now, reason, not_started=not_started, max_unstarted=max_unstarted
        )
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def amend_lease_end(
        self, job_id: str, fence: int, now: int, *, started: bool, reason: str = ""
    ) -> WriteResult:
        transition = T.amend(fence, now, started=started, reason=reason)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def expire_job(self, job_id: str, fence: int, now: int, reason: str) -> WriteResult:
        transition = T.expire(fence, now, reason)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def cancel_job(
        self, job_id: str, expect_state: JobState, fence: int, now: int
    ) -> WriteResult:
        transition = T.cancel(expect_state, fence, now)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def reschedule_job(
        self,
        job_id: str,
        fence: int,
        run_at: int,
        now: int,
        expect_state: JobState = JobState.SCHEDULED,
    ) -> WriteResult:
        transition = T.reschedule_as(expect_state, fence, run_at, now)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def replay_job(self, job_id: str, fence: int, run_at: int, now: int) -> WriteResult:
        transition = T.replay(fence, run_at, now)
        return await self._db.call(lambda db: _apply(db, job_id, transition))

    async def purge_job(self, job_id: str, fence: int) -> WriteResult:
        def run(db: WriterConnection) -> WriteResult:
            found = _select(db, job_id)
            if found is None or not T.purge(fence).condition(found):
                return WriteResult(applied=False, job=found)
            db.execute(Q["delete_job"], (job_id,))
            db.kept_jobs.drop(job_id)
            return WriteResult(applied=True, job=found)

        return await self._db.call(run)

    # -- schedules (the SQL: store.sqliteschedules) ------------------------------------------

    async def create_schedule(
        self, schedule: Schedule, entry: BucketEntry, change: Change | None = None
    ) -> tuple[bool, Schedule]:
        done = change or Change(kind=ChangeKind.CREATE, at_ms=schedule.created_at)

        def run(db: sqlite3.Connection) -> tuple[bool, Schedule]:
            created, stored = S.insert_schedule(db, schedule, done)
            if created:
                _put_entry(db, entry)
            return created, stored

        return await self._db.call(run)

    async def get_schedule(self, schedule_id: str) -> Schedule | None:
        return await self._db.call(lambda db: S.select_schedule(db, schedule_id))

    async def select_schedules(
        self, *, limit: int, after: str | None
    ) -> tuple[list[Schedule], bool]:
        found = await self._db.call(lambda db: S.list_schedules(db, limit + 1, after))
        return found[:limit], len(found) > limit

    async def update_schedule(
        self,
        schedule: Schedule,
        expect_version: int,
        entry: BucketEntry | None,
        change: Change | None = None,
        ledger: Sequence[LedgerRow] = (),
    ) -> tuple[bool, Schedule | None]:
        rows = S.ledger_params(ledger, self.retention.ledger_s * 1000)

        def run(db: sqlite3.Connection) -> tuple[bool, Schedule | None]:
            if entry is not None:  # before the row (invariant 2)
                _put_entry(db, entry)
            return S.write_schedule(db, schedule, expect_version, change, rows)

        return await self._db.call(run)

    async def read_ledger(
        self, schedule_id: str, *, at_or_before: int, limit: int
    ) -> list[LedgerRow]:
        return await self._db.call(lambda db: S.select_ledger(db, schedule_id, at_or_before, limit))

    async def delete_schedule(
        self, schedule: Schedule, expect_version: int, change: Change
    ) -> tuple[bool, Schedule | None]:
        return await self._db.call(
            lambda db: S.remove_schedule(db, schedule, expect_version, change)
        )

    async def purge_schedule(self, schedule_id: str, *, deleted_before: int) -> int | None:
        return await self._db.call(lambda db: S.purge_schedule(db, schedule_id, deleted_before))

    async def schedule_revisions(
        self, schedule_id: str, *, below: int | None = None, limit: int = REVISIONS_KEPT
    ) -> list[ScheduleRevision]:
        records = await self._db.call(
            lambda db: S.select_revision_records(db, schedule_id, below, limit)
        )
        return [S.revision_of(text) for text in records]

    async def schedule_revision(self, schedule_id: str, revision: int) -> ScheduleRevision | None:
        record = await self._db.call(lambda db: S.select_revision_record(db, schedule_id, revision))
        return None if record is None else S.revision_of(record)

    # -- per-type policies ----------------------------------------------------------------

    async def put_type_policy(self, job_type: str, policy: str) -> None:
        key = TYPE_POLICY_PREFIX + job_type
        await self._db.call(lambda db: db.execute(Q["upsert_meta"], (key, policy)))

    async def type_policies(self) -> dict[str, str]:
        def run(db: sqlite3.Connection) -> dict[str, str]:
            rows = db.execute(Q["select_all_meta"]).fetchall()
            return type_policies_of((key, value) for key, value in rows)

        return await self._db.call(run)

    async def put_type_setting(self, job_type: str, setting: str, value: str) -> None:
        key = type_setting_key(setting, job_type)
        await self._db.call(lambda db: db.execute(Q["upsert_meta"], (key, value)))

    async def type_settings(self, setting: str) -> dict[str, str]:
        def run(db: sqlite3.Connection) -> dict[str, str]:
            rows = db.execute(Q["select_all_meta"]).fetchall()
            return type_settings_of(setting, ((key, value) for key, value in rows))

        return await self._db.call(run)

    # -- the operator audit ----------------------------------------------------------------

    async def add_audit(self, at_ms: int, entry_id: str, entry: str) -> None:
        def run(db: sqlite3.Connection) -> None:
            db.execute(Q["expire_audit"], (at_ms - self.retention.audit_s * 1000,))
            db.execute(Q["insert_audit"], (at_ms, entry_id, entry))

        await self._db.call(run)

    async def audit(self, *, now_ms: int, limit: int) -> list[str]:
        since = now_ms - self.retention.audit_s * 1000
        return await self._db.call(
            lambda db: [r[0] for r in db.execute(Q["select_audit"], (since, limit))]
        )

    # -- shards ---------------------------------------------------------------------------

    async def get_shard(self, shard: int) -> ShardState:
        def run(db: sqlite3.Connection) -> ShardState:
            row = db.execute(Q["select_shard"], (shard,)).fetchone()
            if row is None:
                return ShardState(shard=shard)
            return ShardState(shard=row[0], epoch=row[1], owner=row[2], cursor=row[3])

        return await self._db.call(run)

    async def acquire_shard(
        self, shard: int, owner: str, expect_epoch: int, initial_cursor: int
    ) -> tuple[bool, ShardState]:
        def run(db: sqlite3.Connection) -> tuple[bool, ShardState]:
            if expect_epoch == 0:  # never taken: create it, as Cassandra's IF NOT EXISTS
                db.execute(Q["insert_shard"], (shard, 0, "", initial_cursor))
            applied = db.execute(Q["bump_epoch"], (owner, shard, expect_epoch)).rowcount == 1
            row = db.execute(Q["select_shard"], (shard,)).fetchone()
            if row is None:
                return False, ShardState(shard=shard)
            return applied, ShardState(shard=row[0], epoch=row[1], owner=row[2], cursor=row[3])

        return await self._db.call(run)

    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        return await self._db.call(
            lambda db: db.execute(Q["save_cursor"], (cursor, shard, epoch)).rowcount == 1
        )
