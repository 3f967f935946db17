"""The production store: Apache Cassandra 5.0 through cassandra-driver.

How the contract maps onto Cassandra:

- Every write to a job row is a lightweight transaction. The store reads the row, checks the
  contract's condition, and writes with ``IF`` on the row image it read (state and fence, plus
  the columns its new values were computed from, such as attempt and history). When the write
  does not apply, Cassandra returns the row's current image; if the condition still holds there
  (someone renewed a lease meanwhile), the write is tried again on that image, otherwise the
  outcome is "not applied" with that row. So the condition is decided by Paxos, never by a read.
- A conditional write that times out has an unknown outcome; a SERIAL read settles it (it
  finishes or discards any Paxos round in flight) before the store answers.
- Bucket entries are written *before* the job write they belong to: a crash in between leaves
  an entry whose job does not need attention then (harmless, the dispatcher compares every
  entry with the row), never a job without an entry (invariant 2).
- Plain writes and reads use LOCAL_QUORUM, conditional writes LOCAL_SERIAL (both configurable).
- Driver futures are adapted to asyncio futures: no thread per query, the loop never blocks.
  Only ``open`` and ``close`` (connecting, migrating, preparing) run in an executor thread.
- Driver errors become ``StoreUnavailable`` (``raise ... from``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, unquote

from cassandra import (
    ConsistencyLevel,
    CoordinationFailure,
    OperationTimedOut,
    Timeout,
    Unavailable,
    WriteTimeout,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
)
from cassandra.connection import ConnectionException
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage, ServerError
from cassandra.query import PreparedStatement, dict_factory

from timeshard.clock import Clock, SystemClock
from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.model import (
    BucketEntry,
    Job,
    JobState,
    MisfirePolicy,
    Outcome,
    OverlapPolicy,
    Schedule,
    ShardState,
)
from timeshard.sharding import DEFAULT_NUM_SHARDS, shard_of, validate_num_shards
from timeshard.store import transitions as T
from timeshard.store.base import (
    MAX_HISTORY,
    ClaimRequest,
    CreateResult,
    JobPage,
    Store,
    entry_for,
    history_from_json,
    history_to_json,
)
from timeshard.store.named import load_queries

Q = load_queries("cassandra.cql")
Row = dict[str, Any]

BUCKET_RETENTION_S = 7 * 24 * 3600
"""Bucket entries live this long past their due time (then TWCS drops them whole)."""
MAX_TTL_S = 20 * 365 * 24 * 3600  # Cassandra's limit; entries due later get no TTL at all
CAS_ROUNDS = 20
"""Conditional writes retried on a row that changed but still meets the condition."""
LIST_SCAN_MAX = 10_000
"""Rows ``list_jobs`` reads per call at most; a sparse filter may return a short page."""

IMAGE = (
    "state",
    "fence",
    "attempt",
    "run_at",
    "lease_owner",
    "lease_until",
    "started_at",
    "finished_at",
    "last_error",
    "history",
)
"""The mutable columns of a job row: every conditional write compares all of them."""

_SERIAL = "serial-read"
_CONSISTENCY = {  # durable before acknowledged: a quorum at least (invariant 1)
    "local_quorum": ConsistencyLevel.LOCAL_QUORUM,
    "quorum": ConsistencyLevel.QUORUM,
    "each_quorum": ConsistencyLevel.EACH_QUORUM,
    "all": ConsistencyLevel.ALL,
}
_SERIAL_CONSISTENCY = {
    "serial": ConsistencyLevel.SERIAL,
    "local_serial": ConsistencyLevel.LOCAL_SERIAL,
}


UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    Unavailable,
    Timeout,
    CoordinationFailure,
    OperationTimedOut,
    NoHostAvailable,
    ConnectionException,
    OverloadedErrorMessage,
    IsBootstrappingErrorMessage,
    ServerError,
    OSError,
)
"""Driver errors that mean "not now": translated into ``StoreUnavailable``. Others (a bad
query, a bad keyspace) are bugs or configuration errors and propagate as they are."""
_MAYBE_APPLIED: tuple[type[BaseException], ...] = (
    WriteTimeout,
    OperationTimedOut,
    NoHostAvailable,
    ConnectionException,
)
"""Errors after which a conditional write may have been applied."""


class _Ambiguous(Exception):
    """A conditional write timed out: it may or may not have been applied."""


@dataclass(frozen=True, slots=True)
class _Found:
    """A job as read, with the raw values its next conditional write must compare."""

    job: Job
    image: Row

    def after(self, current: Row) -> _Found:
        """This row with the current image Cassandra returned from a write that did not apply
        (the other columns are fixed when the job is created)."""
        image = {k: current[k] for k in IMAGE}
        return _Found(job=_to_job({**_job_columns(self.job), **image}), image=image)


def _to_job(row: Row) -> Job:
    return Job(
        job_id=row["job_id"],
        shard=row["shard"],
        job_type=row["type"],
        payload=bytes(row["payload"] or b""),
        state=JobState(row["state"]),
        run_at=row["run_at"],
        created_at=row["created_at"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        fence=row["fence"],
        lease_owner=row["lease_owner"] or "",
        lease_until=row["lease_until"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        idempotency_key=row["idempotency_key"] or "",
        last_error=row["last_error"] or "",
        history=history_from_json(row["history"]),
    )


def _job_columns(job: Job) -> Row:
    return {
        "job_id": job.job_id,
        "shard": job.shard,
        "type": job.job_type,
        "payload": job.payload,
        "created_at": job.created_at,
        "max_attempts": job.max_attempts,
        "idempotency_key": job.idempotency_key,
        "state": job.state.value,
        "run_at": job.run_at,
        "attempt": job.attempt,
        "fence": job.fence,
        "lease_owner": job.lease_owner,
        "lease_until": job.lease_until,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "last_error": job.last_error,
        "history": history_to_json(job.history),
    }


def _found(row: Row | None) -> _Found | None:
    if row is None:
        return None
    return _Found(job=_to_job(row), image={k: row[k] for k in IMAGE})


def _bounded_history(job: Job) -> Job:
    """Keep the newest ``MAX_HISTORY`` attempts, as stored."""
    if len(job.history) <= MAX_HISTORY:
        return job
    return job.with_(history=job.history[-MAX_HISTORY:])


def _shard_state(shard: int, row: Row) -> ShardState:
    if row.get("epoch") is None:
        return ShardState(shard=shard)
    return ShardState(shard=shard, epoch=row["epoch"], owner=row["owner"], cursor=row["cursor"])


def _to_schedule(row: Row) -> Schedule:
    return Schedule(
        schedule_id=row["schedule_id"],
        shard=row["shard"],
        cron=row["cron"],
        timezone=row["timezone"],
        dst_gap=row["dst_gap"] or "",
        dst_fold=row["dst_fold"] or "",
        job_type=row["type"],
        payload=bytes(row["payload"] or b""),
        max_attempts=row["max_attempts"],
        misfire=MisfirePolicy(row["misfire"]),
        misfire_grace_ms=row["misfire_grace_ms"],
        max_catchup=row["max_catchup"],
        overlap=OverlapPolicy(row["overlap"]),
        max_concurrent=row["max_concurrent"],
        jitter_ms=row["jitter_ms"],
        paused=bool(row["paused"]),
        next_fire=row["next_fire"],
        created_at=row["created_at"],
        version=row["version"],
        active=tuple(json.loads(row["active"] or "[]")),
        queued_at=row["queued_at"],
        skipped=row["skipped"],
        last_skip_at=row["last_skip_at"],
        last_fire_at=row["last_fire_at"],
    )


def _schedule_columns(s: Schedule) -> Row:
    return {
        "schedule_id": s.schedule_id,
        "shard": s.shard,
        "cron": s.cron,
        "timezone": s.timezone,
        "dst_gap": s.dst_gap,
        "dst_fold": s.dst_fold,
        "type": s.job_type,
        "payload": s.payload,
        "max_attempts": s.max_attempts,
        "misfire": s.misfire.value,
        "misfire_grace_ms": s.misfire_grace_ms,
        "max_catchup": s.max_catchup,
        "overlap": s.overlap.value,
        "max_concurrent": s.max_concurrent,
        "jitter_ms": s.jitter_ms,
        "paused": s.paused,
        "next_fire": s.next_fire,
        "created_at": s.created_at,
        "version": s.version,
        "active": json.dumps(list(s.active)),
        "queued_at": s.queued_at,
        "skipped": s.skipped,
        "last_skip_at": s.last_skip_at,
        "last_fire_at": s.last_fire_at,
    }


def bucket_ttl(due_at: int, now: int) -> int:
    """Seconds a bucket entry lives: until ``BUCKET_RETENTION_S`` after it is due (0: forever,
    for the rare entry due further out than Cassandra's TTL limit)."""
    ttl = max(0, due_at - now) // 1000 + BUCKET_RETENTION_S
    return ttl if ttl <= MAX_TTL_S else 0


def _unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"Cassandra: {type(exc).__name__}: {exc}")


