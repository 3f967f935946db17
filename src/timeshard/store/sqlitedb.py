"""The embedded store's database file: its named queries and schema, and the connections to it.

One writer thread owns the read-write connection. Calls from the event loop are queued to it,
and every call waiting when it wakes runs in one transaction (each in its own savepoint)
committed once: group commit, so a burst of schedules or claims costs one fsync, not one each.
A call may also linger a little for the next one (``call(linger_s=...)``: a worker's results, to
ride with the next claim's commit rather than take a commit of their own).
The results of a transaction go back to the event loop in one hop, not one per call. Reads may
go around it: a read-only connection on the event loop (``reader``) and one per long read in a
worker thread (``read_apart``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from timeshard.errors import StoreUnavailable
from timeshard.store.keptjobs import KeptJobs
from timeshard.store.named import load_queries
from timeshard.store.stats import StoreStats

log = logging.getLogger(__name__)
R = TypeVar("R")
Q = load_queries("sqlite.sql")
for _name in ("find_jobs_by_due", "find_jobs_by_created", "find_jobs_by_id", "count_jobs"):
    # Each listing twice: reading every job (``name``), and reading the jobs of the states
    # asked for from their index (``name_in_states``); ``SqliteStore.select_jobs`` chooses.
    _query = Q[_name]
    for _states, _suffix in (("any_state", ""), ("in_states", "_in_states")):
        _where = Q["jobs_matching"].replace("{states}", Q[_states])
        Q[_name + _suffix] = _query.replace("{jobs_matching}", _where)


class WriterConnection(sqlite3.Connection):
    """The writer thread's connection, with the jobs it wrote last (``KeptJobs``): its
    transactions check them at their start and clear them on a rollback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept_jobs = KeptJobs()


_Op = tuple[Callable[[WriterConnection], Any], "asyncio.Future[Any]"]
_Result = tuple["asyncio.Future[Any]", bool, Any]  # (future, ok, value or exception)

#: How long one statement waits for another connection's write lock (SQLite's busy handler).
BUSY_TIMEOUT_S = 5.0
#: How long ``open()`` keeps retrying a database another process holds locked before it fails.
OPEN_TIMEOUT_S = 60.0
#: The longest a call lingers for the next one (``Database.call``), whatever it asks: under
#: load the next write comes within milliseconds; at a trickle a lingering call goes soon.
LINGER_MAX_S = 0.05
_OPEN_RETRY_FIRST_S = 0.01
_OPEN_RETRY_MAX_S = 0.5


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    """``database is locked`` (SQLITE_BUSY) or ``database table is locked`` (SQLITE_LOCKED),
    extended codes included: another connection holds the lock; waiting may help."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "locked" in str(exc)
    return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _migrate(db: sqlite3.Connection) -> None:
    """Create what is missing, in one write transaction taken up front (``BEGIN IMMEDIATE``
    waits in the busy handler; statement by statement each would upgrade a read lock to a write
    lock, which SQLite refuses at once when another connection is writing)."""
    try:
        # executescript commits a pending transaction before it runs, so BEGIN goes inside it.
        db.executescript(f"BEGIN IMMEDIATE;\n{Q['schema']};")
        _add_missing_columns(db)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


_ADDED_COLUMNS = {
    "result": "add_result",
    "result_encoding": "add_result_encoding",
    "deadline": "add_deadline",
    "priority": "add_priority",
    "unstarted": "add_unstarted",
    "start_noticed": "add_start_noticed",
}
"""Columns added to ``jobs`` after its first version, and the statement that adds each."""
_ADDED_SCHEDULE_COLUMNS = {
    "spread_ms": "add_spread",
    "revision": "add_schedule_revision",
    "deleted": "add_schedule_deleted",
}
"""The same for ``schedules``."""


def _add_missing_columns(db: sqlite3.Connection) -> None:
    """Bring a database made by an earlier version up to date (inside ``_migrate``'s
    transaction): ``CREATE TABLE IF NOT EXISTS`` leaves an existing table as it was."""
    have = {row[0] for row in db.execute(Q["job_columns"])}
    for column, statement in _ADDED_COLUMNS.items():
        if column not in have:
            db.execute(Q[statement])
    have = {row[0] for row in db.execute(Q["schedule_columns"])}
    for column, statement in _ADDED_SCHEDULE_COLUMNS.items():
        if column not in have:
            db.execute(Q[statement])


def _settle(results: list[_Result]) -> None:
    """On the event loop: hand each caller its result (unless it gave up meanwhile)."""
    for fut, ok, value in results:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _deliver(results: list[_Result]) -> None:
    """From the writer thread: one hop to each event loop that waits, for all its results."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Result]] = {}
    for result in results:
        by_loop.setdefault(result[0].get_loop(), []).append(result)
    for loop, mine in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for these
            loop.call_soon_threadsafe(_settle, mine)


