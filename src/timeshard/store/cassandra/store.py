"""``CassandraStore``: the store contract on Cassandra. Job rows live in minute partitions and
their transitions go out a partition batch at a time (``jobrows``); schedules and shard states
are one lightweight transaction each (see the package docstring for how the contract maps)."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Collection, Sequence

from timeshard.clock import Clock, SystemClock
from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.ledger import DAY_MS, LedgerRow
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
from timeshard.sharding import DEFAULT_NUM_SHARDS, validate_num_shards
from timeshard.store import transitions as T
from timeshard.store.base import (
    Completion,
    CreateResult,
    JobClaim,
    MaxUnstarted,
    Retention,
    RetryAt,
    Store,
)
from timeshard.store.cassandra import listing
from timeshard.store.cassandra.creates import Creator
from timeshard.store.cassandra.driver import Ambiguous, ClusterConfig, Connection, parse_url
from timeshard.store.cassandra.jobrows import JobRows
from timeshard.store.cassandra.ledger import LedgerTable
from timeshard.store.cassandra.parts import CAS_ROUNDS
from timeshard.store.cassandra.parts import gather as _gather
from timeshard.store.cassandra.revisions import Revisions
from timeshard.store.cassandra.shards import ShardRows
from timeshard.store.codec import revision_record, schedule_columns, to_schedule
from timeshard.store.listing import JobQuery, JobSlice
from timeshard.store.meta import (
    TYPE_POLICY_PREFIX,
    type_policies_of,
    type_setting_key,
    type_settings_of,
)

READ_BUCKETS_AT_ONCE = 64
"""Bucket partitions one ``read_buckets`` request names (``shard IN (...)``)."""


class CassandraStore(Store):
    def __init__(
        self,
        config: ClusterConfig,
        *,
        num_shards: int = DEFAULT_NUM_SHARDS,
        clock: Clock | None = None,
        max_in_flight: int = 512,
        retention: Retention | None = None,
    ) -> None:
        self.config = config
        self._clock: Clock = clock or SystemClock()
        self._conn = Connection(config, now_ms=self._clock.now_ms, max_in_flight=max_in_flight)
        self.stats = self._conn.stats
        self.num_shards = validate_num_shards(num_shards)
        self.retention = retention or Retention()
        self._jobs = JobRows(self._conn, self._clock, self.num_shards, self.retention)
        self._ledger = LedgerTable(self._conn, self.retention.ledger_s)
        self._revisions = Revisions(self._conn)
        self._creator = Creator(self._conn, self._clock, self.num_shards, self._jobs)
        self._shards = ShardRows(self._conn, self._jobs.took_shard)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        num_shards: int = DEFAULT_NUM_SHARDS,
        clock: Clock | None = None,
        retention: Retention | None = None,
    ) -> CassandraStore:
        return cls(parse_url(url), num_shards=num_shards, clock=clock, retention=retention)

    # -- connection -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._conn.is_open:
            return
        await self._conn.open()
        try:
            await self._check_shard_count()
        except BaseException:
            await self._conn.close()  # so that opening again checks again
            raise

    async def close(self) -> None:
        await self._creator.close()
        await self._jobs.close()
        await self._conn.close()

    async def _check_shard_count(self) -> None:
        row = await self._conn.one("insert_meta", ("num_shards", str(self.num_shards)))
        if not row["[applied]"] and int(row["value"]) != self.num_shards:
            raise InvalidArgument(
                "num_shards",
                f"this store was created with {row['value']} shards, not {self.num_shards}; "
                "the shard count is fixed when a cluster is created",
            )

    # -- jobs -----------------------------------------------------------------------------

    async def create_jobs(
        self, jobs: Sequence[tuple[Job, BucketEntry]], *, fresh: Collection[str] = frozenset()
    ) -> list[CreateResult]:
        return await self._creator.create(jobs, fresh)

    async def key_owners(self, keys: Sequence[str]) -> dict[str, str]:
        rows = await _gather(self._conn.rows("select_key", (k,)) for k in dict.fromkeys(keys))
        return {
            k: r[0]["job_id"]
            for k, r in zip(dict.fromkeys(keys), rows, strict=True)
            if r and r[0]["job_id"] is not None
        }

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        return await self._jobs.get(job_ids)

    async def get_jobs_for(self, entries: Sequence[BucketEntry]) -> dict[str, Job]:
        homes = {e.job_id: e.home for e in entries if e.home is not None}
        return await self._jobs.get([e.job_id for e in entries], homes)

    async def clock_ms(self) -> int | None:
        row = await self._conn.one("select_now", ())
        return int(row["now"]) if row else None

    def expired(self, job_id: str) -> bool:
        return self._jobs.expired(job_id)

    async def select_jobs(
        self, query: JobQuery, *, limit: int, after: tuple[int, str] | None, count: bool
    ) -> JobSlice:
        """A scan of every job row's narrow columns (``store.cassandra.listing``)."""
        return await listing.select_jobs(self._conn, self._jobs, query, limit=limit, after=after)

    async def dead_letters(self, *, limit: int, latest: int) -> tuple[int, list[Job]]:
        """From the dead-letter index (``dead_letters``), not a scan of every job: the rows of
        the jobs that died on this node a moment ago are written first. The latest are read
        back and kept only if still dead (the index may trail a replay on another node)."""
        await self._jobs.follows.flush()
        count, state, newest = 0, None, list[tuple[int, str]]()
        while count < limit:
            rows, state = await self._conn.page("scan_dead", (), size=1000, state=state)
            count += len(rows)
            here = ((r["finished_at"] or 0, r["job_id"]) for r in rows)
            newest = heapq.nlargest(latest, [*newest, *here])
            if state is None:
                break
        found = await self._jobs.get([job_id for _, job_id in newest])
        dead = [found.get(job_id) for _, job_id in newest]
        return count, [j for j in dead if j is not None and j.state is JobState.DEAD]

    # -- buckets --------------------------------------------------------------------------

    async def add_entries(self, entries: Sequence[BucketEntry]) -> None:
        await self._jobs.put_entries(entries)

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
        self.stats.bucket_partitions_read += 1
        if after is not None and after[0] >= due_from:
            rows = await self._conn.rows(
                "read_bucket_after", (shard, minute, after[0], after[1], due_to, limit)
            )
        else:
            rows = await self._conn.rows("read_bucket", (shard, minute, due_from, due_to, limit))
        return [
            BucketEntry(
                shard=r["shard"],
                minute=r["minute"],
                due_at=r["due_at"],
                job_id=r["job_id"],
                home=r["home"],
            )
            for r in rows
        ]

    async def read_buckets(
        self,
        shards: Sequence[int],
        minute: int,
        *,
        due_from: int,
        due_to: int,
        limit: int = 1000,
    ) -> dict[int, list[BucketEntry]]:
        """``SELECT ... WHERE shard IN (...)``, ``READ_BUCKETS_AT_ONCE`` partitions a request,
        the requests at once: the cost of a read is mostly per request, not per partition."""
        chunks = [
            list(shards[i : i + READ_BUCKETS_AT_ONCE])
            for i in range(0, len(shards), READ_BUCKETS_AT_ONCE)
        ]
        pages = await asyncio.gather(
            *(
                self._conn.rows("read_buckets", (chunk, minute, due_from, due_to, limit))
                for chunk in chunks
            )
        )
        self.stats.bucket_partitions_read += len(shards)
        out: dict[int, list[BucketEntry]] = {shard: [] for shard in shards}
        for rows in pages:
            for r in rows:
                out[r["shard"]].append(
                    BucketEntry(
                        shard=r["shard"],
                        minute=r["minute"],
                        due_at=r["due_at"],
                        job_id=r["job_id"],
                        home=r["home"],
                    )
                )
        return out

    # -- conditional job writes -----------------------------------------------------------

    async def claim_jobs(self, claims: Sequence[JobClaim]) -> list[WriteResult]:
        return await self._jobs.apply_all(
            [(c.job_id, T.claim(c), c.known) for c in claims],
            owner_only=True,
        )

    async def heartbeat(
        self,
        job_id: str,
        fence: int,
        lease_until: int,
        *,
        started: bool = False,
        worker: str = "",
    ) -> WriteResult:
        return await self._jobs.apply(job_id, T.heartbeat(fence, lease_until, started, worker))

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
        validate_result(result, result_encoding)  # refused before it joins a batch
        return await self._jobs.apply(
            job_id, T.complete(fence, now, result, result_encoding, worker)
        )

    async def complete_jobs(
        self, items: Sequence[Completion], now: int, *, linger_s: float = 0.0
    ) -> list[WriteResult]:
        for c in items:
            validate_result(c.result, c.encoding)  # refused before any joins a batch
        return await self._jobs.apply_all(
            [
                (c.job_id, T.complete(c.fence, now, c.result, c.encoding, c.worker), None)
                for c in items
            ],
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
        return await self._jobs.apply(
            job_id, T.fail(fence, now, error, retry_at, traceback, worker)
        )

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
        return await self._jobs.apply(job_id, transition, owner_only=True)

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
        return await self._jobs.apply(
            job_id,
            T.give_back(fence, now, reason, not_started=not_started, max_unstarted=max_unstarted),
        )

    async def amend_lease_end(
        self, job_id: str, fence: int, now: int, *, started: bool, reason: str = ""
    ) -> WriteResult:
        return await self._jobs.apply(job_id, T.amend(fence, now, started=started, reason=reason))

    async def expire_job(self, job_id: str, fence: int, now: int, reason: str) -> WriteResult:
        return await self._jobs.apply(job_id, T.expire(fence, now, reason), owner_only=True)

    async def cancel_job(
        self, job_id: str, expect_state: JobState, fence: int, now: int
    ) -> WriteResult:
        return await self._jobs.apply(job_id, T.cancel(expect_state, fence, now))

    async def reschedule_job(
        self,
        job_id: str,
        fence: int,
        run_at: int,
        now: int,
        expect_state: JobState = JobState.SCHEDULED,
    ) -> WriteResult:
        return await self._jobs.apply(job_id, T.reschedule_as(expect_state, fence, run_at, now))

    async def replay_job(self, job_id: str, fence: int, run_at: int, now: int) -> WriteResult:
        return await self._jobs.apply(job_id, T.replay(fence, run_at, now))

    async def purge_job(self, job_id: str, fence: int) -> WriteResult:
        return await self._jobs.apply(job_id, T.purge(fence), delete=True)

    # -- schedules ------------------------------------------------------------------------

    async def create_schedule(
        self, schedule: Schedule, entry: BucketEntry, change: Change | None = None
    ) -> tuple[bool, Schedule]:
        """The entry is written first: if the row then exists already, the extra entry finds
        it and moves on; a crash in between never leaves a schedule without its entry."""
        await self._jobs.put_entries([entry])
        change = change or Change(kind=ChangeKind.CREATE, at_ms=schedule.created_at)
        record = revision_record(schedule, change)
        params = {**schedule_columns(schedule), "revisions": {schedule.revision: record}}
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("insert_schedule", params)
            except Ambiguous:
                stored = await self.get_schedule(schedule.schedule_id, serial=True)
                if stored is None:
                    continue  # not written (or a deleted one's row): try again
                return stored == schedule, stored
            if row["[applied]"]:
                return True, schedule
            found = to_schedule(row)
            if not row.get("deleted"):
                return False, found
            # The id of a deleted schedule is free again; its revisions go on.
            new = schedule.with_(version=found.version + 1, revision=found.revision + 1)
            applied, stored = await self._revise(
                new, found.version, change, deleted=False, was_deleted=True
            )
            if applied:
                return True, new
            if stored is not None:
                return False, stored
        raise StoreUnavailable(f"creating schedule {schedule.schedule_id!r} kept timing out")

    async def _read_schedule(
        self, schedule_id: str, *, serial: bool
    ) -> tuple[Schedule | None, bool]:
        """The row (also a deleted one's) and whether it was deleted; the ledger rows of its
        latest decision are copied first if this process has not seen them copied
        (``store.cassandra.ledger``)."""
        rows = await self._conn.rows("select_schedule", (schedule_id,), serial=serial)
        if not rows:
            return None, False
        await self._ledger.settle(rows[0])
        return to_schedule(rows[0]), bool(rows[0]["deleted"])

    async def get_schedule(self, schedule_id: str, *, serial: bool = False) -> Schedule | None:
        found, deleted = await self._read_schedule(schedule_id, serial=serial)
        return None if deleted else found

    async def select_schedules(
        self, *, limit: int, after: str | None
    ) -> tuple[list[Schedule], bool]:
        """In token order of the schedule id (stable, not alphabetical: the rows are spread
        over the cluster by the hash of their id). Deleted ones are read and passed over."""
        found: list[Schedule] = []
        while True:
            rows = await (
                self._conn.rows("list_schedules", (after, limit + 1))
                if after is not None
                else self._conn.rows("list_schedules_first", (limit + 1,))
            )
            found += [to_schedule(r) for r in rows if not r["deleted"]]
            if len(found) > limit or len(rows) <= limit:
                return found[:limit], len(found) > limit
            after = rows[-1]["schedule_id"]

    async def update_schedule(
        self,
        schedule: Schedule,
        expect_version: int,
        entry: BucketEntry | None,
        change: Change | None = None,
        ledger: Sequence[LedgerRow] = (),
    ) -> tuple[bool, Schedule | None]:
        """The ledger rows go in the row's ``ledger_outbox`` (one Paxos round with the
        decision), then to the ledger table (``LedgerTable``)."""
        if entry is not None:
            await self._jobs.put_entries([entry])
        if change is not None:
            return await self._revise(schedule, expect_version, change, deleted=False)
        after = schedule.with_(version=expect_version + 1)
        texts, outbox = self._ledger.encode(ledger)
        params = {
            **schedule_columns(schedule),
            "version": expect_version,
            "new_version": expect_version + 1,
            "ledger_outbox": outbox,
        }
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("update_schedule", params)
            except Ambiguous:
                stored = await self.get_schedule(schedule.schedule_id, serial=True)
                if stored is not None and stored.version == expect_version:
                    continue  # not written, still ours to write
                return stored == after, stored  # (if ours, the read copied its rows)
            if row["[applied]"]:
                await self._ledger.written(schedule.schedule_id, ledger, texts, outbox)
                return True, after
            if row.get("version") is None:
                return False, None
            return False, await self.get_schedule(schedule.schedule_id, serial=True)
        raise StoreUnavailable(f"schedule {schedule.schedule_id!r}: update kept timing out")

    async def read_ledger(
        self, schedule_id: str, *, at_or_before: int, limit: int
    ) -> list[LedgerRow]:
        """Day partitions from ``at_or_before``'s back over the ledger retention (older rows
        are gone), ``DAYS_AT_ONCE`` at a time until ``limit`` rows are found."""
        return await self._ledger.read(
            schedule_id,
            at_or_before=at_or_before,
            limit=limit,
            newest=at_or_before,
            oldest=at_or_before - self.retention.ledger_s * 1000 - DAY_MS,
        )

    async def delete_schedule(
        self, schedule: Schedule, expect_version: int, change: Change
    ) -> tuple[bool, Schedule | None]:
        return await self._revise(schedule, expect_version, change, deleted=True)

    async def _revise(
        self,
        s: Schedule,
        expect_version: int,
        change: Change,
        *,
        deleted: bool,
        was_deleted: bool = False,
    ) -> tuple[bool, Schedule | None]:
        """A person's change: the whole row and revision ``s.revision`` in one conditional
        write (with the drop of the revision ``REVISIONS_KEPT`` before it, one batch of the
        row's partition), if the row is at ``expect_version`` and deleted or not as
        ``was_deleted`` says. Returns (applied, the schedule after (None once deleted), or as
        found)."""
        sid = s.schedule_id
        params = {
            **schedule_columns(s),
            "version": expect_version,
            "new_version": expect_version + 1,
            "deleted": deleted,
            "was": [True] if was_deleted else [None, False],
            "record": revision_record(s, change),
        }
        statements: list[tuple[str, dict[str, object]]] = [("revise_schedule", params)]
        if s.revision > REVISIONS_KEPT:
            dropped = {"schedule_id": sid, "dropped": s.revision - REVISIONS_KEPT}
            statements.append(("trim_revisions", dropped))
        after = s.with_(version=expect_version + 1)
        for _ in range(CAS_ROUNDS):
            try:
                rows = await self._conn.batch(statements, conditional=True)
            except Ambiguous:
                found, was_deleted = await self._read_schedule(sid, serial=True)
                if found is not None and found.version == expect_version:
                    continue  # not written, still ours to write
                mine = found == after and was_deleted == deleted
                return mine, None if was_deleted else found
            if rows and rows[0].get("[applied]"):
                return True, None if deleted else after
            return False, await self.get_schedule(sid, serial=True)
        raise StoreUnavailable(f"schedule {sid!r}: change kept timing out")

    async def purge_schedule(self, schedule_id: str, *, deleted_before: int) -> int | None:
        return await self._revisions.purge(schedule_id, deleted_before)

    async def schedule_revisions(
        self, schedule_id: str, *, below: int | None = None, limit: int = REVISIONS_KEPT
    ) -> list[ScheduleRevision]:
        return await self._revisions.page(schedule_id, below, limit)

    async def schedule_revision(self, schedule_id: str, revision: int) -> ScheduleRevision | None:
        return await self._revisions.one(schedule_id, revision)

    # -- per-type policies ----------------------------------------------------------------

    async def put_type_policy(self, job_type: str, policy: str) -> None:
        await self._conn.rows("upsert_meta", (TYPE_POLICY_PREFIX + job_type, policy))

    async def type_policies(self) -> dict[str, str]:
        rows = await self._conn.rows("select_all_meta", ())
        return type_policies_of((r["key"], r["value"]) for r in rows)

    async def put_type_setting(self, job_type: str, setting: str, value: str) -> None:
        await self._conn.rows("upsert_meta", (type_setting_key(setting, job_type), value))

    async def type_settings(self, setting: str) -> dict[str, str]:
        rows = await self._conn.rows("select_all_meta", ())
        return type_settings_of(setting, ((r["key"], r["value"]) for r in rows))

    # -- the operator audit ----------------------------------------------------------------

    async def add_audit(self, at_ms: int, entry_id: str, entry: str) -> None:
        day = at_ms // DAY_MS
        await self._conn.rows(
            "insert_audit", (day, at_ms, entry_id, entry, self._jobs.retention.audit_s)
        )

    async def audit(self, *, now_ms: int, limit: int) -> list[str]:
        """A day's partition at a time, today's first, back to the oldest kept: an empty
        audit costs one read per day of its retention (90 by default), a page load's worth."""
        found: list[str] = []
        since = now_ms - self._jobs.retention.audit_s * 1000
        day, oldest = now_ms // DAY_MS, since // DAY_MS
        while day >= oldest and len(found) < limit:
            rows = await self._conn.rows("select_audit", (day, since, limit - len(found)))
            found += [r["entry"] for r in rows]
            day -= 1
        return found

    # -- shards ---------------------------------------------------------------------------

    async def get_shard(self, shard: int, *, serial: bool = False) -> ShardState:
        return await self._shards.get(shard, serial=serial)

    async def acquire_shard(
        self, shard: int, owner: str, expect_epoch: int, initial_cursor: int
    ) -> tuple[bool, ShardState]:
        return await self._shards.acquire(shard, owner, expect_epoch, initial_cursor)

    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        return await self._shards.save_cursor(shard, epoch, cursor)
