"""Job rows in minute partitions, written a partition batch at a time.

A job's row lives in partition ``(shard, minute)``, the minute of its ``run_at`` when it was
created (its *home*); it never moves. A bucket entry names the home, and ``job_index`` maps an
id to it. Every transition of the lease protocol goes through ``GroupCommit``: the
transitions waiting for one partition become one unlogged batch with a condition per row (one
Paxos round), preceded, when this store owns the shard, by ``raise_epoch`` (the static epoch of
the partition, ``IF epoch <= ours``): once a new owner has written or read a partition, a
deposed owner's batch there is rejected.

A batch that does not apply returns the current image of each row it compared; rows whose image
changed are read again (SERIAL) and their transitions re-decided, the rest go out again. A batch
that timed out is settled by a SERIAL read of its rows. The index, key and dead-letter rows that
follow a job into a finished state go out after its batch, in windows (``follows``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from timeshard.batching import GroupCommit
from timeshard.clock import Clock
from timeshard.errors import NotOwner, StoreUnavailable
from timeshard.model import BucketEntry, Job, WriteResult
from timeshard.sharding import shard_of
from timeshard.store import transitions as T
from timeshard.store.base import Retention, entry_for
from timeshard.store.cassandra.driver import Ambiguous, Connection
from timeshard.store.cassandra.follows import Follows
from timeshard.store.cassandra.parts import (
    CAS_ROUNDS,
    ROWS_PER_BATCH,
    Key,
    Lru,
)
from timeshard.store.cassandra.parts import (
    chunks as _chunks,
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
from timeshard.store.cassandra.rows import (
    Found,
    bounded_history,
    bucket_ttl,
    image_of,
    row_image,
)
from timeshard.store.codec import job_columns

log = logging.getLogger(__name__)

LINGER_LEASE_SHARE = 0.25
"""A completion lingers at most this share of what is left of its job's lease."""
LINGER_UNKNOWN_S = 0.05
"""A completion of a job whose row this store has no image of lingers at most this long."""


@dataclass(slots=True, eq=False)
class _Op:
    job_id: str
    transition: T.Transition
    found: Found | None
    epoch: int | None
    owner_only: bool
    fut: asyncio.Future[WriteResult]
    delete: bool = False
    new: Job | None = None
    entry: BucketEntry | None = None
    entry_written: bool = False
    reread: bool = False
    fresh: bool = False
    """``found`` is the row as the store answered for this op (a read or a refused write),
    not a remembered image: only then may a failed condition settle the op."""


