"""cassandra-driver, adapted at the edge: the cluster and its execution profiles, driver
futures as asyncio awaitables (every page, no thread per query), and driver errors translated
into ``StoreUnavailable``. Only opening and closing (connecting, migrating, preparing) run in an
executor thread."""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from cassandra import (
    AuthenticationFailed,
    ConsistencyLevel,
    CoordinationFailure,
    OperationTimedOut,
    Timeout,
    Unauthorized,
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
from cassandra.query import (
    BatchStatement,
    BatchType,
    BoundStatement,
    PreparedStatement,
    dict_factory,
)

from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.store.cassandra.rows import Row
from timeshard.store.cassandra.schema import migrate, operations, replication_map
from timeshard.store.stats import StoreStats

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

_CONDITIONAL = frozenset(
    {
        "claim_index",
        "insert_key",
        "raise_epoch",
        "create_row_if_new",
        "update_state",
        "update_all",
        "delete_row",
        "create_shard",
        "bump_epoch",
        "save_cursor",
        "insert_schedule",
        "update_schedule",
        "revise_schedule",
        "purge_schedule",
    }
)
"""The named queries that are lightweight transactions (their timeouts are ``Ambiguous``)."""


class Ambiguous(Exception):
    """A conditional write timed out: it may or may not have been applied."""


def _unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"Cassandra: {type(exc).__name__}: {exc}")


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


def redact(url: str) -> str:
    """The URL with its password (if any) replaced, for messages and logs."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def parse_url(url: str) -> ClusterConfig:
    """``cassandra://[user:password@]HOST:PORT[,HOST:PORT]/KEYSPACE[?options]``.

    Options: ``rf=N`` (SimpleStrategy), or ``dc=NAME:N[,NAME:N]`` (NetworkTopologyStrategy);
    ``consistency=local_quorum|quorum``, ``serial=local_serial|serial``, ``local_dc=NAME``.
    """
    if not url.startswith("cassandra://"):
        raise InvalidArgument("store", f"{redact(url)!r} is not a cassandra:// URL")
    rest, _, query = url.removeprefix("cassandra://").partition("?")
    netloc, _, keyspace = rest.partition("/")
    creds, _, hosts = netloc.rpartition("@")
    if not hosts or not keyspace:
        raise InvalidArgument("store", f"{redact(url)!r}: expected cassandra://HOST:PORT/KEYSPACE")
    points: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, _, port = item.partition(":")
        if not host or (port and not port.isdigit()):
            raise InvalidArgument("store", f"{redact(url)!r}: bad host {item!r}")
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


def _check(config: ClusterConfig) -> None:
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


def reconnection_policy() -> ExponentialReconnectionPolicy:
    """How the driver reconnects to a node it lost: every 0.2 s doubling up to 2 s, so a
    restarted node is used again within ~2 s (the driver's default waits up to 10 min; 10 s
    left a node "unavailable" for 16 s after Cassandra was back, seen in a soak), and for
    ever: the driver's default gives up after 64 attempts, about two minutes at this pace,
    and a whole-store outage longer than that left a node unable to reach the store for good
    once it was back (a 15-minute soak: two of three nodes, for 20 minutes)."""
    return ExponentialReconnectionPolicy(base_delay=0.2, max_delay=2.0, max_attempts=None)


class _Pages:
    """The rows of one ``execute_async`` call, every page, as an awaitable: the driver's
    callbacks (on its I/O thread) hand each page to the event loop. Once the rows are in,
    the request's reference cycles are broken (``_release``): they kept each request, a
    batch's every bound value with it, alive until a garbage collection (8 objects per
    created job), and after a million jobs loaded one collection took 1.5 s."""

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

    async def first_page(self) -> list[Row]:
        try:
            rows = await self._page
        except asyncio.CancelledError:
            self._rf.clear_callbacks()  # (still in flight: the driver's timer stays)
            raise
        except BaseException:
            self._release()
            raise
        self._release()
        return rows

    async def all_rows(self) -> list[Row]:
        rows: list[Row] = []
        while True:
            rows.extend(await self.first_page())
            if not self._rf.has_more_pages:
                return rows
            self._page = self._loop.create_future()
            self._rf.start_fetching_next_page()  # (then the callbacks: added with a page in,
            self._rf.add_callbacks(self._on_rows, self._on_error)  # they are called at once)

    def _release(self) -> None:
        """Once the driver answered, break the cycles that would keep the request alive until
        a garbage collection: our callbacks (they hold ``self``, which holds ``_rf``) and the
        driver's timeout timer (cancelled when the answer came, it holds ``_rf._on_timeout``)."""
        rf = self._rf
        rf.clear_callbacks()
        timer = getattr(rf, "_timer", None)  # (a private field of the driver's)
        if timer is not None:
            timer.cancel()
            timer.callback = None  # (the I/O thread's heap keeps it until it would end)
            rf._timer = None


