"""Creating jobs in their partitions: ``CassandraStore.create_jobs`` calls ``Creator.create``,
which writes through the store's ``JobRows`` (the ``Rows`` seam).

A job with a fresh id (random, generated for this call) is a plain write: its row and its entry
share a partition key (one mutation, applied atomically), and go in one unlogged batch with its
index row: one round trip. The plain creates of small calls (one ScheduleJob) are group
committed: while one batch is in flight, the creates that arrive wait and go together in the
next one, so concurrent callers share round trips. A job with a key or a chosen id is settled
first by a lightweight transaction (``insert_key``, ``claim_index``), then created
``IF state = null``, batched per partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from timeshard.batching import GroupCommit
from timeshard.clock import Clock
from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.model import BucketEntry, Job
from timeshard.sharding import minute_of, shard_of
from timeshard.store.base import CreateResult
from timeshard.store.cassandra.driver import Ambiguous, Connection
from timeshard.store.cassandra.parts import (
    BYTES_PER_BATCH,
    CAS_ROUNDS,
    Key,
    Lru,
    gather_bounded,
)
from timeshard.store.cassandra.parts import (
    gather as _gather,
)
from timeshard.store.cassandra.parts import (
    homed as _homed,
)
from timeshard.store.cassandra.parts import (
    row_params as _row_params,
)
from timeshard.store.cassandra.parts import (
    sized as _sized,
)
from timeshard.store.cassandra.rows import Found, Row, bounded_history, bucket_ttl


class Rows(Protocol):
    """What creating needs of the job rows it creates in (``JobRows`` is one): the home cache,
    reads, and the plain writes of entries and index rows. A seam, so that ``Creator`` and
    ``JobRows`` do not import each other (the store holds both)."""

    homes: Lru

    async def get(
        self, job_ids: Sequence[str], homes: dict[str, int] | None = None
    ) -> dict[str, Job]: ...

    async def read(self, key: Key, job_ids: Sequence[str], *, serial: bool) -> dict[str, Found]: ...

    async def put_entries(self, entries: Sequence[BucketEntry]) -> None: ...

    async def plain_writes(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None: ...


DECIDE_IN_FLIGHT = 32
"""Lightweight transactions of one create call in flight at once (keys and chosen ids)."""
STAMP_BACK_US = 60_000_000
"""A plain create is stamped this far in the past (see ``create_row`` in cassandra.cql)."""
GROUPED_MAX = 8
"""A call with at most this many plain creates joins the group commit; a larger one (a
ScheduleJobs batch) is a group of its own and writes its partitions' batches at once."""
GROUP_MAX_JOBS = 64
"""Plain creates one group commit takes at a time (sent as batches of ``PARTITIONS_PER_BATCH``,
concurrently)."""
PARTITIONS_PER_BATCH = 10
"""Partitions one grouped batch may touch: Cassandra's default
``unlogged_batch_across_partitions_warn_threshold``, so a grouped batch logs no warning there.
A job takes two (its row and entry share one; its index row is another)."""


@dataclass(frozen=True, slots=True)
class _New:
    index: int
    job: Job
    entry: BucketEntry
    home: int
    revived: bool = False
    """Its index row (or key) was there already: a job made before and purged, or a create
    cut short. Those rows may carry the old job's time to live; a new job rewrites them."""


@dataclass(slots=True, eq=False)
class _Queued:
    """A plain create waiting for its group commit; ``done`` is set once its batch is written."""

    new: _New
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(slots=True)
class _Plan:
    """The jobs of one create call, sorted: those with a fresh id and no key (``plain``),
    those whose owner a lightweight transaction settles first (``to_decide``), and those with
    a key seen before in the call (``repeats``: that job's result is theirs)."""

    plain: list[_New] = field(default_factory=list)
    to_decide: list[tuple[int, Job, BucketEntry]] = field(default_factory=list)
    first_with_key: dict[str, int] = field(default_factory=dict)
    repeats: list[tuple[int, Job]] = field(default_factory=list)

    @classmethod
    def of(cls, jobs: Sequence[tuple[Job, BucketEntry]], fresh: Collection[str]) -> _Plan:
        plan = cls()
        for i, (job, entry) in enumerate(jobs):
            job = bounded_history(job)
            if job.job_id in fresh and not job.idempotency_key:
                plan.plain.append(_New(i, job, entry, entry.minute))
            elif job.idempotency_key in plan.first_with_key:
                plan.repeats.append((i, job))
            else:
                if job.idempotency_key:
                    plan.first_with_key[job.idempotency_key] = i
                plan.to_decide.append((i, job, entry))
        return plan


