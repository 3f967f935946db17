"""``CassandraStore``: the store contract on Cassandra, every job write one lightweight
transaction on the row image it read (see the package docstring for how the contract maps)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from timeshard.clock import Clock, SystemClock
from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.model import BucketEntry, Job, JobState, Outcome, Schedule, ShardState
from timeshard.sharding import DEFAULT_NUM_SHARDS, shard_of, validate_num_shards
from timeshard.store import transitions as T
from timeshard.store.base import ClaimRequest, CreateResult, JobPage, Store, entry_for
from timeshard.store.cassandra.driver import Ambiguous, ClusterConfig, Connection, parse_url
from timeshard.store.cassandra.rows import (
    Found,
    Row,
    bounded_history,
    bucket_ttl,
    image_of,
    to_shard_state,
)
from timeshard.store.codec import job_columns, schedule_columns, to_job, to_schedule

CAS_ROUNDS = 20
"""Conditional writes retried on a row that changed but still meets the condition."""
LIST_SCAN_MAX = 10_000
"""Rows ``list_jobs`` reads per call at most; a sparse filter may return a short page."""


class CassandraStore(Store):
    def __init__(
        self,
        config: ClusterConfig,
        *,
        num_shards: int = DEFAULT_NUM_SHARDS,
        clock: Clock | None = None,
        max_in_flight: int = 512,
    ) -> None:
        self.config = config
        self._clock: Clock = clock or SystemClock()
        self._conn = Connection(config, now_ms=self._clock.now_ms, max_in_flight=max_in_flight)
        self.num_shards = validate_num_shards(num_shards)

    @classmethod
    def from_url(
        cls, url: str, *, num_shards: int = DEFAULT_NUM_SHARDS, clock: Clock | None = None
    ) -> CassandraStore:
        return cls(parse_url(url), num_shards=num_shards, clock=clock)

    # -- connection -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._conn.is_open:
            return
        await self._conn.open()
        await self._check_shard_count()

    async def close(self) -> None:
        await self._conn.close()

    async def _check_shard_count(self) -> None:
        row = await self._conn.one("insert_meta", ("num_shards", str(self.num_shards)))
        if not row["[applied]"] and int(row["value"]) != self.num_shards:
            raise InvalidArgument(
                "num_shards",
                f"this store was created with {row['value']} shards, not {self.num_shards}; "
                "the shard count is fixed when a cluster is created",
            )

    # -- reads and writes shared by the operations ----------------------------------------

    async def _read_job(self, job_id: str, *, serial: bool = False) -> Found | None:
        rows = await self._conn.rows("select_job", (job_id,), serial=serial)
        return Found.from_row(rows[0]) if rows else None

    async def _put_entries(self, entries: Sequence[BucketEntry]) -> None:
        now = self._clock.now_ms()
        await _gather(
            self._conn.rows(
                "insert_entry",
                (e.shard, e.minute, e.due_at, e.job_id, bucket_ttl(e.due_at, now)),
            )
            for e in entries
        )

    # -- jobs -----------------------------------------------------------------------------

    async def create_jobs(self, jobs: Sequence[tuple[Job, BucketEntry]]) -> list[CreateResult]:
        return await _gather(self._create_one(job, entry) for job, entry in jobs)

    async def _create_one(self, job: Job, entry: BucketEntry) -> CreateResult:
        if job.idempotency_key:
            key = await self._claim_key(job)
            if key["job_id"] != job.job_id:
                owner = await self._read_job(key["job_id"])
                if owner is not None:
                    conflict = key["digest"] != job.body_digest()
                    return CreateResult(created=False, job=owner.job, conflict=conflict)
                if key["digest"] != job.body_digest():
                    raise InvalidArgument("idempotency_key", "in use by another job body")
                # The key's job was never written (a crash in between): finish it under its id.
                shard = shard_of(key["job_id"], self.num_shards)
                job = job.with_(job_id=key["job_id"], shard=shard)
                entry = BucketEntry(
                    shard=shard, minute=entry.minute, due_at=entry.due_at, job_id=job.job_id
                )
        job = bounded_history(job)
        await self._put_entries([entry])
        row = await self._insert_job(job)
        if row["[applied]"]:
            return CreateResult(created=True, job=job)
        existing = to_job(row)
        return CreateResult(
            created=False, job=existing, conflict=existing.body_digest() != job.body_digest()
        )

    async def _insert_job(self, job: Job) -> Row:
        """``INSERT ... IF NOT EXISTS``; a timeout is settled by a SERIAL read of the row."""
        columns = job_columns(job)
        for _ in range(CAS_ROUNDS):
            try:
                return await self._conn.one("insert_job", columns)
            except Ambiguous as exc:
                settled = await self._settle(job.job_id, exc)
            if settled is not None:
                current = job_columns(settled.job)
                return {"[applied]": current == columns, **current}
        raise StoreUnavailable(f"creating job {job.job_id!r} kept timing out")

    async def _claim_key(self, job: Job) -> Row:
        """The idempotency key's row (``job_id``, ``digest``), written now if it is new."""
        params = (job.idempotency_key, job.job_id, job.body_digest())
        try:
            row = await self._conn.one("insert_key", params)
        except Ambiguous as exc:
            rows = await self._conn.rows("select_key", (job.idempotency_key,), serial=True)
            if not rows:
                raise StoreUnavailable(f"idempotency key write timed out: {exc}") from exc
            return rows[0]
        return {"job_id": job.job_id, "digest": job.body_digest()} if row["[applied]"] else row

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        found = await _gather(self._read_job(i) for i in dict.fromkeys(job_ids))
        return {f.job.job_id: f.job for f in found if f is not None}

    async def list_jobs(
        self, *, state: JobState | None, job_type: str | None, limit: int, page_token: str
    ) -> JobPage:
        """Token order over the jobs table, filtered here rather than with ALLOW FILTERING
        or a secondary index: listing is an operator's tool, and this keeps every job write a
        single-partition write. A page reads at most ``LIST_SCAN_MAX`` rows, so a sparse
        filter can return a short (even empty) page with a ``next_token`` to go on from.
        The token is the last job id read; jobs whose ids share a Murmur3 token with it
        (2^-64 per pair) would be skipped."""
        if limit < 1:
            raise InvalidArgument("limit", f"must be at least 1, got {limit}")
        matches: list[Job] = []
        after, scanned = page_token, 0
        chunk = min(max(2 * limit, 100), 1000)
        while scanned < LIST_SCAN_MAX:
            rows = await (
                self._conn.rows("list_jobs", (after, chunk))
                if after
                else self._conn.rows("list_jobs_first", (chunk,))
            )
            for row in rows:
                scanned += 1
                after = row["job_id"]
                job = to_job(row)
                if (state is None or job.state is state) and (
                    not job_type or job.job_type == job_type
                ):
                    matches.append(job)
                    if len(matches) > limit:
                        return JobPage(jobs=matches[:limit], next_token=matches[limit - 1].job_id)
            if len(rows) < chunk:
                return JobPage(jobs=matches, next_token="")
        return JobPage(jobs=matches, next_token=after)

    # -- buckets --------------------------------------------------------------------------

    async def add_entries(self, entries: Sequence[BucketEntry]) -> None:
        await self._put_entries(entries)

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
        if after is not None and after[0] >= due_from:
            rows = await self._conn.rows(
                "read_bucket_after", (shard, minute, after[0], after[1], due_to, limit)
            )
        else:
            rows = await self._conn.rows("read_bucket", (shard, minute, due_from, due_to, limit))
        return [
            BucketEntry(
                shard=r["shard"], minute=r["minute"], due_at=r["due_at"], job_id=r["job_id"]
            )
            for r in rows
        ]

    # -- conditional job writes -----------------------------------------------------------

    async def _conditional(
        self, statement: str, job_id: str, t: T.Transition, known: Job | None = None
    ) -> Outcome:
        """Apply the transition with ``statement`` if its condition holds, as one LWT on the
        row image; write the bucket entry the new row needs (if any) first. With ``known``
        (the row as the caller read it) the first attempt skips the read."""
        found = (
            Found(job=known, image=image_of(known))
            if known is not None
            else await self._read_job(job_id)
        )
        written: BucketEntry | None = None
        for _ in range(CAS_ROUNDS):
            if found is None or not t.condition(found.job):
                return Outcome(applied=False, job=found.job if found else None)
            new = bounded_history(t.change(found.job))
            at = t.entry_at(new)
            if at is not None and (entry := entry_for(new, at, t.now)) != written:
                await self._put_entries([entry])
                written = entry
            params = {**job_columns(new), **{f"was_{k}": v for k, v in found.image.items()}}
            try:
                row = await self._conn.one(statement, params)
            except Ambiguous as exc:
                settled = await self._settle(job_id, exc)
                if settled is not None and settled.image == image_of(new):
                    return Outcome(applied=True, job=new)
                found = settled
                continue
            if row["[applied]"]:
                return Outcome(applied=True, job=new)
            if "state" not in row:  # the row is gone
                return Outcome(applied=False, job=None)
            found = found.after(row)
        raise StoreUnavailable(f"job {job_id!r} kept changing during {CAS_ROUNDS} attempts")

    async def _settle(self, job_id: str, exc: Ambiguous) -> Found | None:
        """After a conditional write timed out: the row as decided by Paxos."""
        try:
            return await self._read_job(job_id, serial=True)
        except StoreUnavailable as unavailable:
            raise StoreUnavailable(
                f"a conditional write on job {job_id!r} timed out ({exc}) and its outcome "
                f"could not be read: {unavailable.detail}"
            ) from unavailable

    async def claim_jobs(self, claims: Sequence[ClaimRequest]) -> list[Outcome]:
        return await _gather(
            self._conditional("claim_job", c.job_id, T.claim(c), c.known) for c in claims
        )

    async def renew_lease(self, job_id: str, fence: int, lease_until: int) -> Outcome:
        return await self._conditional("renew_lease", job_id, T.renew(fence, lease_until))

    async def complete_job(self, job_id: str, fence: int, now: int) -> Outcome:
        return await self._conditional("complete_job", job_id, T.complete(fence, now))

    async def fail_job(
        self, job_id: str, fence: int, now: int, error: str, retry_at: int | None
    ) -> Outcome:
        return await self._conditional("fail_job", job_id, T.fail(fence, now, error, retry_at))

    async def release_lease(self, job_id: str, fence: int, now: int) -> Outcome:
        return await self._conditional("release_lease", job_id, T.release(fence, now))

    async def cancel_job(
        self, job_id: str, expect_state: JobState, fence: int, now: int
    ) -> Outcome:
        return await self._conditional("cancel_job", job_id, T.cancel(expect_state, fence, now))

    async def reschedule_job(self, job_id: str, fence: int, run_at: int, now: int) -> Outcome:
        return await self._conditional("reschedule_job", job_id, T.reschedule(fence, run_at, now))

    async def replay_job(self, job_id: str, fence: int, run_at: int, now: int) -> Outcome:
        return await self._conditional("replay_job", job_id, T.replay(fence, run_at, now))

    async def purge_job(self, job_id: str, fence: int) -> Outcome:
        found = await self._read_job(job_id)
        for _ in range(CAS_ROUNDS):
            if found is None or found.job.state is not JobState.DEAD or found.job.fence != fence:
                return Outcome(applied=False, job=found.job if found else None)
            params = {"job_id": job_id, **{f"was_{k}": v for k, v in found.image.items()}}
            try:
                row = await self._conn.one("purge_job", params)
            except Ambiguous as exc:
                settled = await self._settle(job_id, exc)
                if settled is None:
                    return Outcome(applied=True, job=found.job)
                found = settled
                continue
            if row["[applied]"]:
                return Outcome(applied=True, job=found.job)
            if "state" not in row:
                return Outcome(applied=False, job=None)
            found = found.after(row)
        raise StoreUnavailable(f"job {job_id!r} kept changing during {CAS_ROUNDS} attempts")

    # -- schedules ------------------------------------------------------------------------

    async def create_schedule(
        self, schedule: Schedule, entry: BucketEntry
    ) -> tuple[bool, Schedule]:
        """The entry is written first: if the row then exists already, the extra entry finds
        it and moves on; a crash in between never leaves a schedule without its entry."""
        await self._put_entries([entry])
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("insert_schedule", schedule_columns(schedule))
            except Ambiguous:
                stored = await self.get_schedule(schedule.schedule_id, serial=True)
                if stored is None:
                    continue  # not written: try again
                return stored == schedule, stored
            if row["[applied]"]:
                return True, schedule
            return False, to_schedule(row)
        raise StoreUnavailable(f"creating schedule {schedule.schedule_id!r} kept timing out")

    async def get_schedule(self, schedule_id: str, *, serial: bool = False) -> Schedule | None:
        rows = await self._conn.rows("select_schedule", (schedule_id,), serial=serial)
        return to_schedule(rows[0]) if rows else None

    async def list_schedules(self, *, limit: int, page_token: str) -> tuple[list[Schedule], str]:
        """In token order of the schedule id (stable, not alphabetical: the rows are spread
        over the cluster by the hash of their id)."""
        if limit < 1:
            raise InvalidArgument("limit", f"must be at least 1, got {limit}")
        rows = await (
            self._conn.rows("list_schedules", (page_token, limit + 1))
            if page_token
            else self._conn.rows("list_schedules_first", (limit + 1,))
        )
        found = [to_schedule(r) for r in rows]
        more = len(found) > limit
        found = found[:limit]
        return found, found[-1].schedule_id if more and found else ""

    async def update_schedule(
        self, schedule: Schedule, expect_version: int, entry: BucketEntry | None
    ) -> tuple[bool, Schedule | None]:
        if entry is not None:
            await self._put_entries([entry])
        after = schedule.with_(version=expect_version + 1)
        params = {
            **schedule_columns(schedule),
            "version": expect_version,
            "new_version": expect_version + 1,
        }
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("update_schedule", params)
            except Ambiguous:
                stored = await self.get_schedule(schedule.schedule_id, serial=True)
                if stored is not None and stored.version == expect_version:
                    continue  # not written, still ours to write
                return stored == after, stored
            if row["[applied]"]:
                return True, after
            if row.get("version") is None:
                return False, None
            return False, await self.get_schedule(schedule.schedule_id, serial=True)
        raise StoreUnavailable(f"schedule {schedule.schedule_id!r}: update kept timing out")

    async def delete_schedule(self, schedule_id: str) -> bool:
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("delete_schedule", (schedule_id,))
            except Ambiguous:
                if await self.get_schedule(schedule_id, serial=True) is None:
                    return True
                continue
            return bool(row["[applied]"])
        raise StoreUnavailable(f"schedule {schedule_id!r}: delete kept timing out")

    # -- shards ---------------------------------------------------------------------------

    async def get_shard(self, shard: int, *, serial: bool = False) -> ShardState:
        rows = await self._conn.rows("select_shard", (shard,), serial=serial)
        return to_shard_state(shard, rows[0]) if rows else ShardState(shard=shard)

    async def acquire_shard(
        self, shard: int, owner: str, expect_epoch: int, initial_cursor: int
    ) -> tuple[bool, ShardState]:
        taken = ShardState(shard=shard, epoch=expect_epoch + 1, owner=owner)
        if expect_epoch == 0:
            try:
                row = await self._conn.one("create_shard", (shard, owner, initial_cursor))
            except Ambiguous:
                current = await self.get_shard(shard, serial=True)
                return replace(taken, cursor=initial_cursor) == current, current
            if row["[applied]"]:
                return True, replace(taken, cursor=initial_cursor)
            return False, to_shard_state(shard, row)
        current = await self.get_shard(shard)
        for _ in range(CAS_ROUNDS):
            if current.epoch != expect_epoch:
                return False, current
            params = (expect_epoch + 1, owner, shard, current.epoch, current.owner, current.cursor)
            try:
                row = await self._conn.one("bump_epoch", params)
            except Ambiguous:
                settled = await self.get_shard(shard, serial=True)
                if settled == replace(taken, cursor=current.cursor):
                    return True, settled
                current = settled
                continue
            if row["[applied]"]:
                return True, replace(taken, cursor=current.cursor)
            current = to_shard_state(shard, row)
        raise StoreUnavailable(f"shard {shard} kept changing during {CAS_ROUNDS} attempts")

    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("save_cursor", (cursor, shard, epoch))
            except Ambiguous:
                settled = await self.get_shard(shard, serial=True)
                if settled.epoch != epoch:
                    return False
                if settled.cursor == cursor:
                    return True
                continue  # still ours and not written: write again
            return bool(row["[applied]"])
        raise StoreUnavailable(f"shard {shard}: cursor write kept timing out")


async def _gather(aws: Any) -> list[Any]:
    """Run concurrently and wait for all; then raise the first error, if any (so no write of
    this call is still in flight when it fails)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)