class _Pages:
    """The rows of one ``execute_async`` call, every page, as an awaitable: the driver's
    callbacks (on its I/O thread) hand each page to the event loop."""

    def __init__(self, rf: ResponseFuture, loop: asyncio.AbstractEventLoop) -> None:
        self._rf = rf
        self._loop = loop
        self._page: asyncio.Future[list[Row]] = loop.create_future()
        rf.add_callbacks(self._on_rows, self._on_error)

    def _deliver(self, rows: list[Row] | None, exc: BaseException | None) -> None:
        fut = self._page
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(list(rows or []))

    def _on_rows(self, rows: list[Row] | None) -> None:
        self._hand_over(rows, None)

    def _on_error(self, exc: BaseException) -> None:
        self._hand_over(None, exc)

    def _hand_over(self, rows: list[Row] | None, exc: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._deliver, rows, exc)

    async def all_rows(self) -> list[Row]:
        rows: list[Row] = []
        while True:
            rows.extend(await self._page)
            if not self._rf.has_more_pages:
                return rows
            self._page = self._loop.create_future()
            self._rf.start_fetching_next_page()


# -- schema -------------------------------------------------------------------------------

MIGRATION_WAIT_S = 120.0
"""How long to wait for another process's migration before taking it over."""


def replication_map(*, rf: str | None = None, dcs: str | None = None) -> dict[str, str | int]:
    """``rf`` for SimpleStrategy (default 1), or ``dcs`` = ``"dc1:3,dc2:3"`` for
    NetworkTopologyStrategy."""
    if dcs:
        strategy: dict[str, str | int] = {"class": "NetworkTopologyStrategy"}
        for item in dcs.split(","):
            name, _, count = item.partition(":")
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or not count.isdigit():
                raise InvalidArgument("dc", f"{item!r}: expected DATACENTER:REPLICAS")
            strategy[name] = int(count)
        return strategy
    if rf is not None and not rf.isdigit():
        raise InvalidArgument("rf", f"{rf!r} is not a replication factor")
    return {"class": "SimpleStrategy", "replication_factor": int(rf or 1)}