class Creator:
    def __init__(self, conn: Connection, clock: Clock, num_shards: int, rows: Rows) -> None:
        self._conn = conn
        self._clock = clock
        self._num_shards = num_shards
        self._rows = rows
        self._group: GroupCommit[int, _Queued] = GroupCommit(
            self._write_group, max_items=GROUP_MAX_JOBS, fail=_fail, name="creates"
        )

    async def close(self) -> None:
        await self._group.close()

    async def create(
        self, jobs: Sequence[tuple[Job, BucketEntry]], fresh: Collection[str]
    ) -> list[CreateResult]:
        """A job with a fresh id lives in the partition of its entry's minute: its row and its
        entry go in one unlogged batch with the same partition key (one mutation, applied
        atomically), concurrently with its index row. Other jobs: entries first (a crash leaves
        an entry that finds nothing, never a job without one), then a conditional batch."""
        plan = _Plan.of(jobs, fresh)
        decisions = await gather_bounded(
            (self._decide_owner(i, job, entry) for i, job, entry in plan.to_decide),
            DECIDE_IN_FLIGHT,
        )
        results: dict[int, CreateResult] = {}
        guarded = _guarded(decisions, plan.to_decide, results)
        plain = plan.plain
        writes = []
        if guarded:  # entries first: a crash leaves an entry that finds nothing
            writes.append(self._rows.put_entries([_homed(n.entry, n.home) for n in guarded]))
        if plain:
            writes.append(self._write_plain(plain))
        if len(writes) == 1:
            await writes[0]
        elif writes:
            await _gather(writes)
        parts = await _gather(self._create_guarded(k, ns) for k, ns in _by_home(guarded).items())
        for part in parts:
            results.update(part)
        for n in plain:
            results[n.index] = CreateResult(created=True, job=n.job)
        revived = [n for n in guarded if n.revived and results[n.index].created]
        if revived:
            await self._rows.plain_writes([w for n in revived for w in _lasting(n.job, n.home)])
        for n in [*plain, *guarded]:
            self._rows.homes.put(n.job.job_id, n.home)
        for i, job in plan.repeats:
            owner = results[plan.first_with_key[job.idempotency_key]].job
            conflict = owner.body_digest() != job.body_digest()
            results[i] = CreateResult(created=False, job=owner, conflict=conflict)
        return [results[i] for i in range(len(jobs))]

    async def _decide_owner(self, i: int, job: Job, entry: BucketEntry) -> CreateResult | _New:
        """For a job with a key or a chosen id: settle which call creates it and where.
        Returns the stored job when it exists already, else the job to create."""
        original_id = job.job_id
        if job.idempotency_key:
            key = await self._claim_key(job)
            if key["job_id"] != job.job_id:
                stored = await self._rows.get([key["job_id"]])
                if key["job_id"] in stored:
                    owner = stored[key["job_id"]]
                    conflict = key["digest"] != job.body_digest()
                    return CreateResult(created=False, job=owner, conflict=conflict)
                if key["digest"] != job.body_digest():
                    raise InvalidArgument("idempotency_key", "in use by another job body")
                # The key's job was never written (a crash in between): finish it under its id.
                shard = shard_of(key["job_id"], self._num_shards)
                job = job.with_(job_id=key["job_id"], shard=shard)
                entry = BucketEntry(
                    shard=shard, minute=entry.minute, due_at=entry.due_at, job_id=job.job_id
                )
        adopted = job.job_id != original_id
        home = minute_of(job.run_at)
        index = await self._claim_index(job, home)
        if index is not None:  # created before (maybe half-way): where the index says
            home = index["minute"]
        return _New(i, job, entry, home, revived=adopted or index is not None)

    async def _claim_key(self, job: Job) -> Row:
        params = (job.idempotency_key, job.job_id, job.body_digest())
        try:
            row = await self._conn.one("insert_key", params)
        except Ambiguous as exc:
            rows = await self._conn.rows("select_key", (job.idempotency_key,), serial=True)
            if not rows:
                raise StoreUnavailable(f"idempotency key write timed out: {exc}") from exc
            return rows[0]
        return {"job_id": job.job_id, "digest": job.body_digest()} if row["[applied]"] else row

    async def _claim_index(self, job: Job, home: int) -> Row | None:
        """``None`` when this call wrote the index row; else the row found."""
        params = (job.shard, home, job.job_id)
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._conn.one("claim_index", params)
            except Ambiguous:
                rows = await self._conn.rows("select_index", (job.job_id,), serial=True)
                if not rows:
                    continue
                return rows[0]
            return None if row["[applied]"] else row
        raise StoreUnavailable(f"creating job {job.job_id!r} kept timing out")

    async def _write_plain(self, plain: list[_New]) -> None:
        """Durable when this returns: the rows, entries and index rows of ``plain``."""
        if len(plain) > GROUPED_MAX:
            index = [("insert_index", (n.job.shard, n.home, n.job.job_id, 0)) for n in plain]
            await _gather(
                [
                    self._rows.plain_writes(index),
                    *(self._create_plain(k, ns) for k, ns in _by_home(plain).items()),
                ]
            )
            return
        queued = [_Queued(n) for n in plain]
        for q in queued:
            self._group.submit(0, q)  # one group: every small call may share its batches
        if len(queued) == 1:
            await queued[0].done
        else:
            await _gather(q.done for q in queued)

    async def _write_group(self, _: int, queued: list[_Queued]) -> None:
        """One group commit: its creates in batches of a few partitions each, all at once.
        Each create is settled by its own batch (written, or the batch's error)."""
        chunks = _by_partitions(queued)
        if len(chunks) == 1:
            await self._write_chunk(chunks[0])
        else:
            await asyncio.gather(*(self._write_chunk(c) for c in chunks))

    async def _write_chunk(self, queued: list[_Queued]) -> None:
        now = self._clock.now_ms()
        stamp = now * 1000 - STAMP_BACK_US
        statements: list[tuple[str, Any]] = []
        partitions: set[Key] = set()
        for q in queued:
            n = q.new
            key = (n.job.shard, n.home)
            if key not in partitions:
                partitions.add(key)
                statements.append(("init_epoch", {"shard": key[0], "minute": key[1]}))
            e = n.entry
            statements += [
                ("create_row", {**_row_params(n.job, key), "stamp": stamp}),
                (
                    "insert_entry",
                    (e.shard, e.minute, e.due_at, e.job_id, n.home, bucket_ttl(e.due_at, now)),
                ),
                ("insert_index", (n.job.shard, n.home, n.job.job_id, 0)),
            ]
        try:
            await self._conn.batch(statements, conditional=False)
        except Exception as exc:  # each caller gets its batch's error (StoreUnavailable)
            for q in queued:
                _fail(q, exc)
            return
        for q in queued:
            if not q.done.done():
                q.done.set_result(None)

    async def _create_plain(self, key: Key, news: list[_New]) -> None:
        stamp = self._clock.now_ms() * 1000 - STAMP_BACK_US
        init: tuple[str, Any] = ("init_epoch", {"shard": key[0], "minute": key[1]})
        now = self._clock.now_ms()
        pairs: list[list[tuple[str, Any]]] = []
        for n in news:
            e = n.entry
            entry = (e.shard, e.minute, e.due_at, e.job_id, n.home, bucket_ttl(e.due_at, now))
            pairs.append(
                [
                    ("create_row", {**_row_params(n.job, key), "stamp": stamp}),
                    ("insert_entry", entry),
                ]
            )
        weights = [1024 + len(n.job.payload) for n in news]
        await _gather(
            self._conn.batch([init, *(s for pair in chunk for s in pair)], conditional=False)
            for chunk in _sized(pairs, weights)
        )

    async def _create_guarded(self, key: Key, news: list[_New]) -> dict[int, CreateResult]:
        await self._conn.rows("init_epoch", {"shard": key[0], "minute": key[1]})
        out: dict[int, CreateResult] = {}
        todo = list(news)
        timed_out = False  # a batch of ours may have applied unseen
        for _ in range(CAS_ROUNDS):
            if not todo:
                return out
            statements = [("create_row_if_new", _row_params(n.job, key)) for n in todo]
            try:
                rows = await self._conn.batch(statements, conditional=True)
            except Ambiguous:
                rows, timed_out = [{"[applied]": False}], True
            if rows and rows[0].get("[applied]"):
                out.update({n.index: CreateResult(created=True, job=n.job) for n in todo})
                return out
            stored = await self._rows.read(key, [n.job.job_id for n in todo], serial=True)
            left = []
            for n in todo:
                found = stored.get(n.job.job_id)
                if found is None:
                    left.append(n)
                elif timed_out and found.job == n.job:  # ours: a batch timed out but applied
                    out[n.index] = CreateResult(created=True, job=n.job)
                else:
                    conflict = found.job.body_digest() != n.job.body_digest()
                    out[n.index] = CreateResult(created=False, job=found.job, conflict=conflict)
            todo = left
        raise StoreUnavailable(f"creating {len(todo)} jobs kept conflicting")


