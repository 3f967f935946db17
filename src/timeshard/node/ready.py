"""Ready queues: jobs that are due, one queue per job type, shared by the shards a node owns.

Within a type, higher priority first, with aging: a job's rank is the time it came due less
``priority * aging_ms``, lowest rank first (then the order it was queued in). So a job of
priority ``p`` goes before every job of priority ``q`` that came due more than
``(q - p) * aging_ms`` after it: however many higher-priority jobs keep coming, a waiting job is
passed only by those due at most ``MAX_PRIORITY * aging_ms`` after it, and never waits more than
that longer than they do. Jobs of one priority go oldest first.

Beside them, per type, the *early lane*: jobs claimed ahead by their owner and handed over before
they are due, only to claims whose worker starts them on its own clock (``starts_in``: a worker
stream whose hello accepts it). At its due time a job still there moves to its type's queue,
where any claim takes it (``ShardDispatcher``).

A job in a ready queue is not yet handled (invariant 3): its bucket entries stay pending in
their shard dispatcher until a claim of it applies. Every job held here, whatever holds it
back (no worker, a concurrency limit, or any other hold on its type), is expired by its
dispatcher once its deadline passes (``ShardDispatcher``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from timeshard.limits import DEFAULT_PRIORITY_AGING_MS
from timeshard.model import LEASE_EXPIRED, BucketEntry, Job

EARLY_GATHER_S = 0.003
"""A job put in the early lane wakes a claim this much later (``ReadyQueues.push_early``): the
shards' dispatchers hand their held jobs over on one tick but wake a ms or two apart, and each
of their jobs woke a claim of its own, so one tick's jobs went out in a push per stream
waiting (at a trickle a push is most of what a job costs). They are due a window later, so
none is late for it."""


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
    priority: int = 0
    deadline: int = 0
    """The job's deadline (0: none): its dispatcher expires it then if it is still here."""
    claimed: bool = False
    """Claimed ahead by its owner (``ShardDispatcher``): ``job`` is the claimed row, handed to
    a worker with no store call."""
    dropped: bool = False
    """Cancelled or moved by its owner while a claim had taken it: not handed out."""
    rank: tuple[int, int, str] | None = None
    """Its place in its type's queue, set when first queued (``_TypeQueue.put``)."""

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


class _ShardQueue:
    """The ready jobs of one type on one shard, in the order they are to be handed out: a heap
    of ranks. A removed item leaves its rank in the heap, skipped when it reaches the top (and
    the heap is rebuilt when such ranks outnumber the items)."""

    __slots__ = ("heap", "items")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, str]] = []  # ReadyItem.rank
        self.items: dict[str, ReadyItem] = {}

    def head(self) -> tuple[int, int, str] | None:
        heap, items = self.heap, self.items
        while heap:
            top = heap[0]
            item = items.get(top[2])
            if item is not None and item.rank == top:
                return top
            heapq.heappop(heap)
        return None

    def add(self, item: ReadyItem, rank: tuple[int, int, str]) -> None:
        self.items[item.job_id] = item
        heapq.heappush(self.heap, rank)

    def discard(self, job_id: str) -> ReadyItem:
        item = self.items.pop(job_id)
        if len(self.heap) > 2 * len(self.items) + 64:  # mostly removed ranks: rebuild
            self.heap = [i.rank for i in self.items.values() if i.rank is not None]
            heapq.heapify(self.heap)
        return item

    def pop(self) -> ReadyItem:
        """The first item (``head()`` is not None)."""
        return self.items.pop(heapq.heappop(self.heap)[2])