def queries_for(keyspace: str) -> dict[str, str]:
    """The named queries with their tables qualified by ``keyspace``."""
    return {name: text.replace("{keyspace}", keyspace) for name, text in Q.items()}


def _cql_map(mapping: Mapping[str, str | int]) -> str:
    items = (f"'{k}': {v if isinstance(v, int) else repr(str(v))}" for k, v in mapping.items())
    return "{" + ", ".join(items) + "}"


def _migrations(queries: Mapping[str, str]) -> list[tuple[int, str, list[str]]]:
    """``migrate_<version>_<what>`` statements grouped by version, in file order."""
    versions: dict[int, list[tuple[str, str]]] = {}
    for name, text in queries.items():
        if m := re.fullmatch(r"migrate_(\d+)_(\w+)", name):
            versions.setdefault(int(m[1]), []).append((m[2], text))
    return [
        (v, ",".join(what for what, _ in steps), [text for _, text in steps])
        for v, steps in sorted(versions.items())
    ]


def migrate(
    session: Any,
    keyspace: str,
    replication: Mapping[str, str | int],
    *,
    owner: str,
    now_ms: Callable[[], int],
) -> None:
    """Create the keyspace and apply each migration not yet recorded in
    ``schema_migrations`` (blocking; runs in an executor thread).

    A migration is claimed with ``INSERT ... IF NOT EXISTS`` before its DDL runs, so two nodes
    starting together do not issue the same schema change at once (concurrent CREATE TABLE can
    leave Cassandra with two table ids); the other waits until it is recorded as done."""
    q = queries_for(keyspace)
    session.execute(q["ddl_keyspace"].replace("{replication}", _cql_map(replication)))
    session.execute(q["ddl_schema_migrations"])
    stmt = {n: session.prepare(q[n]) for n in q if n.endswith("migration")}
    stmt["select_migrations"] = session.prepare(q["select_migrations"])
    for version, name, statements in _migrations(q):
        holder = owner
        row = session.execute(stmt["claim_migration"], (version, name, owner)).one()
        if not row["[applied]"]:
            if row["done"]:
                continue
            holder = row["owner"]
        deadline = time.monotonic() + MIGRATION_WAIT_S
        while holder != owner:
            done = {r["version"]: r for r in session.execute(stmt["select_migrations"])}
            if done[version]["done"]:
                break
            if time.monotonic() > deadline:
                took = session.execute(stmt["take_over_migration"], (owner, version, holder))
                holder = owner if took.one()["[applied]"] else done[version]["owner"]
                deadline = time.monotonic() + MIGRATION_WAIT_S
            time.sleep(0.5)
        if holder == owner:
            for text in statements:
                session.execute(text)
            session.execute(stmt["finish_migration"], (now_ms(), version, owner))


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterConfig:
    contact_points: tuple[tuple[str, int], ...]
    keyspace: str
    replication: Mapping[str, str | int]
    consistency: str = "local_quorum"
    serial_consistency: str = "local_serial"
    local_dc: str | None = None
    username: str | None = None
    password: str | None = None
    request_timeout: float = 15.0