def _lasting(job: Job, home: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The index row (and key) of a job created anew, without a time to live."""
    writes: list[tuple[str, tuple[Any, ...]]] = [("insert_index", (job.shard, home, job.job_id, 0))]
    if job.idempotency_key:
        writes.append(("expire_key", (job.job_id, job.body_digest(), job.idempotency_key, 0)))
    return writes


def _fail(q: _Queued, exc: BaseException) -> None:
    if not q.done.done():
        if isinstance(exc, asyncio.CancelledError):
            q.done.cancel()
        else:
            q.done.set_exception(exc)


def _by_partitions(queued: list[_Queued]) -> list[list[_Queued]]:
    """``queued`` in chunks that touch at most ``PARTITIONS_PER_BATCH`` partitions and about
    ``BYTES_PER_BATCH`` bytes each."""
    chunks: list[list[_Queued]] = []
    chunk: list[_Queued] = []
    homes: set[Key] = set()
    size = 0
    for q in queued:
        home = (q.new.job.shard, q.new.home)
        parts = len(homes) + len(chunk) + 1 + (home not in homes)  # homes + index rows
        weight = 1024 + len(q.new.job.payload)
        if chunk and (parts > PARTITIONS_PER_BATCH or size + weight > BYTES_PER_BATCH):
            chunks.append(chunk)
            chunk, homes, size = [], set(), 0
        chunk.append(q)
        homes.add(home)
        size += weight
    if chunk:
        chunks.append(chunk)
    return chunks


def _by_home(news: list[_New]) -> dict[Key, list[_New]]:
    out: dict[Key, list[_New]] = {}
    for n in news:
        out.setdefault((n.job.shard, n.home), []).append(n)
    return out


def _guarded(
    decisions: Sequence[CreateResult | _New],
    to_decide: Sequence[tuple[int, Job, BucketEntry]],
    results: dict[int, CreateResult],
) -> list[_New]:
    """The jobs to create conditionally, once each, from the owners settled for
    ``to_decide``; the result of each job found made already (or twice in the call) goes into
    ``results``."""
    guarded: list[_New] = []
    by_id: dict[str, _New] = {}
    for decided, (i, job, _) in zip(decisions, to_decide, strict=True):
        if isinstance(decided, CreateResult):
            results[i] = decided
            continue
        first = by_id.get(decided.job.job_id)
        if first is not None:  # the same id twice in this call: created once
            conflict = first.job.body_digest() != job.body_digest()
            results[i] = CreateResult(created=False, job=first.job, conflict=conflict)
            continue
        by_id[decided.job.job_id] = decided
        guarded.append(decided)
    return guarded
