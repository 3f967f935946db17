"""The claim side of a node: long-polled claims of ready jobs, each a conditional write on its
fence (invariant 5); the linger that lets jobs coming due join a claim; and each limited job
type's running jobs, which decide how many more this node may start. The ``Node`` owns one
``Claims``, which the servicers call as ``node.claims``; no gRPC types here."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from timeshard.clock import Clock, SystemClock, sleep_or_wake
from timeshard.errors import InvalidArgument, NotOwner
from timeshard.limits import MAX_CLAIM_JOBS, check_range
from timeshard.model import Job, JobState, validate_job_type
from timeshard.node.dispatcher import ShardDispatcher
from timeshard.node.flow import FlowControl
from timeshard.node.ready import ReadyItem, ReadyQueues
from timeshard.observe.events import NodeMetrics
from timeshard.policy import TypePolicy as TypePolicy  # (the node's modules import it here)
from timeshard.store.base import JobClaim, Store

CLAIM_LINGER_MS = 2
"""A claim that found fewer jobs than it may take waits this long at most for jobs coming due
meanwhile (see ``Claims._linger``)."""


AHEAD_BACKLOG_MS = 1000
"""Jobs of a type are not claimed ahead while one of it has waited ready this long: under a
backlog a held job would wait for a worker with its lease running (``may_claim_ahead``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Claimed:
    job: Job
    lease_ms: int


class Claims:
    """Claims from a node's ready queues. ``dispatchers`` is the node's own map of the shards
    it owns (read, never changed here); ``land`` hands the node entries it just wrote;
    ``lease_ms`` turns a requested lease into the one granted."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        ready: ReadyQueues,
        dispatchers: Mapping[int, ShardDispatcher],
        metrics: NodeMetrics,
        policies: Mapping[str, TypePolicy],
        lease_ms: Callable[[float], int],
        flow: FlowControl | None = None,
        delivered: Callable[[Job, str], None] | None = None,
        next_due: Callable[[], int | None] | None = None,
    ) -> None:
        self._store = store
        self._flow = flow if flow is not None else FlowControl(clock, {})
        self._clock = clock
        self._ready = ready
        self._dispatchers = dispatchers
        self._metrics = metrics
        self._policies = policies
        self._lease_ms = lease_ms
        self._delivered = delivered
        self._asked: dict[str, int] = {}
        """By job type: the lease the latest claim for it asked (``asked_lease``)."""
        self._next_due = next_due if next_due is not None else self._scan_due
        """When the earliest entry any dispatcher holds comes due (the node's ``DueTimer``)."""
        self._running: dict[str, dict[str, int]] = {}  # type -> job id -> lease_until
        self._asking: Counter[str] = Counter()
        """Claims in flight per type: waiting for its jobs, or writing those they took."""

    async def claim(
        self,
        *,
        worker: str,
        types: Sequence[str],
        limit: int,
        wait_s: float,
        lease_s: float,
        caps: Mapping[str, int] | None = None,
        give_up: Callable[[], bool] | None = None,
        before_write: Callable[[Sequence[ReadyItem]], None] | None = None,
        early: bool = False,
    ) -> list[Claimed]:
        """Long-poll: wait up to ``wait_s`` for due jobs of ``types`` and claim up to ``limit``
        with a conditional write each (invariant 5); at most ``caps[t]`` of a type ``t`` named
        there (a worker stream's credits). The wait ends early, with none, once ``give_up()``
        holds when the ready queues wake (``ReadyQueues.wake``). ``before_write(items)`` is
        called with the jobs taken just before each claim's write takes its time (their leases
        start after it). ``early``: the worker starts a job on its own clock (``starts_in``),
        so jobs claimed ahead are taken before they are due too (the early lane)."""
        if not worker:
            raise InvalidArgument("worker_id", "a worker id is required")
        if not types:
            raise InvalidArgument("types", "name at least one job type to claim")
        for t in types:
            validate_job_type(t)
        check_range("max_jobs", limit, 1, MAX_CLAIM_JOBS)
        lease = self._lease_ms(lease_s)
        self._asked.update(dict.fromkeys(types, lease))
        deadline = self._clock.monotonic() + max(0.0, min(wait_s, 60.0))
        self._asking.update(types)
        try:
            return await self._claim_until(
                deadline, worker, types, limit, lease, caps, give_up, before_write, early
            )
        finally:
            self._asking.subtract(types)

    async def _claim_until(
        self,
        deadline: float,
        worker: str,
        types: Sequence[str],
        limit: int,
        lease: int,
        caps: Mapping[str, int] | None,
        give_up: Callable[[], bool] | None,
        before_write: Callable[[Sequence[ReadyItem]], None] | None,
        early: bool,
    ) -> list[Claimed]:
        """``claim``'s loop, until ``deadline`` (the clock's monotonic seconds)."""
        while True:
            limited = self._type_room(types)
            room = _capped(limited, caps)
            items = self._ready.take(types, limit, room)
            if early and len(items) < limit:
                items += self._ready.take_early(types, limit - len(items), _less(room, items))
            if items:
                if len(items) < limit and not limited and type(self._clock) is SystemClock:
                    items += await self._linger(items, types, limit - len(items), room)
                self._ready.pass_on(types)  # jobs left over: the next waiting claim
                if before_write is not None:
                    before_write(items)
                claimed = await self._claim_spending(items, worker, lease, early)
                if claimed:
                    return claimed
                continue
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0 or (give_up is not None and give_up()):
                self._ready.pass_on(types)
                return []
            await self._wait_ready(types, room, remaining, early)
            if give_up is not None and give_up():
                self._ready.pass_on(types)  # a wake this claim had goes to another
                return []

    async def _linger(
        self,
        held: list[ReadyItem],
        types: Sequence[str],
        room: int,
        caps: dict[str, int] | None = None,
    ) -> list[ReadyItem]:
        """Jobs coming due within ``CLAIM_LINGER_MS`` join a claim that found fewer than it may
        take (each once its dispatcher made it ready: never early), so trickling jobs go out a
        few per claim and per result call rather than one each: those two calls were most of
        a trickling job's cost. Only while a dispatcher holds an entry due that soon, so a
        claim among sparse jobs answers at once. (Not for types with a concurrency limit.)"""
        more: list[ReadyItem] = []
        until = self._clock.now_ms() + CLAIM_LINGER_MS
        try:
            while len(more) < room:
                due = self._next_due()
                now = self._clock.now_ms()
                if due is None or due > until or now > due + CLAIM_LINGER_MS:
                    break  # none due that soon, or its dispatcher is late: answer now
                changed = self._ready.waiter(_with_room(types, caps))
                await self._wait_change(changed, (due + CLAIM_LINGER_MS - now) / 1000)
                left = _less(caps, held, more)
                more += self._ready.take(types, room - len(more), left)
        except BaseException:
            self._ready.push_front([*held, *more])  # the caller gave up: they stay ready
            raise
        return more

    def _scan_due(self) -> int | None:
        """``next_due`` without a node's timer: a pass over the dispatchers."""
        return min(
            (d for d in map(ShardDispatcher.next_due, self._dispatchers.values()) if d),
            default=None,
        )

    def share(self) -> float:
        """This node's part of the shards, 0-1: of a type's rate, what it may start."""
        dispatching = sum(1 for d in self._dispatchers.values() if not d.deposed)
        return dispatching / self._store.num_shards

    def held(self, job_type: str) -> str:
        """Why this node hands out no ready job of ``job_type`` now: ``"paused"``, ``"rate"``
        or "" (``FlowControl.held``). A held job stays ready, in its place, and is never
        taken by a claim."""
        self._flow.room(job_type, self.share())  # its bucket refilled up to now
        return self._flow.held(job_type)

    def _type_room(self, types: Sequence[str]) -> dict[str, int]:
        """How many more jobs of each limited type this node may start now: under its
        concurrency limit, its rate and its pause."""
        now = self._clock.now_ms()
        owned = len(self._dispatchers)
        room: dict[str, int] = {}
        if self._flow.any(types):  # (the share is a pass over the dispatchers: only then)
            share = self.share()
            for t in types:
                flow = self._flow.room(t, share)
                if flow is not None:
                    room[t] = flow
        for t in types:
            policy = self._policies.get(t)
            if policy is None or policy.concurrency is None:
                continue
            running = self._running.setdefault(t, {})
            for job_id in [j for j, until in running.items() if until <= now]:
                del running[job_id]  # lease over: no longer running as far as limits go
            part = max(1, policy.concurrency * owned // self._store.num_shards) if owned else 0
            room[t] = min(room.get(t, part), max(0, part - len(running)))
        return room

    async def _claim_spending(
        self, items: list[ReadyItem], worker: str, lease: int, ahead: bool = False
    ) -> list[Claimed]:
        """``_claim_items``, with a rate token spent per job taken and given back for each
        claim that did not apply (or all of them, if the write failed)."""
        if not self._flow.any(i.job_type for i in items):
            return await self._claim_items(items, worker, lease, ahead)
        spent = self._flow.take(Counter(i.job_type for i in items))
        try:
            claimed = await self._claim_items(items, worker, lease)
        except BaseException:
            self._flow.give_back(spent)
            raise
        started = Counter(c.job.job_type for c in claimed)
        self._flow.give_back({t: n - started[t] for t, n in spent.items() if n > started[t]})
        return claimed

    def track(self, job: Job) -> None:
        """Follow a job of a configured type from the job a write returned: running until its
        lease is over, or no longer running."""
        if job.job_type in self._policies:
            running = self._running.setdefault(job.job_type, {})
            if job.state is JobState.RUNNING:
                running[job.job_id] = job.lease_until
            elif running.pop(job.job_id, None) is not None:
                self._ready.wake()  # room under the type's limit: claims waiting for it go on

    def frees_room(self, job_id: str) -> bool:
        """Whether ``job_id`` runs here under a type's concurrency limit: its end lets another
        job of the type start, so its result should not wait to be written."""
        for job_type, running in self._running.items():
            policy = self._policies.get(job_type)
            if policy is not None and policy.concurrency is not None and job_id in running:
                return True
        return False

    async def _wait_ready(
        self, types: Sequence[str], room: Mapping[str, int], timeout: float, early: bool = False
    ) -> None:
        """Wait for a job of a type this claim has room for (registered before anything is
        awaited, so no push is missed: a missed one left claims asleep for a whole long poll),
        for room (``ReadyQueues.wake``; with room for no type, any push), or, when jobs wait
        only for room under a concurrency limit, at most a second."""
        changed = self._ready.waiter(_with_room(types, room) or None, early=early)
        if self._ready.has_any(types):
            timeout = min(timeout, 1.0)
            token = (
                self._flow.next_token_s(
                    [t for t in types if self._ready.has_any([t])], self.share()
                )
                if self._flow.any(types)
                else None
            )
            if token is not None:  # held by a rate: look again when its next token is due
                timeout = min(timeout, token)
        await self._wait_change(changed, timeout)

    async def _wait_change(self, changed: asyncio.Future[None], timeout: float) -> None:
        """Wait for ``changed`` (a ready-queue waiter) or ``timeout`` seconds; a waiter not
        woken is cancelled, so no wake is spent on it later."""
        try:
            await sleep_or_wake(self._clock, timeout, changed)
        finally:
            changed.cancel()

    def _expire(self, late: list[ReadyItem]) -> None:
        """Jobs taken for a claim after their deadline go to their dispatcher, which expires
        them (a shard no longer owned here has a new owner, which finds them itself)."""
        for item in late:
            d = self._dispatchers.get(item.shard)
            if d is not None:
                d.expire_overdue([item])

    def asked_lease(self, job_type: str) -> int | None:
        """The lease (ms) the latest claim for ``job_type`` asked for, as granted; None if no
        claim asked yet. A job claimed ahead takes it from its due time, so a worker lost with
        it frees it after the lease workers ask for, not the node's default."""
        return self._asked.get(job_type)

    def may_claim_ahead(self, job_type: str) -> bool:
        """Whether jobs of ``job_type`` may be claimed ahead and held (``node.ahead``): a claim
        here is in flight for the type, none of it has waited ready longer than
        ``AHEAD_BACKLOG_MS`` (the workers keep up), and nothing decides its start at the
        claim (a concurrency limit, a rate, a pause).

        A claim in flight counts whether it waits for jobs or writes the ones it took: a
        worker stream keeps a few claims in flight, and while each writes jobs claimed at
        their due time (a Paxos round on Cassandra) none may be waiting. Were only waiting
        claims counted, a moment of due-time claims at a high rate would leave none waiting
        when the next jobs are looked at, so those too would be claimed at their due time,
        and the node would not go back to claiming ahead."""
        policy = self._policies.get(job_type)
        if policy is not None and policy.concurrency is not None:
            return False
        if self._flow.any([job_type]) or self._asking[job_type] <= 0:
            return False
        oldest = self._ready.oldest_due(job_type)
        return oldest is None or self._clock.now_ms() - oldest < AHEAD_BACKLOG_MS

    def _hand_out(self, held: list[ReadyItem], worker: str, lease: int, now: int) -> list[Claimed]:
        """Jobs claimed ahead by their owner, due now (or, to a worker that starts them on its
        own clock, within the window): given as claimed, no store call. One whose lease has
        less than half left (no worker took it for that long) is not given: its lease's end
        releases it, not started."""
        out: list[Claimed] = []
        for item in held:
            job = item.job
            assert job is not None
            if item.dropped:  # cancelled through this node since the claim took it
                continue
            left = job.lease_until - now
            if 2 * left < min(lease, job.lease_until - job.started_at):
                continue
            out.append(Claimed(job=job, lease_ms=left))
            self._metrics.claimed(job, now)
            if self._delivered is not None:
                self._delivered(job, worker)
            if (d := self._dispatchers.get(item.shard)) is not None:
                d.handed_out(item.job_id)
        return out

    async def _claim_items(
        self, items: list[ReadyItem], worker: str, lease: int, ahead: bool = False
    ) -> list[Claimed]:
        now = self._clock.now_ms()
        held = [i for i in items if i.claimed and (ahead or i.run_at <= now)]
        if held:
            items = [i for i in items if not (i.claimed and (ahead or i.run_at <= now))]
            given = self._hand_out(held, worker, lease, now)
            if items:
                given += await self._claim_items(items, worker, lease)
            return given
        early = [i for i in items if i.run_at > now]  # never early, even across clock steps
        late = [i for i in items if 0 < i.deadline < now]  # never late: the dispatcher expires
        items = [i for i in items if i.run_at <= now and not 0 < i.deadline < now]
        if early:
            self._ready.push_front(early)
        self._expire(late)
        requests = [
            JobClaim(
                job_id=i.job_id,
                expect_fence=i.fence,
                worker=worker,
                now=now,
                lease_until=now + lease,
                known=i.job,
            )
            for i in items
        ]
        try:
            outcomes = await self._store.claim_jobs(requests)
        except NotOwner as exc:  # deposed in a partition: the new owner dispatches these
            d = self._dispatchers.get(exc.shard)
            if d is not None:
                d.deposed_by_store()
            self._ready.push_front([i for i in items if i.shard != exc.shard])
            return []
        except BaseException:  # store down, or the caller gave up (deadline, disconnect)
            self._ready.push_front(items)  # a claim that did apply is found by its fence later
            raise
        claimed: list[Claimed] = []
        for item, out in zip(items, outcomes, strict=True):
            d = self._dispatchers.get(item.shard)
            if out.applied and out.job is not None:
                claimed.append(Claimed(job=out.job, lease_ms=lease))
                self._metrics.claimed(out.job, now)
                self.track(out.job)
                if self._delivered is not None:
                    self._delivered(out.job, "")
                if d is not None:
                    d.claimed(item.entries, out.job)
            elif d is not None:
                d.recheck(item.entries)
        return claimed


def _capped(room: dict[str, int], caps: Mapping[str, int] | None) -> dict[str, int]:
    """Room per type under the concurrency limits, lowered to ``caps`` where given."""
    if not caps:
        return room
    out = dict(room)
    for t, cap in caps.items():
        out[t] = min(out.get(t, cap), cap)
    return out


def _with_room(types: Sequence[str], room: Mapping[str, int] | None) -> list[str]:
    """The ``types`` with room for a job (those not in ``room`` have no limit)."""
    if not room:
        return list(types)
    return [t for t in types if room.get(t, 1) > 0]


def _less(caps: dict[str, int] | None, *taken: Sequence[ReadyItem]) -> dict[str, int] | None:
    """``caps`` less the items already taken of each type."""
    if not caps:
        return caps
    left = dict(caps)
    for items in taken:
        for i in items:
            if i.job_type in left:
                left[i.job_type] = max(0, left[i.job_type] - 1)
    return left