def parse_url(url: str) -> ClusterConfig:
    """``cassandra://[user:password@]HOST:PORT[,HOST:PORT]/KEYSPACE[?options]``.

    Options: ``rf=N`` (SimpleStrategy), or ``dc=NAME:N[,NAME:N]`` (NetworkTopologyStrategy);
    ``consistency=local_quorum|quorum``, ``serial=local_serial|serial``, ``local_dc=NAME``.
    """
    if not url.startswith("cassandra://"):
        raise InvalidArgument("store", f"{url!r} is not a cassandra:// URL")
    rest, _, query = url.removeprefix("cassandra://").partition("?")
    netloc, _, keyspace = rest.partition("/")
    creds, _, hosts = netloc.rpartition("@")
    if not hosts or not keyspace:
        raise InvalidArgument("store", f"{url!r}: expected cassandra://HOST:PORT/KEYSPACE")
    points: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, _, port = item.partition(":")
        if not host or (port and not port.isdigit()):
            raise InvalidArgument("store", f"{url!r}: bad host {item!r}")
        points.append((host, int(port or 9042)))
    opts = {k: v[-1] for k, v in parse_qs(query).items()}
    user, _, password = creds.partition(":")
    return ClusterConfig(
        contact_points=tuple(points),
        keyspace=keyspace.strip("/"),
        replication=replication_map(rf=opts.get("rf"), dcs=opts.get("dc")),
        consistency=opts.get("consistency", "local_quorum").lower(),
        serial_consistency=opts.get("serial", "local_serial").lower(),
        local_dc=opts.get("local_dc"),
        username=unquote(user) if creds else None,
        password=unquote(password) if creds else None,
    )