class _TypeQueue:
    """The ready jobs of one type, highest first by rank (``ReadyItem.rank``: with aging, then
    oldest first), a queue per shard. A take merges the shards' heads, and among heads of equal
    rank takes one of each shard before a second of any, so that one claim of a burst spans
    many shards (their store writes go out in parallel, one batch per partition)."""

    __slots__ = ("aging_ms", "by_shard", "seq", "shard_of")

    def __init__(self, aging_ms: int) -> None:
        self.aging_ms = aging_ms
        self.by_shard: dict[int, _ShardQueue] = {}
        self.shard_of: dict[str, int] = {}
        self.seq = 0

    def __len__(self) -> int:
        return len(self.shard_of)

    def get(self, job_id: str) -> ReadyItem | None:
        shard = self.shard_of.get(job_id)
        return None if shard is None else self.by_shard[shard].items[job_id]

    def put(self, item: ReadyItem) -> None:
        """Queue ``item`` in rank order. An item queued before (given back after a claim that
        did not go through) keeps its rank, so it goes back where it was."""
        self.remove(item.job_id)
        if item.rank is None:
            self.seq += 1
            item.rank = (item.due_since - item.priority * self.aging_ms, self.seq, item.job_id)
        q = self.by_shard.get(item.shard)
        if q is None:
            q = self.by_shard[item.shard] = _ShardQueue()
        q.add(item, item.rank)
        self.shard_of[item.job_id] = item.shard

    def remove(self, job_id: str) -> None:
        shard = self.shard_of.pop(job_id, None)
        if shard is None:
            return
        q = self.by_shard[shard]
        q.discard(job_id)
        if not q.items:
            del self.by_shard[shard]

    def take(self, n: int) -> list[ReadyItem]:
        out: list[ReadyItem] = []
        if n <= 0 or not self.shard_of:
            return out
        heads = []
        for shard, q in self.by_shard.items():
            top = q.head()
            if top is not None:
                heads.append((top[0], 0, shard))
        heapq.heapify(heads)
        while heads and len(out) < n:
            _, depth, shard = heapq.heappop(heads)
            q = self.by_shard[shard]
            item = q.pop()
            del self.shard_of[item.job_id]
            out.append(item)
            top = q.head() if q.items else None
            if top is not None:
                heapq.heappush(heads, (top[0], depth + 1, shard))
            else:
                del self.by_shard[shard]
        return out

    def drop_shard(self, shard: int) -> None:
        q = self.by_shard.pop(shard, None)
        if q:
            for job_id in q.items:
                del self.shard_of[job_id]

    def count(self, shard: int | None) -> int:
        if shard is None:
            return len(self.shard_of)
        q = self.by_shard.get(shard)
        return len(q.items) if q else 0

    def items(self) -> Iterable[ReadyItem]:
        for q in self.by_shard.values():
            yield from q.items.values()

    def shard_ids(self, shard: int) -> Iterable[str]:
        q = self.by_shard.get(shard)
        return q.items.keys() if q else ()


