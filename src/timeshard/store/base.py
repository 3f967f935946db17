"""The job store contract. Cassandra-shaped: every write to a job row is conditional and says
whether it applied and what it found; bucket partitions are ``(shard, minute)`` clustered by
``(due_at, job_id)`` and are insert-only.

Every implementation (``sqlite``, ``cassandra``) passes the one suite in ``tests/contract``.

Vocabulary:
- *applied*: the condition held and the whole write took effect, durably (QUORUM on Cassandra)
  before the call returns. When it did not apply, nothing changed.
- ``WriteResult.job``: the row after the write when applied, the row as found when not (None when
  the job does not exist).
- Times are epoch milliseconds, UTC.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from timeshard.errors import InvalidArgument
from timeshard.ledger import DEFAULT_LEDGER_RETENTION_S
from timeshard.limits import DEFAULT_MAX_UNSTARTED
from timeshard.model import (
    BucketEntry,
    Job,
    JobState,
    Schedule,
    ShardState,
    WriteResult,
)
from timeshard.sharding import minute_of
from timeshard.store import pages
from timeshard.store.listing import JobOrder, JobQuery, JobSlice
from timeshard.store.schedules import ScheduleStore
from timeshard.store.stats import StoreStats


def entry_for(job: Job, attention_at: int, now: int) -> BucketEntry:
    """The bucket entry that makes the dispatcher look at ``job`` at ``attention_at``.

    Late writes (invariant 4): a time already past is written as due *now*, into the bucket of
    the current minute, which the dispatcher is still reading: a dispatcher advances its cursor
    past a minute only ``settle`` after the minute ended, so it is never behind this bucket.
    """
    return entry_at(job.shard, job.job_id, attention_at, now)


def entry_at(
    shard: int, ident: str, attention_at: int, now: int, *, home: int | None = None
) -> BucketEntry:
    due = max(attention_at, now)
    return BucketEntry(shard=shard, minute=minute_of(due), due_at=due, job_id=ident, home=home)


def schedule_entry(schedule: Schedule, attention_at: int, now: int) -> BucketEntry:
    """The entry that makes the dispatcher of the schedule's shard look at it (cron follow-ups
    are entries in the same buckets as jobs)."""
    return entry_at(schedule.shard, schedule.entry_id, attention_at, now)


@dataclass(frozen=True, kw_only=True, slots=True)
class CreateResult:
    """``created``: this call wrote the job. Otherwise ``job`` is the job already stored under
    the same id or idempotency key; ``conflict`` says the stored body differs."""

    created: bool
    job: Job
    conflict: bool = False


def repeats_due(results: Sequence[CreateResult], now: int) -> list[BucketEntry]:
    """Entries to write again, due now, for the creates that found their job made already and
    due: the call that made it may have been cut off before the owner read its entry (a crash
    before it wrote a late entry again), and the repeat is acknowledged. An extra entry is
    harmless: the dispatcher looks at the row."""
    return [
        entry_at(r.job.shard, r.job.job_id, now, now)
        for r in results
        if not r.created and r.job.state is JobState.SCHEDULED and r.job.run_at <= now
    ]


@dataclass(frozen=True, slots=True)
class Completion:
    """One job of ``Store.complete_jobs``: its fence, and the handler's result (checked by
    the caller: ``validate_result``)."""

    job_id: str
    fence: int
    result: bytes = b""
    encoding: str = ""
    worker: str = ""
    """The lease's worker, to name it (``Store.heartbeat``); "" leaves the name as it is."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobClaim:
    job_id: str
    expect_fence: int
    worker: str
    now: int
    lease_until: int
    ahead_ms: int = 0
    """A claim ahead (``DispatchConfig.claim_ahead_ms``): the job may be due up to this long
    after ``now``; its owner holds it and hands it to a worker no earlier than its due time,
    which is the attempt's claim time."""
    known: Job | None = None
    """The row as the caller last read it. A store may compare against it instead of reading
    the row again; if it is stale the write does not apply and the store goes on from the row
    it finds, so a stale one costs a retry, never a wrong claim."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobPage:
    jobs: list[Job]
    next_token: str
    total: int | None = None
    """The jobs matching the listing's filters on every page, counted by this page's read;
    None when not counted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Retention:
    """How long finished jobs are kept (Cassandra: TTL; SQLite: a sweep every minute)."""

    finished_s: int = 7 * 24 * 3600
    """Succeeded, cancelled and expired jobs (and their idempotency keys) live this long."""
    dead_s: int = 30 * 24 * 3600
    """Dead letters live this long unless replayed or purged."""
    index_s: int = 30 * 24 * 3600
    """Cassandra: the id index outlives a finished row by this much, so a get can say it
    expired rather than that it never existed."""
    audit_s: int = 90 * 24 * 3600
    """The operator console's audit entries live this long."""

    ledger_s: int = DEFAULT_LEDGER_RETENTION_S
    """Occurrence ledger rows live this long after their decision."""

    def __post_init__(self) -> None:
        for name in ("finished_s", "dead_s", "index_s", "ledger_s", "audit_s"):
            if getattr(self, name) < 1:
                raise InvalidArgument("retention", f"{name} must be at least 1 second")

    def ttl(self, job: Job) -> int:
        """Seconds a job in its state is kept from now (0: as long as it is not finished)."""
        if job.state is JobState.DEAD:
            return self.dead_s
        return self.finished_s if job.state.terminal else 0