class CassandraStore(Store):
    def __init__(
        self,
        config: ClusterConfig,
        *,
        num_shards: int = DEFAULT_NUM_SHARDS,
        clock: Clock | None = None,
        max_in_flight: int = 512,
    ) -> None:
        if config.consistency not in _CONSISTENCY:
            raise InvalidArgument(
                "consistency", f"{config.consistency!r} is not one of {', '.join(_CONSISTENCY)}"
            )
        if config.serial_consistency not in _SERIAL_CONSISTENCY:
            raise InvalidArgument(
                "serial", f"{config.serial_consistency!r} is not serial or local_serial"
            )
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,47}", config.keyspace):
            raise InvalidArgument("keyspace", f"{config.keyspace!r} is not a keyspace name")
        self.config = config
        self.num_shards = validate_num_shards(num_shards)
        self._clock: Clock = clock or SystemClock()
        self._max_in_flight = max_in_flight
        self._in_flight: asyncio.Semaphore | None = None
        self._cluster: Cluster | None = None
        self._session: Any = None
        self._prepared: dict[str, PreparedStatement] = {}

    @classmethod
    def from_url(
        cls, url: str, *, num_shards: int = DEFAULT_NUM_SHARDS, clock: Clock | None = None
    ) -> CassandraStore:
        return cls(parse_url(url), num_shards=num_shards, clock=clock)

    # -- connection -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._session is not None:
            return
        self._in_flight = asyncio.Semaphore(self._max_in_flight)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._connect)
        except UNAVAILABLE_ERRORS as exc:
            await self.close()
            raise _unavailable(exc) from exc
        await self._check_shard_count()

    def _connect(self) -> None:
        cfg = self.config
        serial = _SERIAL_CONSISTENCY[cfg.serial_consistency]

        def profile(consistency: int) -> ExecutionProfile:
            return ExecutionProfile(
                load_balancing_policy=TokenAwarePolicy(
                    DCAwareRoundRobinPolicy(local_dc=cfg.local_dc)
                ),
                consistency_level=consistency,
                serial_consistency_level=serial,
                request_timeout=cfg.request_timeout,
                row_factory=dict_factory,
            )

        auth = (
            PlainTextAuthProvider(username=cfg.username, password=cfg.password or "")
            if cfg.username
            else None
        )
        self._cluster = Cluster(
            contact_points=list(cfg.contact_points),
            execution_profiles={
                EXEC_PROFILE_DEFAULT: profile(_CONSISTENCY[cfg.consistency]),
                _SERIAL: profile(serial),  # reads that see every Paxos decision
            },
            protocol_version=5,
            auth_provider=auth,
            connect_timeout=10,
            # A restarted node is used again within seconds (the default waits up to 10 min).
            reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=10.0),
        )
        session = self._cluster.connect()
        migrate(
            session,
            cfg.keyspace,
            cfg.replication,
            owner=uuid.uuid4().hex,
            now_ms=self._clock.now_ms,
        )
        self._prepared = {
            name: session.prepare(text)
            for name, text in queries_for(cfg.keyspace).items()
            if not name.startswith(("ddl_", "migrate_")) and "migration" not in name
        }
        self._session = session

    async def close(self) -> None:
        cluster, self._cluster, self._session = self._cluster, None, None
        if cluster is not None:
            await asyncio.get_running_loop().run_in_executor(None, cluster.shutdown)

    async def _check_shard_count(self) -> None:
        row = await self._one("insert_meta", ("num_shards", str(self.num_shards)))
        if not row["[applied]"] and int(row["value"]) != self.num_shards:
            raise InvalidArgument(
                "num_shards",
                f"this store was created with {row['value']} shards, not {self.num_shards}; "
                "the shard count is fixed when a cluster is created",
            )

    # -- execution ------------------------------------------------------------------------

    async def _rows(
        self, name: str, params: Sequence[Any] | Mapping[str, Any], *, serial: bool = False
    ) -> list[Row]:
        if self._session is None or self._in_flight is None:
            raise StoreUnavailable("the store is not open")
        async with self._in_flight:
            try:
                rf = self._session.execute_async(
                    self._prepared[name],
                    params,
                    execution_profile=_SERIAL if serial else EXEC_PROFILE_DEFAULT,
                )
                return await _Pages(rf, asyncio.get_running_loop()).all_rows()
            except _MAYBE_APPLIED as exc:
                if name in _CONDITIONAL:
                    raise _Ambiguous(f"{type(exc).__name__}: {exc}") from exc
                raise _unavailable(exc) from exc
            except UNAVAILABLE_ERRORS as exc:
                raise _unavailable(exc) from exc

    async def _one(self, name: str, params: Sequence[Any] | Mapping[str, Any]) -> Row:
        rows = await self._rows(name, params)
        return rows[0] if rows else {}

    async def _read_job(self, job_id: str, *, serial: bool = False) -> _Found | None:
        rows = await self._rows("select_job", (job_id,), serial=serial)
        return _found(rows[0] if rows else None)

    async def _put_entries(self, entries: Sequence[BucketEntry]) -> None:
        now = self._clock.now_ms()
        await _gather(
            self._rows(
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
        job = _bounded_history(job)
        await self._put_entries([entry])
        row = await self._insert_job(job)
        if row["[applied]"]:
            return CreateResult(created=True, job=job)
        existing = _to_job(row)
        return CreateResult(
            created=False, job=existing, conflict=existing.body_digest() != job.body_digest()
        )

    async def _insert_job(self, job: Job) -> Row:
        """``INSERT ... IF NOT EXISTS``; a timeout is settled by a SERIAL read of the row."""
        columns = _job_columns(job)
        for _ in range(CAS_ROUNDS):
            try:
                return await self._one("insert_job", columns)
            except _Ambiguous as exc:
                settled = await self._settle(job.job_id, exc)
            if settled is not None:
                current = _job_columns(settled.job)
                return {"[applied]": current == columns, **current}
        raise StoreUnavailable(f"creating job {job.job_id!r} kept timing out")

    async def _claim_key(self, job: Job) -> Row:
        """The idempotency key's row (``job_id``, ``digest``), written now if it is new."""
        params = (job.idempotency_key, job.job_id, job.body_digest())
        try:
            row = await self._one("insert_key", params)
        except _Ambiguous as exc:
            rows = await self._rows("select_key", (job.idempotency_key,), serial=True)
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
                self._rows("list_jobs", (after, chunk))
                if after
                else self._rows("list_jobs_first", (chunk,))
            )
            for row in rows:
                scanned += 1
                after = row["job_id"]
                job = _to_job(row)
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
            rows = await self._rows(
                "read_bucket_after", (shard, minute, after[0], after[1], due_to, limit)
            )
        else:
            rows = await self._rows("read_bucket", (shard, minute, due_from, due_to, limit))
        return [
            BucketEntry(
                shard=r["shard"], minute=r["minute"], due_at=r["due_at"], job_id=r["job_id"]
            )
            for r in rows
        ]

    # -- conditional job writes -----------------------------------------------------------

    async def _conditional(self, statement: str, job_id: str, t: T.Transition) -> Outcome:
        """Apply the transition with ``statement`` if its condition holds, as one LWT on the
        row image; write the bucket entry the new row needs (if any) first."""
        found = await self._read_job(job_id)
        written: BucketEntry | None = None
        for _ in range(CAS_ROUNDS):
            if found is None or not t.condition(found.job):
                return Outcome(applied=False, job=found.job if found else None)
            new = _bounded_history(t.change(found.job))
            at = t.entry_at(new)
            if at is not None and (entry := entry_for(new, at, t.now)) != written:
                await self._put_entries([entry])
                written = entry
            params = {**_job_columns(new), **{f"was_{k}": v for k, v in found.image.items()}}
            try:
                row = await self._one(statement, params)
            except _Ambiguous as exc:
                settled = await self._settle(job_id, exc)
                if settled is not None and settled.image == _found_image(new):
                    return Outcome(applied=True, job=new)
                found = settled
                continue
            if row["[applied]"]:
                return Outcome(applied=True, job=new)
            if "state" not in row:  # the row is gone
                return Outcome(applied=False, job=None)
            found = found.after(row)
        raise StoreUnavailable(f"job {job_id!r} kept changing during {CAS_ROUNDS} attempts")

    async def _settle(self, job_id: str, exc: _Ambiguous) -> _Found | None:
        """After a conditional write timed out: the row as decided by Paxos."""
        try:
            return await self._read_job(job_id, serial=True)
        except StoreUnavailable as unavailable:
            raise StoreUnavailable(
                f"a conditional write on job {job_id!r} timed out ({exc}) and its outcome "
                f"could not be read: {unavailable.detail}"
            ) from unavailable

    async def claim_jobs(self, claims: Sequence[ClaimRequest]) -> list[Outcome]:
        return await _gather(self._conditional("claim_job", c.job_id, T.claim(c)) for c in claims)

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
                row = await self._one("purge_job", params)
            except _Ambiguous as exc:
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
                row = await self._one("insert_schedule", _schedule_columns(schedule))
            except _Ambiguous:
                stored = await self.get_schedule(schedule.schedule_id, serial=True)
                if stored is None:
                    continue  # not written: try again
                return stored == schedule, stored
            if row["[applied]"]:
                return True, schedule
            return False, _to_schedule(row)
        raise StoreUnavailable(f"creating schedule {schedule.schedule_id!r} kept timing out")

    async def get_schedule(self, schedule_id: str, *, serial: bool = False) -> Schedule | None:
        rows = await self._rows("select_schedule", (schedule_id,), serial=serial)
        return _to_schedule(rows[0]) if rows else None

    async def list_schedules(self, *, limit: int, page_token: str) -> tuple[list[Schedule], str]:
        """In token order of the schedule id (stable, not alphabetical: the rows are spread
        over the cluster by the hash of their id)."""
        if limit < 1:
            raise InvalidArgument("limit", f"must be at least 1, got {limit}")
        rows = await (
            self._rows("list_schedules", (page_token, limit + 1))
            if page_token
            else self._rows("list_schedules_first", (limit + 1,))
        )
        found = [_to_schedule(r) for r in rows]
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
            **_schedule_columns(schedule),
            "version": expect_version,
            "new_version": expect_version + 1,
        }
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._one("update_schedule", params)
            except _Ambiguous:
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
                row = await self._one("delete_schedule", (schedule_id,))
            except _Ambiguous:
                if await self.get_schedule(schedule_id, serial=True) is None:
                    return True
                continue
            return bool(row["[applied]"])
        raise StoreUnavailable(f"schedule {schedule_id!r}: delete kept timing out")

    # -- shards ---------------------------------------------------------------------------

    async def get_shard(self, shard: int, *, serial: bool = False) -> ShardState:
        rows = await self._rows("select_shard", (shard,), serial=serial)
        return _shard_state(shard, rows[0]) if rows else ShardState(shard=shard)

    async def acquire_shard(
        self, shard: int, owner: str, expect_epoch: int, initial_cursor: int
    ) -> tuple[bool, ShardState]:
        taken = ShardState(shard=shard, epoch=expect_epoch + 1, owner=owner)
        if expect_epoch == 0:
            try:
                row = await self._one("create_shard", (shard, owner, initial_cursor))
            except _Ambiguous:
                current = await self.get_shard(shard, serial=True)
                return replace(taken, cursor=initial_cursor) == current, current
            if row["[applied]"]:
                return True, replace(taken, cursor=initial_cursor)
            return False, _shard_state(shard, row)
        current = await self.get_shard(shard)
        for _ in range(CAS_ROUNDS):
            if current.epoch != expect_epoch:
                return False, current
            params = (expect_epoch + 1, owner, shard, current.epoch, current.owner, current.cursor)
            try:
                row = await self._one("bump_epoch", params)
            except _Ambiguous:
                settled = await self.get_shard(shard, serial=True)
                if settled == replace(taken, cursor=current.cursor):
                    return True, settled
                current = settled
                continue
            if row["[applied]"]:
                return True, replace(taken, cursor=current.cursor)
            current = _shard_state(shard, row)
        raise StoreUnavailable(f"shard {shard} kept changing during {CAS_ROUNDS} attempts")

    async def save_cursor(self, shard: int, epoch: int, cursor: int) -> bool:
        for _ in range(CAS_ROUNDS):
            try:
                row = await self._one("save_cursor", (cursor, shard, epoch))
            except _Ambiguous:
                settled = await self.get_shard(shard, serial=True)
                if settled.epoch != epoch:
                    return False
                if settled.cursor == cursor:
                    return True
                continue  # still ours and not written: write again
            return bool(row["[applied]"])
        raise StoreUnavailable(f"shard {shard}: cursor write kept timing out")


_CONDITIONAL = frozenset(
    {
        "insert_job",
        "insert_key",
        "claim_job",
        "renew_lease",
        "complete_job",
        "fail_job",
        "release_lease",
        "cancel_job",
        "reschedule_job",
        "create_shard",
        "bump_epoch",
        "save_cursor",
        "replay_job",
        "purge_job",
        "insert_schedule",
        "update_schedule",
        "delete_schedule",
    }
)


def _found_image(job: Job) -> Row:
    columns = _job_columns(job)
    return {k: columns[k] for k in IMAGE}


async def _gather(aws: Any) -> list[Any]:
    """Run concurrently and wait for all; then raise the first error, if any (so no write of
    this call is still in flight when it fails)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)