def _bound(stmt: PreparedStatement, params: Sequence[Any] | Mapping[str, Any]) -> BoundStatement:
    """``stmt.bind(params)``, a third of its CPU: the driver makes a column-encryption
    descriptor for every value it binds (we use no column encryption), which was most of a
    conditional batch's binding, paid per row of every claim and result. Each value is
    serialized by its column's type as the driver does; anything but a full set of values
    of the right types goes to the driver's own ``bind``."""
    cols = stmt.column_metadata
    if isinstance(params, Mapping):
        try:
            values = [params[c.name] for c in cols]
        except KeyError:
            return stmt.bind(params)
    else:
        values = list(params)
    if len(values) != len(cols) or stmt.column_encryption_policy is not None:
        return stmt.bind(params)
    proto = stmt.protocol_version
    bound = BoundStatement(stmt)
    bound.raw_values = values
    try:
        bound.values = [
            None if v is None else c.type.serialize(v, proto)
            for v, c in zip(values, cols, strict=True)
        ]
    except (TypeError, struct.error):  # the driver's bind names the column in its error
        return stmt.bind(params)
    return bound


class Connection:
    """One cluster session with the store's named operations prepared; at most
    ``max_in_flight`` queries at a time. ``config`` is checked here, at construction."""

    def __init__(
        self, config: ClusterConfig, *, now_ms: Callable[[], int], max_in_flight: int
    ) -> None:
        _check(config)
        self.config = config
        self._now_ms = now_ms
        self._max_in_flight = max_in_flight
        self._in_flight: asyncio.Semaphore | None = None
        self._cluster: Cluster | None = None
        self._session: Any = None
        self._prepared: dict[str, PreparedStatement] = {}
        self.stats = StoreStats()

    @property
    def is_open(self) -> bool:
        return self._session is not None

    async def open(self) -> None:
        """Connect, bring the keyspace up to date and prepare every operation."""
        self._in_flight = asyncio.Semaphore(self._max_in_flight)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._connect)
        except (AuthenticationFailed, Unauthorized) as exc:
            await self.close()
            raise InvalidArgument("store", f"Cassandra refused this login: {exc}") from exc
        except NoHostAvailable as exc:
            await self.close()
            refusals = [e for e in exc.errors.values() if isinstance(e, AuthenticationFailed)]
            if refusals:  # wrong or missing credentials never cure themselves: not retryable
                raise InvalidArgument(
                    "store", f"Cassandra refused the credentials: {refusals[0]}"
                ) from exc
            raise _unavailable(exc) from exc
        except UNAVAILABLE_ERRORS as exc:
            await self.close()
            raise _unavailable(exc) from exc

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
            reconnection_policy=reconnection_policy(),
        )
        session = self._cluster.connect()
        migrate(
            session,
            cfg.keyspace,
            cfg.replication,
            owner=uuid.uuid4().hex,
            now_ms=self._now_ms,
        )
        self._prepared = {
            name: session.prepare(text) for name, text in operations(cfg.keyspace).items()
        }
        self._session = session

    async def close(self) -> None:
        cluster, self._cluster, self._session = self._cluster, None, None
        if cluster is not None:
            await asyncio.get_running_loop().run_in_executor(None, cluster.shutdown)

    def write_timestamp(self) -> int:
        """A write timestamp (us) from the driver's own generator, the one every plain write
        gets when it is sent: a write given it now and sent later loses to any write sent in
        between (last write wins by timestamp, not by arrival)."""
        if self._cluster is None:
            raise StoreUnavailable("the store is not open")
        return int(self._cluster.timestamp_generator())

    async def rows(
        self,
        name: str,
        params: Sequence[Any] | Mapping[str, Any],
        *,
        serial: bool = False,
        kind: str = "",
    ) -> list[Row]:
        """Every row of the named operation (``serial``: read at the serial consistency, so
        every Paxos decision is seen). A timeout of a conditional write raises ``Ambiguous``.
        ``kind``: what a conditional one carries, as its round is counted (default: its
        name)."""
        if self._session is None:
            raise StoreUnavailable("the store is not open")
        if name in _CONDITIONAL:
            self.stats.round(kind=kind or name)
        return await self._run(name, name in _CONDITIONAL, serial, self._prepared[name], params)

    async def batch(
        self,
        statements: Sequence[tuple[str, Sequence[Any] | Mapping[str, Any]]],
        *,
        conditional: bool,
        kind: str = "",
    ) -> list[Row]:
        """The named statements as one unlogged batch: all of one partition (then applied
        atomically and in isolation; with conditions, one Paxos round for all of them), or
        of several partitions without conditions (one round trip, no atomicity). ``kind``:
        what a conditional one carries, as its round is counted (default: the last
        statement's name)."""
        if self._session is None:
            raise StoreUnavailable("the store is not open")
        if len(statements) == 1:
            name, params = statements[0]
            return await self.rows(name, params, kind=kind)
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for name, params in statements:
            batch.add(_bound(self._prepared[name], params))
        if conditional:
            self.stats.round(len(statements), kind or statements[-1][0])
        label = f"batch:{statements[-1][0]}"
        return await self._run(label, conditional, False, batch, None)

    async def page(
        self, name: str, params: Sequence[Any], *, size: int, state: bytes | None
    ) -> tuple[list[Row], bytes | None]:
        """One page of the named query and the paging state of the next (None: the last)."""
        if self._session is None or self._in_flight is None:
            raise StoreUnavailable("the store is not open")
        stmt = self._prepared[name]
        self.stats.operations[name] += 1
        async with self._in_flight:
            try:
                bound = stmt.bind(params)
                bound.fetch_size = size
                rf = self._session.execute_async(
                    bound, paging_state=state, execution_profile=EXEC_PROFILE_DEFAULT
                )
                pages = _Pages(rf, asyncio.get_running_loop())
                rows = await pages.first_page()
            except UNAVAILABLE_ERRORS as exc:
                raise _unavailable(exc) from exc
        return rows, rf._paging_state if rf.has_more_pages else None

    async def _run(
        self, label: str, conditional: bool, serial: bool, stmt: Any, params: Any
    ) -> list[Row]:
        if self._in_flight is None:
            raise StoreUnavailable("the store is not open")
        stats = self.stats
        stats.operations[label] += 1
        started = time.perf_counter()
        async with self._in_flight:
            try:
                rf = self._session.execute_async(
                    stmt, params, execution_profile=_SERIAL if serial else EXEC_PROFILE_DEFAULT
                )
                return await _Pages(rf, asyncio.get_running_loop()).all_rows()
            except _MAYBE_APPLIED as exc:
                stats.errors[label] += 1
                if conditional:
                    raise Ambiguous(f"{type(exc).__name__}: {exc}") from exc
                raise _unavailable(exc) from exc
            except UNAVAILABLE_ERRORS as exc:
                stats.errors[label] += 1
                raise _unavailable(exc) from exc
            finally:
                stats.seconds[label] += time.perf_counter() - started

    async def one(self, name: str, params: Sequence[Any] | Mapping[str, Any]) -> Row:
        """The first row (for a conditional write: ``[applied]`` and the current image)."""
        rows = await self.rows(name, params)
        return rows[0] if rows else {}