MaxUnstarted = int | Callable[[Job], int]
"""Deliveries without a handler start before a job is dead: a number, or decided from the job as
stored (its type's policy)."""

RetryAt = int | None | Callable[[Job], int | None]
"""When to retry a failed job: a time, None (dead-letter it), or decided from the job as
stored (its attempt and max_attempts), so the caller need not read the job first."""


class Store(ScheduleStore):
    """The source of truth for jobs, buckets and shard state; schedules, their revisions and
    their ledger are the part it inherits (``store.schedules``)."""

    num_shards: int
    retention: Retention
    """How long finished jobs, dead letters, ledger rows and a deleted schedule's history live."""
    stats: StoreStats
    """What the store did (Paxos rounds, operations, errors): for metrics and benchmarks."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and create or migrate the schema. Idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. The store can not be used afterwards."""

    # -- jobs -----------------------------------------------------------------------------

    @abc.abstractmethod
    async def create_jobs(
        self, jobs: Sequence[tuple[Job, BucketEntry]], *, fresh: Collection[str] = frozenset()
    ) -> list[CreateResult]:
        """Create each job row if its id is new, and its bucket entry; both are durable when
        this returns (invariant 1). A job with an ``idempotency_key`` is created once per key: a
        repeat returns the stored job, with ``conflict`` set when its ``body_digest`` differs.
        A crash between the key and the row leaves a key that the next repeat completes.

        ``fresh``: ids generated for this call (random, 128 bits) that no other call can use
        and this call does not repeat: the store may skip the check that the id is new."""

    @abc.abstractmethod
    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs that exist among ``job_ids``."""

    async def get_job(self, job_id: str) -> Job | None:
        return (await self.get_jobs([job_id])).get(job_id)

    async def find_existing(self, keyed: Sequence[Job], chosen: Sequence[Job]) -> dict[str, Job]:
        """The stored jobs these would collide with: by idempotency key for ``keyed`` (the
        result is keyed by the key), by id for ``chosen`` (keyed by the id). A read, so a
        batch can be refused before anything of it is written."""
        found: dict[str, Job] = {}
        owners = await self.key_owners([j.idempotency_key for j in keyed])
        stored = await self.get_jobs([*owners.values(), *(j.job_id for j in chosen)])
        for key, job_id in owners.items():
            if job_id in stored:
                found[key] = stored[job_id]
        for j in chosen:
            if j.job_id in stored:
                found[j.job_id] = stored[j.job_id]
        return found

    @abc.abstractmethod
    async def key_owners(self, keys: Sequence[str]) -> dict[str, str]:
        """Idempotency key -> the id of the job it was used for, for the keys stored."""

    async def get_jobs_for(self, entries: Sequence[BucketEntry]) -> dict[str, Job]:
        """The jobs the dispatcher's entries point to, as stored now. A store that keeps rows
        in partitions may use ``BucketEntry.home`` to read them without looking them up, and
        fences the owner's reads (a partition's epoch is raised before its owner reads it)."""
        return await self.get_jobs(sorted({e.job_id for e in entries}))

    async def clock_ms(self) -> int | None:
        """The store's own clock (epoch ms), to check this node's against; None for a store
        without one (the embedded store shares this machine's clock)."""
        return None

    def expired(self, job_id: str) -> bool:
        """After ``get_job`` found nothing: whether the job existed and expired (retention)."""
        return False

    async def list_jobs(
        self,
        *,
        state: JobState | None,
        job_type: str | None,
        limit: int,
        page_token: str,
    ) -> JobPage:
        """Jobs by id, filtered by state and type, not counted (``find_jobs``)."""
        query = JobQuery(
            states=frozenset([state] if state else []), job_type=job_type or "", order=JobOrder.ID
        )
        return await self.find_jobs(query, limit=limit, page_token=page_token)

    async def find_jobs(
        self, query: JobQuery, *, limit: int, page_token: str, count: bool = False
    ) -> JobPage:
        """The jobs that match ``query``, in its order (ties by id), at most ``limit`` after
        the position ``page_token`` names; ``next_token`` is empty on the last page. With
        ``count``, ``total`` is the number of jobs matching, on every page.

        A page token is one this store gave out for the same query (``store.pages``: checked,
        bound to the query); any other is ``InvalidArgument`` naming ``page_token``. A page
        goes on strictly after the last job of the one before, so a job that changed
        meanwhile (cancelled, rescheduled) is neither skipped by the jobs after it moving up
        nor listed twice unless its place in the order moved past the position. An exact
        ``key`` is a lookup (the idempotency key's job), not a scan."""
        if limit < 1:
            raise InvalidArgument("limit", f"must be at least 1, got {limit}")
        after = pages.position_of(page_token, "jobs", query.digest, (int, str))
        if query.key:
            found = await self._keyed_job(query, after)
        else:
            found = await self.select_jobs(query, limit=limit, after=after, count=count)
        token = pages.encode("jobs", query.digest, list(found.resume)) if found.resume else ""
        return JobPage(jobs=found.jobs, next_token=token, total=found.total)

    async def _keyed_job(self, query: JobQuery, after: tuple[int, str] | None) -> JobSlice:
        owner = (await self.key_owners([query.key])).get(query.key)
        job = await self.get_job(owner) if owner else None
        if job is None or not query.matches(job):
            return JobSlice(jobs=[], resume=None, total=0)
        if after is not None and query.position(job) <= after:
            return JobSlice(jobs=[], resume=None, total=1)
        return JobSlice(jobs=[job], resume=None, total=1)

    @abc.abstractmethod
    async def select_jobs(
        self, query: JobQuery, *, limit: int, after: tuple[int, str] | None, count: bool
    ) -> JobSlice:
        """At most ``limit`` jobs that match ``query`` (every filter but ``key``, which
        ``find_jobs`` looks up), in the order of ``query.position``, each strictly after
        ``after``; ``resume`` is the position of the last of them when more match after it.
        With ``count``, ``total`` counts every job that matches (a store may count anyway).
        A job that no longer matches when its row is read whole may be left out of the page;
        ``resume`` is then still where the page ended."""

    async def dead_letters(self, *, limit: int, latest: int) -> tuple[int, list[Job]]:
        """How many jobs are dead (the count may stop once it reaches ``limit``) and the
        ``latest`` of them to die, newest first: the dead-letter queue's size for the metrics
        and the status page. This default pages through ``list_jobs``, which must then read
        the dead jobs only (SQLite has an index by state); a store whose listing reads every
        job keeps an index of the dead ones instead."""
        count, token, newest = 0, "", list[Job]()
        while count < limit:
            page = await self.list_jobs(
                state=JobState.DEAD, job_type=None, limit=1000, page_token=token
            )
            count += len(page.jobs)
            newest = sorted([*newest, *page.jobs], key=lambda j: -j.finished_at)[:latest]
            token = page.next_token
            if not token:
                break
            await asyncio.sleep(0)  # a long queue: let the loop serve others between pages
        return count, newest

    # -- buckets --------------------------------------------------------------------------

    @abc.abstractmethod
    async def add_entries(self, entries: Sequence[BucketEntry]) -> None:
        """Insert bucket entries (an upsert of identical rows; buckets are insert-only)."""

    @abc.abstractmethod
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
        """Entries of partition (shard, minute) with ``due_from <= due_at < due_to`` in
        ``(due_at, job_id)`` order, strictly after ``after`` when given (paging)."""

    async def read_buckets(
        self,
        shards: Sequence[int],
        minute: int,
        *,
        due_from: int,
        due_to: int,
        limit: int = 1000,
    ) -> dict[int, list[BucketEntry]]:
        """The first page of ``read_bucket`` for each of ``shards`` (same minute and range):
        shard -> its entries in order, at most ``limit`` each (a shard that got ``limit`` has
        more: read them with ``read_bucket(after=...)``). A store that can read many
        partitions in one request does (the node reads every shard it owns each second); this
        default reads them one after another."""
        out: dict[int, list[BucketEntry]] = {}
        for shard in shards:
            out[shard] = await self.read_bucket(
                shard, minute, due_from=due_from, due_to=due_to, limit=limit
            )
        return out

    # -- conditional job writes (the lease protocol) --------------------------------------

    @abc.abstractmethod
    async def claim_jobs(self, claims: Sequence[JobClaim]) -> list[WriteResult]:
        """For each claim, applied iff the job is ``scheduled`` with ``fence == expect_fence``,
        due (``run_at <= now``) and not past its deadline (``now <= deadline``, when it has one):
        sets ``running``, ``lease_owner=worker``, ``lease_until``, ``attempt+1``, ``fence+1``,
        ``started_at=now``, appends an Attempt to the history, and writes the bucket entry that
        checks the lease at ``lease_until`` (invariant 2)."""

    @abc.abstractmethod
    async def heartbeat(
        self,
        job_id: str,
        fence: int,
        lease_until: int,
        *,
        started: bool = False,
        worker: str = "",
    ) -> WriteResult:
        """Applied iff ``running`` with this fence: ``lease_until`` moves (never backwards);
        ``started`` (the heartbeat carries the worker's start notice) sets ``start_noticed``.
        No bucket entry is written: the dispatcher chases an extended lease when its old
        check comes due. ``worker`` (here and in the other writes of a lease's worker): the
        lease and its attempt are named after that worker, for a job claimed ahead in its
        owner's name (``transitions.named``); "" leaves the name as it is."""

    @abc.abstractmethod
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
        """Applied iff ``running`` with this fence: ``succeeded``, ``finished_at=now``, and the
        handler's ``result`` (with its ``result_encoding``) stored on the job, kept as long as
        the job is (its retention)."""

    async def complete_jobs(
        self, items: Sequence[Completion], now: int, *, linger_s: float = 0.0
    ) -> list[WriteResult]:
        """``complete_job`` for many jobs, a result each in their order; each is conditional on
        its own fence, and one that does not apply leaves the others as they are. A store
        writes them together (one transaction, or a batch per partition); this default writes
        them one by one. ``linger_s``: a store may hold each up to that long to share a write
        with others of its partition (Cassandra: one Paxos round for them and the next claim);
        the caller gives 0 when someone waits for them (a job under a concurrency limit)."""
        return list(
            await asyncio.gather(
                *(
                    self.complete_job(
                        c.job_id,
                        c.fence,
                        now,
                        result=c.result,
                        result_encoding=c.encoding,
                        worker=c.worker,
                    )
                    for c in items
                )
            )
        )

    @abc.abstractmethod
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
        """Applied iff ``running`` with this fence. With a retry time (given, or computed
        from the stored job): ``scheduled`` at that time plus its bucket entry; without:
        ``dead`` (the dead-letter queue).
        The error is recorded on the job and its last Attempt, the traceback on the Attempt."""

    @abc.abstractmethod
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
        """Applied iff ``running`` with this fence and ``lease_until <= now``. If its handler
        started (``started``: the caller holds a start notice; or ``start_noticed`` in the
        row), the attempt failed with ``"lease expired"`` (its error and its outcome in the
        history); then, as ``fail_job``: with a retry time (given, or computed from the stored
        job: attempts left, the type's backoff) ``scheduled`` at that time plus its bucket
        entry; without, ``dead``. If not, as ``give_back_job(not_started=True)`` (invariant 9).
        The fence stays; the next claim moves it."""

    @abc.abstractmethod
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
        """Applied iff ``running`` with this fence (the lease holder asks, e.g. a worker
        shutting down): ``scheduled`` at ``now`` plus its bucket entry, ``attempt - 1`` (the
        attempt does not count against ``max_attempts``), the attempt closed as ``given back``
        with ``reason``. ``not_started`` (its handler never started): ``run_at`` kept, the
        delivery closed as ``not started``, ``unstarted + 1``, and ``dead`` ("never started")
        once that reaches ``max_unstarted``. The fence stays; the next claim moves it."""

    @abc.abstractmethod
    async def amend_lease_end(
        self, job_id: str, fence: int, now: int, *, started: bool, reason: str = ""
    ) -> WriteResult:
        """A late word from the worker of the lease ``fence`` (it came after the lease's end
        was written) amends how that end was counted (invariant 9), as one conditional write.
        Applied iff the job is ``scheduled`` at this fence (not claimed again, not finished)
        and its newest history entry is that lease's end, and:

        - ``started`` (a start notice, a heartbeat carrying it, a result): the lease ran out
          with no start notice (``not started: lease over with no start notice ...``,
          ``start_noticed`` false). The attempt counts: ``attempt + 1``, ``unstarted - 1``,
          ``start_noticed``, the entry's outcome ``lease expired`` with its error (and
          ``last_error``) saying the notice came after the lease's end.
        - not ``started`` (the worker gave it back not started, ``reason``): the lease ran out
          counted, ``lease expired``. The attempt does not count: ``attempt - 1``,
          ``unstarted + 1``, ``start_noticed`` false, the entry ``not started`` with ``reason``
          (and ``last_error``).

        Nothing else changes: the state, fence, ``run_at`` and bucket entry stay, and an
        amend never makes a job dead. A claim (or any write) that raced it wins or loses
        whole: Cassandra compares the row's image, ``attempt`` included."""

    @abc.abstractmethod
    async def expire_job(self, job_id: str, fence: int, now: int, reason: str) -> WriteResult:
        """Applied iff ``scheduled`` with this fence and its deadline is before ``now`` (a
        claim at ``now`` would be refused): ``expired``, ``finished_at=now``, ``reason`` as
        its ``last_error``; kept for the retention of finished jobs. No bucket entry."""

    @abc.abstractmethod
    async def cancel_job(
        self, job_id: str, expect_state: JobState, fence: int, now: int
    ) -> WriteResult:
        """Applied iff the job is in ``expect_state`` (scheduled or running) with this fence:
        ``cancelled``, the lease revoked (``fence+1``, so its worker is stale)."""

    @abc.abstractmethod
    async def reschedule_job(
        self,
        job_id: str,
        fence: int,
        run_at: int,
        now: int,
        expect_state: JobState = JobState.SCHEDULED,
    ) -> WriteResult:
        """Applied iff ``scheduled`` with this fence: ``run_at`` moves and its bucket entry is
        written. ``expect_state`` ``running``: applied iff the job is a lease claimed ahead
        with this fence, not yet due at ``now`` and with no start notice in the row: the lease
        ends (``fence + 1``), the attempt is not counted and is closed ``rescheduled``, and the
        job is ``scheduled`` at ``run_at`` or, if later, the lease's end, with its bucket
        entry; ``amend_lease_end`` (``started``) counts the attempt if its handler had started
        after all (``transitions.reschedule_ahead``)."""

    @abc.abstractmethod
    async def replay_job(self, job_id: str, fence: int, run_at: int, now: int) -> WriteResult:
        """Applied iff ``dead`` with this fence: ``scheduled`` at ``run_at`` with a fresh
        attempt count (``attempt=0``), the same id and idempotency key, the history kept,
        plus its bucket entry."""

    @abc.abstractmethod
    async def purge_job(self, job_id: str, fence: int) -> WriteResult:
        """Applied iff ``dead`` with this fence: the job row is deleted (its bucket entries,
        insert-only, then find nothing). ``WriteResult.job`` is the row as it was."""

    # -- per-type policies ----------------------------------------------------------------

    @abc.abstractmethod
    async def put_type_policy(self, job_type: str, policy: str) -> None:
        """Store ``policy`` (its text, as the node encodes it) for ``job_type``, replacing
        what was there: the last write wins. Durable when it returns."""

    @abc.abstractmethod
    async def type_policies(self) -> dict[str, str]:
        """Every stored per-type policy, by job type."""

    @abc.abstractmethod
    async def put_type_setting(self, job_type: str, setting: str, value: str) -> None:
        """Store ``value`` (its text) as ``job_type``'s ``setting`` (one of
        ``TYPE_SETTINGS``), replacing what was there: the last write wins. Each setting is a
        row of its own, so writing one never undoes a concurrent write of another (a worker
        declaring its policy does not resume a type an operator paused). Durable when it
        returns."""

    @abc.abstractmethod
    async def type_settings(self, setting: str) -> dict[str, str]:
        """Every stored value of ``setting``, by job type."""

    # -- the operator audit ----------------------------------------------------------------

    @abc.abstractmethod
    async def add_audit(self, at_ms: int, entry_id: str, entry: str) -> None:
        """Store one operator action at ``at_ms`` (``entry``: its text, as the console encodes
        it) under ``entry_id``, unique (the same id again replaces it). It is kept for
        ``Retention.audit_s`` after ``at_ms``. Durable when it returns."""

    @abc.abstractmethod
    async def audit(self, *, now_ms: int, limit: int) -> list[str]:
        """The newest ``limit`` actions still kept at ``now_ms``, newest first."""

    # -- shards (invariant 7) -------------------------------------------------------------

    @abc.abstractmethod
    async def get_shard(self, shard: int) -> ShardState:
        """The shard's state; epoch 0 and cursor 0 if never taken."""

    @abc.abstractmethod
    async def acquire_shard(
        self, shard: int, owner: str, expect_epoch: int, initial_cursor: int
    ) -> tuple[bool, ShardState]:
        """Applied iff the stored epoch is ``expect_epoch`` (0 = never taken; the row is then
        created with ``initial_cursor``): ``epoch+1`` and ``owner``. Returns the state after
        (applied) or as found."""

    @abc.abstractmethod
    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        """Applied iff the stored epoch is still ``epoch``; a deposed owner changes nothing."""