class Database:
    """The connections to one database file (see the module docstring)."""

    def __init__(
        self, path: str, *, synchronous: str, open_timeout: float, stats: StoreStats
    ) -> None:
        self.path = path
        self.stats = stats
        self._open_timeout = open_timeout
        self._synchronous = synchronous
        self._ops: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._read_db: sqlite3.Connection | None = None
        self._lingering: list[_Op] = []
        """Calls waiting for the next one to share its commit (``call``'s ``linger_s``)."""
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_loop: asyncio.AbstractEventLoop | None = None

    @property
    def is_open(self) -> bool:
        return self._thread is not None

    async def open(self) -> None:
        """Start the writer thread, which connects, switches to WAL and migrates; raises
        ``StoreUnavailable`` if it could not (``open`` may be called again)."""
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name=f"sqlite:{self.path}", daemon=True)
        self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        if self._open_error is not None:
            error, self._open_error, self._thread = self._open_error, None, None
            self._ready.clear()  # open() may be called again
            raise StoreUnavailable(f"can not open {self.path}: {error}")

    def _connect(self) -> WriterConnection:
        """Connect, switch to WAL and migrate; while another process holds the file locked, wait
        and retry with backoff until ``open_timeout`` has passed.

        The busy timeout alone is not enough: servers started together on one new file race to
        switch it to WAL, and SQLite answers the loser ``database is locked`` at once, without
        calling the busy handler (it would deadlock: both hold a read lock and want to write).
        """
        deadline = time.monotonic() + self._open_timeout
        delay = _OPEN_RETRY_FIRST_S
        while True:
            try:
                return self._connect_once()
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() + delay >= deadline:
                    raise
                log.info("%s is locked by another process (%s); retrying", self.path, exc)
            time.sleep(random.uniform(delay / 2, delay))  # jitter: racers spread out
            delay = min(delay * 2, _OPEN_RETRY_MAX_S)

    def _connect_once(self) -> WriterConnection:
        db = sqlite3.connect(
            self.path,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,
            check_same_thread=False,
            factory=WriterConnection,
        )
        try:
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            _migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _run(self) -> None:
        try:
            db = self._connect()
        except BaseException as exc:  # reported to open()
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                first = self._ops.get()
                if first is None:
                    return
                batch = [first]
                while len(batch) < 512:
                    try:
                        nxt = self._ops.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._ops.put(None)
                        break
                    batch.append(nxt)
                self.stats.round(len(batch), "transaction")  # the embedded "round"
                self._run_batch(db, batch)
        finally:
            db.close()

    @staticmethod
    def _run_batch(db: WriterConnection, batch: list[_Op]) -> None:
        results: list[_Result] = []
        # A caller that was cancelled while queued does not get its op run. (A cancel that
        # lands after this check is like one after the op ran: the op's effect stands.)
        batch = [(fn, fut) for fn, fut in batch if not fut.cancelled()]
        if not batch:
            return
        if len(batch) == 1:
            Database._run_alone(db, *batch[0])
            return
        try:
            db.execute("BEGIN IMMEDIATE")
            db.kept_jobs.check(db)
            for fn, fut in batch:
                db.execute("SAVEPOINT op")
                try:
                    results.append((fut, True, fn(db)))
                    db.execute("RELEASE op")
                except Exception as exc:
                    db.kept_jobs.clear()
                    db.execute("ROLLBACK TO op")
                    db.execute("RELEASE op")
                    results.append((fut, False, exc))
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            db.kept_jobs.clear()
            if db.in_transaction:
                db.execute("ROLLBACK")
            err = StoreUnavailable(str(exc))
            _deliver([(fut, False, err) for _, fut in batch])
            return
        _deliver(results)

    @staticmethod
    def _run_alone(db: WriterConnection, fn: Callable[[WriterConnection], Any], fut: Any) -> None:
        """One op in its own transaction: no savepoint needed to undo it alone."""
        try:
            db.execute("BEGIN IMMEDIATE")
            db.kept_jobs.check(db)
            try:
                value = fn(db)
            except Exception as exc:
                db.kept_jobs.clear()
                if db.in_transaction:
                    db.execute("ROLLBACK")
                _deliver([(fut, False, exc)])
                return
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            db.kept_jobs.clear()
            if db.in_transaction:
                db.execute("ROLLBACK")
            _deliver([(fut, False, StoreUnavailable(str(exc)))])
            return
        _deliver([(fut, True, value)])

    async def call(self, fn: Callable[[WriterConnection], R], *, linger_s: float = 0.0) -> R:
        """``fn`` on the writer thread, in the next group commit (its own savepoint).
        ``linger_s``: it may wait up to that long (at most ``LINGER_MAX_S``) for another
        call, and go in that one's commit (one fsync for both, one hop back to the loop)."""
        if self._thread is None:
            raise StoreUnavailable("the store is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        if loop is not self._linger_loop:
            self._send_lingering()  # (those of another loop do not wait for this one's calls)
        if linger_s > 0:
            self._lingering.append((fn, fut))
            until = loop.time() + min(linger_s, LINGER_MAX_S)
            if self._linger_timer is None or until < self._linger_timer.when():
                if self._linger_timer is not None:
                    self._linger_timer.cancel()
                self._linger_timer = loop.call_at(until, self._send_lingering)
                self._linger_loop = loop
        else:
            self._send_lingering()
            self._ops.put((fn, fut))
        return await fut

    def _send_lingering(self) -> None:
        """The lingering calls go to the writer thread now (ahead of the call that takes them
        along, if any: they were made first)."""
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = self._linger_loop = None
        for op in self._lingering:
            self._ops.put(op)
        self._lingering.clear()

    async def close(self) -> None:
        """Close the reader connection and stop the writer thread once its queue is done."""
        if self._read_db is not None:
            self._read_db.close()
            self._read_db = None
        if self._thread is None:
            return
        self._send_lingering()
        self._ops.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None

    def reader(self) -> sqlite3.Connection | None:
        """The event loop's read-only connection (not for ``:memory:``: another connection
        would open another database)."""
        if self._read_db is None and self._thread is not None and self.path != ":memory:":
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            db.execute("PRAGMA query_only=1")
            self._read_db = db
        return self._read_db

    async def read_apart(self, fn: Callable[[sqlite3.Connection], R]) -> R:
        """``fn`` on a connection of its own in a worker thread, in one read transaction (so
        a page and its count see one state): a long read, such as a listing that counts every
        match, never holds up the writer thread and the group commits of the node's hot path.
        (``:memory:``: on the writer thread, the only connection that sees the database.)"""
        if self.path == ":memory:":
            return await self.call(fn)

        def run() -> R:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            try:
                db.execute("PRAGMA query_only=1")
                db.execute("BEGIN")
                return fn(db)
            finally:
                db.close()

        if self._thread is None:
            raise StoreUnavailable("the store is not open")
        try:
            return await asyncio.get_running_loop().run_in_executor(None, run)
        except sqlite3.Error as exc:
            raise StoreUnavailable(str(exc)) from exc