class JobRows:
    def __init__(
        self, conn: Connection, clock: Clock, num_shards: int, retention: Retention
    ) -> None:
        self._conn = conn
        self._clock = clock
        self._num_shards = num_shards
        self.retention = retention
        self.epochs: dict[int, int] = {}
        """Shards this store took, and the epoch it took them at."""
        self._raised: set[tuple[int, int, int]] = set()
        self.homes = Lru()  # job id -> home minute (never changes)
        self._images = Lru()  # job id -> Found, for jobs this store wrote last
        self._expired = Lru()
        self._batcher: GroupCommit[Key, _Op] = GroupCommit(
            self._run, max_items=ROWS_PER_BATCH, fail=_fail, name="jobrows"
        )
        self.follows = Follows(conn, retention, self.plain_writes)
        """The index, key and dead-letter rows that follow jobs that finish (``_after``)."""
        self._lingering: dict[Key, tuple[list[_Op], asyncio.TimerHandle]] = {}
        """Completions waiting for another write of their partition (``apply_all``'s
        ``linger_s``), and the timer that sends them when none came."""

    async def close(self) -> None:
        for ops, timer in self._lingering.values():
            timer.cancel()  # not written: the worker reports them again, elsewhere
            for op in ops:
                _fail(op, StoreUnavailable("the store is closing"))
        self._lingering.clear()
        await self._batcher.close()
        await self.follows.close()

    # -- what creating needs (``creates.Rows``) ----------------------------------------------

    async def put_entries(self, entries: Sequence[BucketEntry]) -> None:
        """One unlogged batch per bucket partition (atomic, one write per partition)."""
        now = self._clock.now_ms()
        by_bucket: dict[Key, list[tuple[str, tuple[Any, ...]]]] = {}
        for e in entries:
            params = (e.shard, e.minute, e.due_at, e.job_id, e.home, bucket_ttl(e.due_at, now))
            by_bucket.setdefault((e.shard, e.minute), []).append(("insert_entry", params))
        await _gather(
            self._conn.batch(chunk, conditional=False)
            for statements in by_bucket.values()
            for chunk in _chunks(statements, ROWS_PER_BATCH)
        )

    async def plain_writes(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Writes of many partitions that need no atomicity, a few round trips in all."""
        await _gather(
            self._conn.batch(chunk, conditional=False) for chunk in _chunks(statements, 50)
        )

    # -- reading --------------------------------------------------------------------------

    async def read(self, key: Key, job_ids: Sequence[str], *, serial: bool) -> dict[str, Found]:
        found: dict[str, Found] = {}
        for chunk in _chunks(list(dict.fromkeys(job_ids)), ROWS_PER_BATCH):
            rows = await self._conn.rows("select_rows", (key[0], key[1], chunk), serial=serial)
            for r in rows:
                if r.get("state") is not None:
                    f = Found.from_row({**r, "shard": key[0]})
                    found[f.job.job_id] = f
        return found

    async def _home(self, job_id: str) -> int | None:
        home = self.homes.get(job_id)
        if home is not None:
            return int(home)
        rows = await self._conn.rows("select_index", (job_id,))
        if not rows:
            return None
        self.homes.put(job_id, rows[0]["minute"])
        return int(rows[0]["minute"])

    async def get(
        self, job_ids: Sequence[str], homes: dict[str, int] | None = None
    ) -> dict[str, Job]:
        """Jobs as stored now (QUORUM). ``homes``: where some of them live, if known."""
        ids = list(dict.fromkeys(job_ids))
        known = dict(homes or {})
        missing = [i for i in ids if i not in known]
        looked_up: dict[str, int] = {}
        for job_id, home in zip(
            missing, await _gather(self._home(i) for i in missing), strict=True
        ):
            if home is not None:
                looked_up[job_id] = home
        by_key: dict[Key, list[str]] = {}
        for job_id, home in {**known, **looked_up}.items():
            by_key.setdefault((shard_of(job_id, self._num_shards), home), []).append(job_id)
        await _gather(self._raise_before_read(k) for k in by_key)
        parts = await _gather(self.read(k, ids_, serial=False) for k, ids_ in by_key.items())
        out = {job_id: f.job for part in parts for job_id, f in part.items()}
        for key, ids_ in by_key.items():
            for job_id in ids_:
                if job_id in out:
                    self.homes.put(job_id, key[1])
        for job_id in looked_up:
            if job_id not in out:
                self._expired.put(job_id, True)
        return out

    def expired(self, job_id: str) -> bool:
        """The index still names the job but its row is gone: it finished and expired."""
        return job_id in self._expired

    async def _raise_before_read(self, key: Key) -> None:
        """As the shard's owner, raise the partition's epoch before reading it (once per
        partition and epoch): nothing a deposed owner writes there afterwards applies."""
        epoch = self.epochs.get(key[0])
        if epoch is None or (key[0], key[1], epoch) in self._raised:
            return
        params = {"shard": key[0], "minute": key[1], "epoch": epoch}
        try:
            row = await self._conn.one("raise_epoch", params)
            if not row.get("[applied]") and row.get("epoch") is None:
                await self._conn.rows("init_epoch", params)
                row = await self._conn.one("raise_epoch", params)
        except Ambiguous:
            return  # the next batch raises it (or finds we were deposed)
        if row.get("[applied]"):
            self._raised.add((key[0], key[1], epoch))

    # -- transitions ----------------------------------------------------------------------

    async def apply(
        self,
        job_id: str,
        transition: T.Transition,
        *,
        known: Job | None = None,
        owner_only: bool = False,
        delete: bool = False,
    ) -> WriteResult:
        """Apply one transition, batched with the others of its partition. ``known``: the row
        as the caller read it (else the store's last image, else a read). ``owner_only``:
        only the shard's owner may apply it (a claim, a lease release): raises ``NotOwner``
        when the partition's epoch says this store was deposed."""
        home = await self._home(job_id)
        if home is None:
            return WriteResult(applied=False, job=None)
        return await self._submit(job_id, home, transition, known, owner_only, delete)

    async def apply_all(
        self,
        items: Sequence[tuple[str, T.Transition, Job | None]],
        *,
        owner_only: bool = False,
        linger_s: float = 0.0,
    ) -> list[WriteResult]:
        """``apply`` for many ``(job_id, transition, known)`` at once, in their order: one
        future per job and no task per job (a claim of 100 jobs made 100 tasks); the homes
        not remembered are looked up together first. Like ``gather``, it waits for every one
        and then raises the first error. ``linger_s`` (completions): each waits up to that
        long for another write of its partition to go out with (a claim, most often): one
        Paxos round for both, rather than a round of its own that the next claim of the
        partition would queue behind. The results of a partition that come meanwhile wait
        together; each is acknowledged once written, as ever."""
        homes = [self.homes.get(job_id) for job_id, _, _ in items]
        missing = [i for i, home in enumerate(homes) if home is None]
        if missing:
            found = await _gather(self._home(items[i][0]) for i in missing)
            for i, home in zip(missing, found, strict=True):
                homes[i] = home
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[WriteResult]] = []
        for (job_id, transition, known), home in zip(items, homes, strict=True):
            if home is None:
                fut: asyncio.Future[WriteResult] = loop.create_future()
                fut.set_result(WriteResult(applied=False, job=None))
            else:
                fut = self._submit(
                    job_id, int(home), transition, known, owner_only, False, linger_s=linger_s
                )
            futs.append(fut)
        return await _gather(futs)

    def _submit(
        self,
        job_id: str,
        home: int,
        transition: T.Transition,
        known: Job | None,
        owner_only: bool,
        delete: bool,
        *,
        linger_s: float = 0.0,
    ) -> asyncio.Future[WriteResult]:
        shard = shard_of(job_id, self._num_shards)
        found = Found.of(known) if known is not None else self._images.get(job_id)
        fut: asyncio.Future[WriteResult] = asyncio.get_running_loop().create_future()
        op = _Op(
            job_id=job_id,
            transition=transition,
            found=found,
            epoch=self.epochs.get(shard),
            owner_only=owner_only,
            fut=fut,
            delete=delete,
            reread=found is None,
        )
        key = (shard, home)
        linger_s = self._linger_bound(found, linger_s)
        if linger_s > 0 and not self._batcher.waiting(key):
            self._linger(key, op, linger_s)
        else:
            self._release(key)
            self._batcher.submit(key, op)
        return fut

    def _linger_bound(self, found: Found | None, linger_s: float) -> float:
        """How long a completion may linger: ``linger_s``, but at most a quarter of what is
        left of its job's lease as last seen here (``LINGER_LEASE_SHARE``; with no image of
        the row, ``LINGER_UNKNOWN_S``): the worker sends its next results once this one is
        answered, and each of those must still hold its lease when it goes."""
        if linger_s <= 0:
            return linger_s
        if found is None:
            return min(linger_s, LINGER_UNKNOWN_S)
        left_s = (found.job.lease_until - self._clock.now_ms()) / 1000
        return max(0.0, min(linger_s, left_s * LINGER_LEASE_SHARE))

    def _linger(self, key: Key, op: _Op, linger_s: float) -> None:
        """Hold ``op`` for ``key``'s next write, ``linger_s`` at most: the first op held starts
        the partition's timer and those that come meanwhile join it (one held with a shorter
        linger brings the timer forward)."""
        loop = asyncio.get_running_loop()
        held = self._lingering.get(key)
        if held is None:
            timer = loop.call_later(linger_s, self._release, key)
            self._lingering[key] = ([op], timer)
            return
        ops, timer = held
        ops.append(op)
        if loop.time() + linger_s < timer.when():
            timer.cancel()
            self._lingering[key] = (ops, loop.call_later(linger_s, self._release, key))

    def _release(self, key: Key) -> None:
        """The completions lingering for ``key`` join its next batch (with the write that
        released them, when one did)."""
        held = self._lingering.pop(key, None)
        if held is None:
            return
        ops, timer = held
        timer.cancel()
        for op in ops:
            self._batcher.submit(key, op)

    async def _run(self, key: Key, ops: list[_Op]) -> None:
        todo = ops
        for _ in range(CAS_ROUNDS):
            await self._load(key, [op for op in todo if op.reread])
            ready = [op for op in todo if self._decide(key, op)]
            recheck = [op for op in todo if op.reread and not op.fut.done()]
            if not ready:
                if not recheck:
                    return
                todo = recheck
                continue
            # The entry a changed row needs goes first: a crash in between leaves an extra
            # entry (it finds the row and moves on), never a row without one (invariant 2).
            # One write per row in a batch (all conditions are checked before any write):
            # a second transition of the same job waits for the next round.
            first: dict[str, _Op] = {}
            for op in ready:
                first.setdefault(op.job_id, op)
            batch_ops = list(first.values())
            for op in ready:
                if first[op.job_id] is not op:
                    op.reread = True
            # Entries go first, so no row is ever left without one (invariant 2). (A claim
            # writes none: the entry that made the job ready stays pending with its owner.)
            unwritten = [op for op in batch_ops if op.entry is not None and not op.entry_written]
            await self.put_entries(_entries(unwritten))
            await self._write_all(key, batch_ops)
            for op in unwritten:
                op.entry_written = True
            todo = [op for op in (*ready, *recheck) if not op.fut.done()]
            if not todo:
                return
        for op in todo:
            _fail(op, StoreUnavailable(f"job {op.job_id!r} kept changing for {CAS_ROUNDS} rounds"))

    async def _load(self, key: Key, ops: list[_Op]) -> None:
        if not ops:
            return
        stored = await self.read(key, [op.job_id for op in ops], serial=True)
        for op in ops:
            op.found = stored.get(op.job_id)
            op.reread, op.fresh = False, True
            if op.job_id in self._images:  # another node wrote it since: forget ours
                self._images.pop(op.job_id, None)

    def _decide(self, key: Key, op: _Op) -> bool:
        """Whether the op still has something to write; settles it otherwise."""
        if op.fut.done():
            return False
        if op.found is None:
            op.fut.set_result(WriteResult(applied=False, job=None))
            return False
        t = op.transition
        if not t.condition(op.found.job):
            if not op.fresh:  # a remembered image (or the caller's read) may be stale: a
                op.reread = True  # node that was paused or deposed must not refuse on it
                return False
            op.fut.set_result(WriteResult(applied=False, job=op.found.job))
            return False
        op.new = op.found.job if op.delete else bounded_history(t.change(op.found.job))
        at = None if op.delete else t.entry_at(op.new)
        entry = _homed(entry_for(op.new, at, t.now), key[1]) if at is not None else None
        if entry != op.entry:
            op.entry, op.entry_written = entry, False
        return True

    async def _write_all(self, key: Key, ops: list[_Op]) -> None:
        for batch in _by_size(ops):  # one after the other: they contend for one partition
            await self._write(key, batch)

    async def _write(self, key: Key, ops: list[_Op]) -> None:
        epochs = {op.epoch for op in ops if op.epoch is not None}
        epoch = max(epochs) if epochs else None
        statements: list[tuple[str, dict[str, Any]]] = []
        if epoch is not None:
            statements.append(("raise_epoch", {"shard": key[0], "minute": key[1], "epoch": epoch}))
        statements += [self._statement(key, op) for op in ops]
        try:
            rows = await self._conn.batch(statements, conditional=True, kind=_kinds(ops))
        except Ambiguous:
            await self._settle(key, ops)
            return
        if rows and rows[0].get("[applied]"):
            for op in ops:
                self._applied(op)
            self._after(key, ops)
            return
        # Not applied: Cassandra returned the compared columns of each row that exists (a
        # lone statement's answer names no key; the row is gone if it has no state).
        if len(statements) == 1 and rows and rows[0].get("state") is not None:
            rows = [{**rows[0], "job_id": ops[0].job_id}]
        returned = {r["job_id"]: r for r in rows if r.get("job_id") is not None}
        stored_epoch = next((r["epoch"] for r in rows if "epoch" in r), None)
        if epoch is not None and (stored_epoch is None or stored_epoch > epoch):
            await self._deposed(key, ops, epoch, stored_epoch)
        for op in ops:
            assert op.found is not None
            r = returned.get(op.job_id)
            if r is None:
                op.found, op.fresh = None, True  # the row is gone
            elif row_image(r) != op.found.image:
                op.reread = True  # changed since read: decide again on the current row
            else:
                op.fresh = True  # as stored (another row of the batch failed)

    async def _deposed(self, key: Key, ops: list[_Op], epoch: int, stored: int | None) -> None:
        if stored is None:  # a partition created before epochs: start it at 0
            await self._conn.rows("init_epoch", {"shard": key[0], "minute": key[1]})
            return
        log.warning("shard %d: partition %d has epoch %d > ours %d", key[0], key[1], stored, epoch)
        for op in ops:
            if op.owner_only:
                _fail(op, NotOwner(key[0], epoch))
            else:
                op.epoch = None  # a worker's result: its fence decides, whoever writes it
        if self.epochs.get(key[0]) == epoch:
            del self.epochs[key[0]]

    def _statement(self, key: Key, op: _Op) -> tuple[str, dict[str, Any]]:
        assert op.found is not None and op.new is not None
        was = dict(
            zip(
                ("was_state", "was_fence", "was_run_at", "was_lease_until", "was_attempt"),
                op.found.image,
                strict=True,
            )
        )
        base = {"shard": key[0], "minute": key[1], "job_id": op.job_id, **was}
        if op.delete:
            return "delete_row", base
        new, old = op.new, op.found.job
        if new.state.terminal or old.state.terminal:
            return "update_all", {
                **base,
                **_row_params(new, key),
                "ttl": self.retention.ttl(new),
            }
        cols = job_columns(new)
        changed = {k: cols[k] for k in _STATE_COLUMNS}
        return "update_state", {**base, **changed}

    async def _settle(self, key: Key, ops: list[_Op]) -> None:
        """A batch timed out: read what Paxos decided; each op applied or goes again."""
        stored = await self.read(key, [op.job_id for op in ops], serial=True)
        applied = []
        for op in ops:
            found = stored.get(op.job_id)
            assert op.new is not None
            if (op.delete and found is None) or (
                found is not None and found.image == image_of(op.new) and not op.delete
            ):
                self._applied(op)
                applied.append(op)
            else:
                op.found, op.fresh = found, True
        self._after(key, applied)

    def _applied(self, op: _Op) -> None:
        """Record a write that applied. Its caller may have given up meanwhile (its future is
        done): the write stands, the image is kept, and the other ops of the batch go on."""
        assert op.new is not None and op.found is not None
        if op.delete:
            self._images.pop(op.job_id, None)
            outcome = WriteResult(applied=True, job=op.found.job)
        else:
            if op.new.state.terminal:
                self._images.pop(op.job_id, None)
            else:
                self._images.put(op.job_id, Found.of(op.new))
            outcome = WriteResult(applied=True, job=op.new)
        if not op.fut.done():
            op.fut.set_result(outcome)

    def _after(self, key: Key, ops: Iterable[_Op]) -> None:
        """The rows that follow the jobs of these applied ops (``follows``)."""
        changes = []
        for op in ops:
            assert op.new is not None and op.found is not None
            changes.append((op.new, op.found.job.state, op.delete))
        self.follows.after(key[1], changes)

    def took_shard(self, shard: int, epoch: int) -> None:
        self.epochs[shard] = epoch


_STATE_COLUMNS = (
    "state",
    "run_at",
    "attempt",
    "fence",
    "lease_owner",
    "lease_until",
    "started_at",
    "finished_at",
    "last_error",
    "history",
    "unstarted",
    "start_noticed",
)


def _kinds(ops: Iterable[_Op]) -> str:
    """What a batch carries, as its round is counted: ``claim``, ``claim+complete``..."""
    return "+".join(sorted({op.transition.kind or "other" for op in ops}))


def _entries(ops: Iterable[_Op]) -> list[BucketEntry]:
    return [op.entry for op in ops if op.entry is not None]


def _by_size(ops: list[_Op]) -> Iterable[list[_Op]]:
    weights = [
        512 + (len(op.new.payload) + len(op.new.result) if op.new is not None else 0) for op in ops
    ]
    return _sized(ops, weights)


def _fail(op: _Op, exc: BaseException) -> None:
    if not op.fut.done():
        if isinstance(exc, asyncio.CancelledError):
            op.fut.cancel()
        else:
            op.fut.set_exception(exc)
