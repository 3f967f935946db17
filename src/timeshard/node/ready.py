"""Ready queues: jobs that are due, one FIFO per job type, shared by the shards a node owns.

A job in a ready queue is not yet handled (invariant 3): its bucket entries stay pending in
their shard dispatcher until a claim of it applies.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from timeshard.model import LEASE_EXPIRED, BucketEntry, Job


@dataclass(kw_only=True, slots=True)
class ReadyItem:
    job_id: str
    job_type: str
    shard: int
    fence: int  # the fence a claim must find
    run_at: int
    """The job row's ``run_at``: kept as the job's entries are written again (a waiting job's
    entry moves on every minute, its row does not), so a new owner reads it too."""
    entries: list[BucketEntry] = field(default_factory=list)
    job: Job | None = None  # the row as the dispatcher read it (saves the claim a read)

    @property
    def due_since(self) -> int:
        """Since when the job has been due: its ``run_at``, or, for a run again after its
        lease expired (the release keeps ``run_at``), the end of that lease."""
        job = self.job
        if job is not None and job.history and job.history[-1].outcome == LEASE_EXPIRED:
            return max(self.run_at, job.lease_until)
        return self.run_at


@dataclass(frozen=True, kw_only=True, slots=True)
class Unclaimed:
    """The due jobs of one type waiting in a node's ready queues for a claim."""

    jobs: int
    oldest_due: int | None
    """The ``due_since`` of the longest waiting (None when none waits)."""

    def age_ms(self, now: int) -> int:
        return max(0, now - self.oldest_due) if self.oldest_due is not None else 0


class _TypeQueue:
    """The ready jobs of one type: a FIFO per shard, taken from in turn, so that one claim
    spans many shards (their store writes go out in parallel, one batch per partition)."""

    __slots__ = ("by_shard", "shard_of", "turn")

    def __init__(self) -> None:
        self.by_shard: dict[int, OrderedDict[str, ReadyItem]] = {}
        self.shard_of: dict[str, int] = {}
        self.turn: list[int] = []  # shards with items, in the order they are served

    def __len__(self) -> int:
        return len(self.shard_of)

    def get(self, job_id: str) -> ReadyItem | None:
        shard = self.shard_of.get(job_id)
        return None if shard is None else self.by_shard[shard][job_id]

    def put(self, item: ReadyItem, *, front: bool = False) -> None:
        self.remove(item.job_id)
        q = self.by_shard.get(item.shard)
        if q is None:
            q = self.by_shard[item.shard] = OrderedDict()
        if not q:
            self.turn.insert(0, item.shard) if front else self.turn.append(item.shard)
        q[item.job_id] = item
        if front:
            q.move_to_end(item.job_id, last=False)
        self.shard_of[item.job_id] = item.shard

    def remove(self, job_id: str) -> None:
        shard = self.shard_of.pop(job_id, None)
        if shard is None:
            return
        q = self.by_shard[shard]
        del q[job_id]
        if not q:
            self.turn.remove(shard)

    def take(self, n: int) -> list[ReadyItem]:
        out: list[ReadyItem] = []
        while self.turn and len(out) < n:
            rounds, self.turn = self.turn, []
            for shard in rounds:
                q = self.by_shard[shard]
                if len(out) < n and q:
                    item = q.popitem(last=False)[1]
                    del self.shard_of[item.job_id]
                    out.append(item)
                if q:
                    self.turn.append(shard)
        return out

    def drop_shard(self, shard: int) -> None:
        q = self.by_shard.pop(shard, None)
        if q:
            for job_id in q:
                del self.shard_of[job_id]
            self.turn.remove(shard)

    def count(self, shard: int | None) -> int:
        if shard is None:
            return len(self.shard_of)
        return len(self.by_shard.get(shard, ()))

    def items(self) -> Iterable[ReadyItem]:
        for q in self.by_shard.values():
            yield from q.values()


class ReadyQueues:
    def __init__(self) -> None:
        self._by_type: dict[str, _TypeQueue] = {}
        self._waiters: list[asyncio.Future[None]] = []

    def _queue(self, job_type: str) -> _TypeQueue:
        q = self._by_type.get(job_type)
        if q is None:
            q = self._by_type[job_type] = _TypeQueue()
        return q

    def push(self, item: ReadyItem) -> None:
        q = self._queue(item.job_type)
        held = q.get(item.job_id)
        if held is not None and held.fence == item.fence:
            held.entries.extend(e for e in item.entries if e not in held.entries)
            return
        q.put(item)
        self.wake()

    def push_front(self, items: Iterable[ReadyItem]) -> None:
        for item in reversed(list(items)):
            self._queue(item.job_type).put(item, front=True)
        self.wake()

    def take(
        self, types: Iterable[str], limit: int, per_type: dict[str, int] | None = None
    ) -> list[ReadyItem]:
        """Up to ``limit`` items, oldest first within a shard and shards in turn within a
        type, types in the order given, and at most ``per_type[t]`` of type ``t`` when given."""
        out: list[ReadyItem] = []
        for t in types:
            q = self._by_type.get(t)
            if q is None:
                continue
            cap = (per_type or {}).get(t, limit)
            out += q.take(min(cap, limit - len(out)))
            if len(out) >= limit:
                break
        return out

    def replace_entry(self, old: BucketEntry, new: BucketEntry) -> None:
        """The item holding ``old`` now holds ``new`` instead (its entry was moved on)."""
        for q in self._by_type.values():
            item = q.get(old.job_id)
            if item is not None:
                item.entries = [new if e == old else e for e in item.entries]

    def find(self, job_id: str) -> ReadyItem | None:
        """The item of ``job_id`` in any type's queue (None: not queued here)."""
        for q in self._by_type.values():
            item = q.get(job_id)
            if item is not None:
                return item
        return None

    def remove(self, job_id: str) -> ReadyItem | None:
        """Take ``job_id`` out of the queues (it was cancelled, moved, or is no longer
        due); returns its item, None if it was not queued."""
        for q in self._by_type.values():
            item = q.get(job_id)
            if item is not None:
                q.remove(job_id)
                return item
        return None

    def job_ids(self, shard: int) -> set[str]:
        """The jobs of ``shard`` queued here."""
        return {i for q in self._by_type.values() for i in q.by_shard.get(shard, ())}

    def unclaimed(self) -> dict[str, Unclaimed]:
        """Per type ever queued on this node (an emptied type stays, at zero, so a gauge of
        it falls to 0 rather than vanishing): how many jobs wait for a claim and since when
        the oldest is due. A pass over the queued items: for scrapes and status, not the
        hot path."""
        out: dict[str, Unclaimed] = {}
        for t, q in self._by_type.items():
            oldest = min((i.due_since for i in q.items()), default=None)
            out[t] = Unclaimed(jobs=len(q), oldest_due=oldest)
        return out

    def types(self) -> list[str]:
        return list(self._by_type)

    def holds(self, job_type: str, job_id: str) -> bool:
        q = self._by_type.get(job_type)
        return q is not None and q.get(job_id) is not None

    def has_any(self, types: Iterable[str]) -> bool:
        return any(self._by_type.get(t) for t in types)

    def count(self, shard: int | None = None) -> int:
        return sum(q.count(shard) for q in self._by_type.values())

    def drop_shard(self, shard: int) -> None:
        for q in self._by_type.values():
            q.drop_shard(shard)

    def waiter(self) -> asyncio.Future[None]:
        """A future done at the next change (a push, or ``wake``). Registered at once, so a
        caller that checks the queues and then waits can not miss a push in between."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def wake(self) -> None:
        """Wake every waiter (something changed: jobs were pushed, or room was freed)."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