class ReadyQueues:
    def __init__(
        self, *, aging_ms: int = DEFAULT_PRIORITY_AGING_MS, gather_early_s: float = 0.0
    ) -> None:
        """``gather_early_s``: how long a job put in the early lane waits for the others of
        its hand-over before it wakes a claim (``EARLY_GATHER_S``; 0: at once)."""
        if aging_ms < 1:
            raise ValueError(f"priority aging must be at least 1 ms, got {aging_ms}")
        self.aging_ms = aging_ms
        self._by_type: dict[str, _TypeQueue] = {}
        self._waiters: list[asyncio.Future[None]] = []
        """Waiters for any change (``waiter()`` without types)."""
        self._by_type_waiters: dict[str, deque[asyncio.Future[None]]] = {}
        """Waiters for jobs of a type, oldest first (one waiting for several types is in each
        of their queues; done futures are skipped as they come up)."""
        self._early: dict[str, dict[str, ReadyItem]] = {}
        """The early lane: per type, jobs claimed ahead and not due yet, in hand-over order."""
        self._early_waiters: dict[str, deque[asyncio.Future[None]]] = {}
        """Waiters that may take from the early lane, per type (they are in the others too)."""
        self._gather_early_s = gather_early_s
        self._early_wake: asyncio.TimerHandle | None = None
        """Wakes a claim for the jobs put in the early lane lately (``_wake_early``)."""

    def _queue(self, job_type: str) -> _TypeQueue:
        q = self._by_type.get(job_type)
        if q is None:
            q = self._by_type[job_type] = _TypeQueue(self.aging_ms)
        return q

    def push(self, item: ReadyItem) -> None:
        q = self._queue(item.job_type)
        held = q.get(item.job_id)
        if held is not None and held.fence == item.fence and held.claimed == item.claimed:
            held.entries.extend(e for e in item.entries if e not in held.entries)
            return
        q.put(item)
        self._wake_for(item.job_type, 1)

    def push_front(self, items: Iterable[ReadyItem]) -> None:
        """Items taken and not claimed go back: each to its old place (its rank)."""
        added: Counter[str] = Counter()
        for item in items:
            self._queue(item.job_type).put(item)
            added[item.job_type] += 1
        for t, n in added.items():
            self._wake_for(t, n)

    def take(
        self, types: Iterable[str], limit: int, per_type: dict[str, int] | None = None
    ) -> list[ReadyItem]:
        """Up to ``limit`` items, by rank within a type (priority with aging, then oldest
        first; shards in turn among equals), types in the order given, and at most
        ``per_type[t]`` of type ``t`` when given."""
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

    def push_early(self, item: ReadyItem) -> None:
        """A job claimed ahead, not due yet: only a claim that takes early jobs gets it."""
        self._early.setdefault(item.job_type, {})[item.job_id] = item
        if self._gather_early_s <= 0:
            self._wake_one(self._early_waiters.get(item.job_type))
        elif self._early_wake is None:
            loop = asyncio.get_running_loop()
            self._early_wake = loop.call_later(self._gather_early_s, self._wake_early)

    def _wake_early(self) -> None:
        """The jobs put in the early lane lately wake one claim per type, which takes them
        all (as many as it may: ``pass_on`` wakes another for the rest)."""
        self._early_wake = None
        for t, lane in self._early.items():
            if lane:
                self._wake_one(self._early_waiters.get(t))

    def take_early(
        self, types: Iterable[str], limit: int, per_type: dict[str, int] | None = None
    ) -> list[ReadyItem]:
        """Up to ``limit`` jobs of the early lane (``push_early``), types in the order given,
        at most ``per_type[t]`` of type ``t`` when given."""
        out: list[ReadyItem] = []
        for t in types:
            lane = self._early.get(t)
            if not lane:
                continue
            cap = min((per_type or {}).get(t, limit), limit - len(out))
            for job_id in list(itertools.islice(lane, max(0, cap))):
                out.append(lane.pop(job_id))
            if len(out) >= limit:
                break
        return out

    def due_early(self, job_id: str, job_type: str) -> ReadyItem | None:
        """``job_id`` is due: out of the early lane (None: it was taken, or never there)."""
        lane = self._early.get(job_type)
        return lane.pop(job_id, None) if lane else None

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
        for lane in self._early.values():
            item = lane.pop(job_id, None)
            if item is not None:
                return item
        return None

    def job_ids(self, shard: int) -> set[str]:
        """The jobs of ``shard`` queued here."""
        return {i for q in self._by_type.values() for i in q.shard_ids(shard)}

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

    def oldest_due(self, job_type: str) -> int | None:
        """About since when the longest waiting job of ``job_type`` is due: the earliest
        ``due_since`` among the heads of its shards' queues (None: none queued)."""
        q = self._by_type.get(job_type)
        if not q:
            return None
        heads = (sq.items[top[2]] for sq in q.by_shard.values() if (top := sq.head()))
        return min((i.due_since for i in heads), default=None)

    def has_waiter(self, job_type: str) -> bool:
        """Whether a claim waits for a job of ``job_type`` now."""
        return any(not f.done() for f in self._by_type_waiters.get(job_type, ()))

    def has_any(self, types: Iterable[str]) -> bool:
        return any(self._by_type.get(t) for t in types)

    def count(self, shard: int | None = None) -> int:
        return sum(q.count(shard) for q in self._by_type.values())

    def drop_shard(self, shard: int) -> None:
        for q in self._by_type.values():
            q.drop_shard(shard)
        for t, lane in self._early.items():
            self._early[t] = {i: item for i, item in lane.items() if item.shard != shard}

    def waiter(
        self, types: Iterable[str] | None = None, *, early: bool = False
    ) -> asyncio.Future[None]:
        """A future done at the next change that concerns it: with ``types``, a job of one of
        them queued, one waiter per job (the oldest first), or a ``wake``; without, any push.
        Registered at once, so a caller that checks the queues and then waits can not miss a
        push in between. A waiter woken for a job it then does not take passes the wake on
        (``pass_on``), so a queued job never waits while a waiter that would take it sleeps.
        ``early``: it takes from the early lane too, and a job put there wakes it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if types is None:
            self._waiters.append(fut)
            return fut
        for t in types:
            _enlist(self._by_type_waiters, t, fut)
            if early:
                _enlist(self._early_waiters, t, fut)
        return fut

    def _wake_for(self, job_type: str, n: int) -> None:
        """``n`` jobs of ``job_type`` were queued: wake as many of its waiters (not all: with W
        worker streams waiting, a job woke W claims, W - 1 of them for nothing), and every
        waiter for any change."""
        if self._waiters:
            self._wake_all(self._waiters)
            self._waiters = []
        waiting = self._by_type_waiters.get(job_type)
        while waiting and n > 0:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    @staticmethod
    def _wake_one(waiting: deque[asyncio.Future[None]] | None) -> None:
        while waiting:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def pass_on(self, types: Iterable[str]) -> None:
        """A claim woke or looked for ``types`` and is done taking: for each of them with jobs
        still queued, wake one more waiter (the wake it may have had for a job it did not
        take goes on to the next)."""
        for t in types:
            if self._by_type.get(t):
                self._wake_for(t, 1)
            if self._early.get(t):
                self._wake_one(self._early_waiters.get(t))

    def wake(self) -> None:
        """Wake every waiter (something changed for all: room was freed, a stream's credits or
        stop)."""
        self._wake_all(self._waiters)
        self._waiters = []
        for waiting in [*self._by_type_waiters.values(), *self._early_waiters.values()]:
            self._wake_all(waiting)
            waiting.clear()

    @staticmethod
    def _wake_all(waiters: Iterable[asyncio.Future[None]]) -> None:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def _enlist(
    waiters: dict[str, deque[asyncio.Future[None]]], t: str, fut: asyncio.Future[None]
) -> None:
    waiting = waiters.setdefault(t, deque())
    if len(waiting) > 64 and waiting[0].done():  # drop those given up meanwhile
        waiters[t] = waiting = deque(w for w in waiting if not w.done())
    waiting.append(fut)
