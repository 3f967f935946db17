"""A scheduler node: the store, the coordinator, one dispatcher per owned shard, and the parts
whose operations the gRPC servicers expose: jobs are scheduled, read and cancelled by its
``timeshard.node.jobs.Jobs``, claims made by its ``timeshard.node.claims.Claims``, and the
workers' heartbeats and results taken by its ``timeshard.node.attempts.Attempts``. No gRPC types
here."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from timeshard.clock import Clock, SystemClock
from timeshard.coordinator.base import Coordinator, Member, ShardsNotTaken
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import InvalidArgument, StoreUnavailable, TimeshardError
from timeshard.limits import DEFAULT_MAX_UNSTARTED, DEFAULT_PRIORITY_AGING_MS
from timeshard.model import BucketEntry, Job, JobState
from timeshard.node import clockcheck
from timeshard.node.ahead import HELD, AheadClaims, reach_ms
from timeshard.node.attempts import Attempts, result_linger_s
from timeshard.node.claims import Claims, TypePolicy
from timeshard.node.connected import ConnectedWorkers
from timeshard.node.deadletters import DeadLetters
from timeshard.node.dispatcher import DispatchConfig, ShardDispatcher
from timeshard.node.dispatchparts import DispatchParts
from timeshard.node.flow import FlowControl, TypeFlow
from timeshard.node.jobs import Jobs
from timeshard.node.peers import HINT_MARGIN_S, PeerHints, Send
from timeshard.node.policies import TypePolicies
from timeshard.node.polled import PolledTypes
from timeshard.node.ready import EARLY_GATHER_S, ReadyQueues
from timeshard.node.refresh import BucketRefresher
from timeshard.node.retry import RetryPolicy
from timeshard.node.revokes import Revokes
from timeshard.node.scheduleops import ScheduleOps
from timeshard.node.schedules import ScheduleFirer
from timeshard.node.starts import StartNotices
from timeshard.node.timer import DueTimer
from timeshard.node.waits import JobWaits
from timeshard.node.why import Explainer
from timeshard.observe.events import NodeMetrics
from timeshard.sharding import minute_of, shard_of
from timeshard.store.base import Store, entry_at

log = logging.getLogger(__name__)

RELAND_REPEATS = 3
"""How many times a writer writes a late entry again while each write lands late too."""
TAKE_CONCURRENCY = 64
"""Shards whose epochs are being taken at once when a node gains many (a node taking over a
dead one's shards): each is a read and a conditional write, one round trip after another."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeConfig:
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    default_max_attempts: int = 3
    default_max_unstarted: int = DEFAULT_MAX_UNSTARTED
    max_ready: int = 0
    """Due jobs ready on this node and not started before ScheduleJob refuses more due-now
    work (RESOURCE_EXHAUSTED with a retry-after); 0: no bound."""
    default_lease_s: float = 30.0
    max_lease_s: float = 600.0
    min_lease_s: float = 1.0
    types: dict[str, TypePolicy] = field(default_factory=dict)
    flows: dict[str, TypeFlow] = field(default_factory=dict)
    """Per type: rate and pause (``timeshard.node.flow``); stored ones win, as for ``types``."""
    priority_aging_s: float = DEFAULT_PRIORITY_AGING_MS / 1000
    """How long a waiting job takes to gain one priority level (``timeshard.node.ready``)."""
    open_timeout_s: float = 120.0
    """How long a starting node waits for its store to be reachable (retrying) before it
    gives up: a node restarted while one Cassandra node is down, or the cluster is busy, must
    not exit on the first timed-out query (seen in the chaos soak)."""

    def max_attempts(self, job_type: str) -> int:
        p = self.types.get(job_type)
        return p.max_attempts if p and p.max_attempts else self.default_max_attempts

    def retry_policy(self, job_type: str) -> RetryPolicy:
        p = self.types.get(job_type)
        return p.retry if p and p.retry else self.retry

    def max_unstarted(self, job: Job) -> int:
        """Deliveries without a handler start before ``job`` is dead (invariant 9)."""
        p = self.types.get(job.job_type)
        return p.max_unstarted if p and p.max_unstarted else self.default_max_unstarted

    @property
    def ahead_reach_ms(self) -> int:
        """How far ahead a claim ahead may take a job at a trickle (``node.ahead.reach_ms``;
        0: claims ahead are off)."""
        d = self.dispatch
        return reach_ms(d.claim_ahead_ms, d.lookahead_s, d.refresh_s, self.lease_ms(0))

    def lease_ms(self, lease_s: float) -> int:
        """The lease granted, in ms, for one of ``lease_s`` asked for (0: the default)."""
        if lease_s < 0:
            raise InvalidArgument("lease", "must not be negative")
        lease_s = lease_s or self.default_lease_s
        return round(min(max(lease_s, self.min_lease_s), self.max_lease_s) * 1000)


class Node:
    def __init__(
        self,
        *,
        store: Store,
        coordinator: Coordinator,
        clock: Clock,
        config: NodeConfig | None = None,
        node_id: str | None = None,
        address: str = "",
        rng: random.Random | None = None,
        peer_send: Send | None = None,
    ) -> None:
        self.store = store
        self.coordinator = coordinator
        self.clock = clock
        self.config = config or NodeConfig()
        self.node_id = node_id or f"node-{uuid.uuid4().hex[:8]}"
        self.address = address
        self.ready = self._new_ready()
        self.dispatchers: dict[int, ShardDispatcher] = {}
        self.timer = DueTimer(self.clock)  # one timer for every dispatcher's wait
        self.metrics = NodeMetrics(clock)
        self._shard_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self.schedules = ScheduleOps(store, clock, land=self._land)
        self.explain = Explainer(store, clock)  # why an occurrence ran or not (``node.why``)
        self.flow = FlowControl(clock, self.config.flows)
        """Per type: the rate's token bucket and the pause; claims ask it (``Claims.held``)."""
        self.claims = self._new_claims()
        self.ahead = self._new_ahead()  # claims ahead of due time (0 ms: off)
        self.starts = StartNotices(clock, self.metrics.started)
        """Start notices of the jobs this node delivered (invariant 9, ``node.starts``)."""
        self.waits = JobWaits(store, clock)
        """Clients waiting for jobs to finish (``WaitJobs``)."""
        self.revokes = self._new_revokes()
        self.jobs = self._new_jobs()
        """Scheduling, reading, cancelling and rescheduling jobs (``node.jobs``)."""
        self.attempts = self._new_attempts(rng or random.Random())
        """Heartbeats, start notices and results of the workers (``node.attempts``)."""
        self.dead_letters = DeadLetters(store, clock, self._land, self.jobs.list_jobs)
        self.polled = PolledTypes(clock)
        """The job types workers ask this node for (``node.polled``)."""
        self.workers = ConnectedWorkers(clock)
        """The workers connected to this node now (``node.connected``)."""
        self.type_policies = TypePolicies(
            store, clock, self.config.types, self.config.flows, on_flow_change=self.ready.wake
        )
        self.clock_offset_ms: float | None = None
        """The store's clock minus ours, as last measured (None: not measured)."""
        self.dispatch_parts = self._new_dispatch_parts()
        """What every dispatcher this node starts shares (``node.dispatchparts``)."""
        self.peers = self._new_peers(peer_send)
        """Entries written here for another node's shards, hinted to it (``node.peers``)."""
        self._refresher = BucketRefresher(
            store=store,
            clock=clock,
            dispatchers=self.dispatchers,
            refresh_s=lambda: self.config.dispatch.refresh_s,
            page_size=self.config.dispatch.page_size,
        )

    def _new_ready(self) -> ReadyQueues:
        return ReadyQueues(
            aging_ms=max(1, round(self.config.priority_aging_s * 1000)),
            # (real time: on another clock, a fake one in tests, a job wakes a claim at once)
            gather_early_s=EARLY_GATHER_S if type(self.clock) is SystemClock else 0.0,
        )

    def _new_dispatch_parts(self) -> DispatchParts:
        """Built once for every dispatcher this node starts; the cron firer is here, as
        only the dispatchers fire schedules (their entries come due in the buckets)."""
        firer = ScheduleFirer(
            self.store,
            self.clock,
            self.config.default_max_attempts,
            land=self._land,
            counted=self.metrics.scheduled,
            node_id=self.node_id,
            decided=self.metrics.decided,
        )
        return DispatchParts(
            store=self.store,
            clock=self.clock,
            ready=self.ready,
            config=self._dispatch_config(),
            timer=self.timer,
            metrics=self.metrics,
            retry_at=self.attempts.retry_at,
            started=self.starts.started,
            max_unstarted=self.config.max_unstarted,
            on_released=self.starts.ended,
            on_finished=self.waits.finished,
            on_deposed=self._deposed,
            firer=firer,
            ahead=self.ahead,
        )

    def _new_peers(self, send: Send | None) -> PeerHints:
        d = self.config.dispatch
        return PeerHints(
            coordinator=self.coordinator,
            clock=self.clock,
            send=send,
            horizon_ms=lambda: round((min(d.refresh_s, d.lookahead_s) + HINT_MARGIN_S) * 1000),
            counted=self.metrics.peer_hints_sent,
        )

    def _new_claims(self) -> Claims:
        return Claims(
            flow=self.flow,
            store=self.store,
            clock=self.clock,
            ready=self.ready,
            dispatchers=self.dispatchers,
            metrics=self.metrics,
            policies=self.config.types,
            lease_ms=self.config.lease_ms,
            delivered=lambda job, worker: self.starts.delivered(job, worker),
            next_due=self.timer.next_due,
        )

    def _new_ahead(self) -> AheadClaims:
        return AheadClaims(
            store=self.store,
            holder=f"{self.node_id}{HELD}",
            lease_ms=self.config.lease_ms(0),
            reach_ms=self.config.ahead_reach_ms,
            eligible=self.claims.may_claim_ahead,
            lease_for=self.claims.asked_lease,
        )

    def _new_revokes(self) -> Revokes:
        """Leases cancelled here and delivered by another node, revoked there, and the other
        nodes' asks of this one (``node.revokes``)."""
        return Revokes(
            store=self.store,
            clock=self.clock,
            coordinator=self.coordinator,
            starts=self.starts,
            dispatchers=self.dispatchers,
            counted=self.metrics.revoke_asked,
        )

    def _new_jobs(self) -> Jobs:
        return Jobs(
            store=self.store,
            clock=self.clock,
            ready=self.ready,
            metrics=self.metrics,
            starts=self.starts,
            waits=self.waits,
            land=self._land,
            left_ready=self._left_ready,
            ran=self._ran,
            max_attempts=self.config.max_attempts,
            max_ready=self.config.max_ready,
            through_owner=self.revokes.through_owner,
        )

    def _new_attempts(self, rng: random.Random) -> Attempts:
        return Attempts(
            store=self.store,
            clock=self.clock,
            claims=self.claims,
            starts=self.starts,
            waits=self.waits,
            metrics=self.metrics,
            land=self._land,
            ran=self._ran,
            spawn=self._spawn,
            lease_ms=self.config.lease_ms,
            retry_policy=self.config.retry_policy,
            max_unstarted=self.config.max_unstarted,
            rng=rng,
            result_linger_s=result_linger_s(self.config.ahead_reach_ms),
        )

    @property
    def num_shards(self) -> int:
        return self.store.num_shards

    @property
    def dispatching(self) -> dict[int, ShardDispatcher]:
        """The dispatchers that still dispatch: a deposed one (a newer epoch took its shard)
        stays in ``dispatchers`` until the coordinator's loss report or a retake, but its
        shard's numbers are the new owner's to report (else the shard is counted twice, with
        a lag growing on the node that stopped)."""
        return {s: d for s, d in self.dispatchers.items() if not d.deposed}

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self._open_store()
        await self._load_type_policies()
        me = Member(node_id=self.node_id, address=self.address)
        await self.coordinator.start(me, self.store.num_shards, self._shards_changed)
        self._spawn(self._watch_clock(), "clock-check")
        if self.config.dispatch.node_refresh:
            self._spawn(self._refresher.run(), "bucket-refresh")
        self._spawn(self.type_policies.refresh_forever(), "type-policies")

    async def _load_type_policies(self) -> None:
        try:
            await self.type_policies.load()
        except TimeshardError as exc:  # the refresh tries again
            log.warning("node %s: reading the type policies: %s", self.node_id, exc)

    async def _open_store(self) -> None:
        """Open the store, retried with backoff while it is unavailable (not when it refuses:
        a bad configuration never cures itself)."""
        deadline = self.clock.monotonic() + self.config.open_timeout_s
        delay = 0.5
        while True:
            try:
                await self.store.open()
                return
            except StoreUnavailable as exc:
                if self.clock.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "node %s: the job store is not available yet (%s); retrying in %.1f s",
                    self.node_id,
                    exc,
                    delay,
                )
            await self.clock.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _watch_clock(self, every_s: float = 60.0) -> None:
        """Measure this node's clock against the store's, now and every minute (invariant 4 assumes
        bounded skew)."""
        while True:
            reading = await clockcheck.check(
                self.store, self.clock, self.config.dispatch.max_skew_s, self.node_id
            )
            if reading is not None:
                self.clock_offset_ms = reading.offset_ms
            await self.clock.sleep(every_s)

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await self.waits.close()
        await self.peers.close()
        await self.coordinator.stop()
        async with self._shard_lock:
            for shard in list(self.dispatchers):
                await self.dispatchers.pop(shard).stop()
        await self.store.close()

    async def _shards_changed(self, gained: frozenset[int], lost: frozenset[int]) -> None:
        """Stop the lost shards, then take the gained ones together (at most
        ``TAKE_CONCURRENCY`` epochs in flight); ``ShardsNotTaken`` names those not taken."""
        order = sorted(gained)
        room = asyncio.Semaphore(TAKE_CONCURRENCY)

        async def take(shard: int) -> None:
            async with room:
                await self._take(shard)

        started = self.clock.monotonic()
        async with self._shard_lock:
            await asyncio.gather(*(self._drop(shard) for shard in lost))
            outcomes = await asyncio.gather(*(take(s) for s in order), return_exceptions=True)
        failed: dict[int, BaseException] = {}
        for shard, outcome in zip(order, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancelled, or the process is stopping
                failed[shard] = outcome
        if order:
            log.info(
                "took %d shard(s) in %.0f ms%s",
                len(order) - len(failed),
                (self.clock.monotonic() - started) * 1000,
                f"; {len(failed)} not taken" if failed else "",
            )
        if failed:
            raise ShardsNotTaken(failed)

    async def _drop(self, shard: int) -> None:
        d = self.dispatchers.pop(shard, None)
        if d is not None:
            await d.stop()

    def _deposed(self, shard: int) -> None:
        """A dispatcher found its epoch taken. If the coordinator still says the shard is
        ours (the other writer is the stale one), take the next epoch; otherwise the
        coordinator's loss report is on its way."""
        self._spawn(self._retake(shard), f"retake-{shard}")

    async def _retake(self, shard: int) -> None:
        await self.clock.sleep(1.0)
        async with self._shard_lock:
            d = self.dispatchers.get(shard)
            if d is None or not d.deposed or shard not in self.coordinator.owned():
                return
            await self._drop(shard)
            log.warning("shard %d: still ours by the coordinator; taking the next epoch", shard)
            await self._take(shard)

    async def _take(self, shard: int) -> None:
        """Take the shard's next epoch (invariant 7) and start dispatching from its cursor."""
        for _ in range(10):
            found = await self.store.get_shard(shard)
            now_minute = minute_of(self.clock.now_ms())
            applied, state = await self.store.acquire_shard(
                shard, self.node_id, found.epoch, now_minute
            )
            if applied:
                d = ShardDispatcher(
                    shard=shard, epoch=state.epoch, cursor=state.cursor, parts=self.dispatch_parts
                )
                self.dispatchers[shard] = d
                d.start()
                return
        raise TimeshardError(f"shard {shard}: could not take its epoch (contended)")

    def _dispatch_config(self) -> DispatchConfig:
        if isinstance(self.coordinator, LocalCoordinator):
            # The only writer: every entry it writes reaches its dispatchers by notify().
            return dataclasses.replace(self.config.dispatch, reread_s=0.0)
        return self.config.dispatch

    def _notify(
        self, entries: Sequence[BucketEntry], jobs: Sequence[Job] = ()
    ) -> list[BucketEntry]:
        """Hand entries this node just wrote (durably) to the local dispatcher of their shard,
        with the rows written with them when there are (``jobs``: a create). Returns the
        entries that landed late (``_land`` writes them again).

        Late: due more than ``reland_after_s`` ago, so possibly behind what the shard's owner,
        wherever it is, has read. As the only writer (the embedded coordinator) the node knows
        exactly: late is behind its own dispatcher's cursor. A write slower than
        ``reland_after_s`` (an overloaded machine) then costs no second write."""
        late_before = self.clock.now_ms() - round(self.config.dispatch.reland_after_s * 1000)
        sole_writer = isinstance(self.coordinator, LocalCoordinator)
        late: list[BucketEntry] = []
        foreign: list[BucketEntry] = []
        rows = {j.job_id: j for j in jobs}
        for e in entries:
            d = self.dispatchers.get(e.shard)
            if d is None:
                foreign.append(e)
            behind = d.notify([e], rows) if d is not None else [e]
            if sole_writer and d is not None and not d.deposed:
                if behind:
                    late.append(e)
            elif e.due_at < late_before:
                late.append(e)
        self.peers.hint(foreign)
        return late

    def landed(self, entries: Sequence[BucketEntry]) -> int:
        """Entries another node just wrote (durably) for shards it believes this node
        dispatches (``PeerService.Land``): those of shards dispatched here are taken as if
        written here (``ShardDispatcher.notify``: the row is read when the entry comes due);
        the rest are left to their owner's reads. Returns how many were taken. An entry
        behind a dispatcher's cursor is not taken: its writer re-lands it (``_land``)."""
        taken = 0
        for e in entries:
            d = self.dispatchers.get(e.shard)
            if d is not None and not d.deposed and not d.notify([e]):
                taken += 1
        return taken

    async def _land(
        self,
        entries: Sequence[BucketEntry],
        jobs: Sequence[Job] = (),
        *,
        again: Sequence[BucketEntry] = (),
    ) -> None:
        """Notify, and make sure the owner of each entry's shard reads it, before the caller
        acknowledges what it wrote.

        An entry that landed more than ``reland_after_s`` after its due time (a slow write, a
        stalled process) may be behind what the owner has read, even behind its cursor: it is
        written again, due now, where the owner still reads (invariant 4, for every writer).
        That write is awaited: spawned and forgotten, a crash right after the reply (or the
        schedule's advance) left an acknowledged job whose only entry nobody reads. Shielded,
        so a caller that gives up does not cut it short. ``again``: entries to write again
        whatever their time (``repeats_due``)."""
        late = [*self._notify(entries, jobs), *again]
        if late:
            task = asyncio.ensure_future(self._reland(late))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            await asyncio.shield(task)

    async def _reland(self, entries: Sequence[BucketEntry]) -> None:
        """Write ``entries`` again, due now. A store error is waited out and the write tried
        again; a write that itself landed late is made once more, up to ``RELAND_REPEATS``
        times (a store that stays that slow would hold the caller for ever: what lands late
        after that is left to the owner's last read of the minute before its cursor passes
        it, ``ShardDispatcher._swept_to``)."""
        failures = repeats = 0
        while entries:
            now = self.clock.now_ms()
            again = [entry_at(e.shard, e.job_id, now, now) for e in entries]
            try:
                await self.store.add_entries(again)
            except TimeshardError as exc:
                log.warning("late entries not written again yet (%s); retrying", exc)
                await self.clock.sleep(min(5.0, 0.1 * 2**failures))
                failures += 1
                continue
            log.info("%d entries landed late; written again due now", len(again))
            entries = self._notify(again)
            repeats += 1
            if entries and repeats >= RELAND_REPEATS:
                log.warning(
                    "%d entries landed late again %d times; leaving them to the owner's "
                    "last read of their minute",
                    len(entries),
                    repeats,
                )
                return

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- jobs -----------------------------------------------------------------------------

    def peer_of_job(self, job_id: str) -> Member | None:
        """The other node that dispatches ``job_id``'s shard, as far as this one knows (None:
        this node, or unknown)."""
        return self.coordinator.peer_for(shard_of(job_id, self.store.num_shards))

    async def wait(self, job_ids: Sequence[str], timeout_s: float) -> AsyncIterator[Job]:
        """Each job of ``job_ids`` as soon as it is finished (``timeshard.node.waits``)."""
        async for job in self.waits.wait(job_ids, timeout_s):
            yield job

    def _left_ready(self, job: Job) -> bool:
        """``job`` was cancelled or moved by this node: if its owner is this node and holds it
        ready, it leaves the ready queue (and the counts) now. Through another node, the owner
        finds out when it next looks at the job (``ShardDispatcher._park_waiting``). True if
        this node claimed it ahead and still held it: no worker got it."""
        d = self.dispatchers.get(job.shard)
        return d is not None and d.forget(job.job_id)

    # -- workers --------------------------------------------------------------------------

    def next_hand_over(self) -> int | None:
        """When the next job held ahead goes to the early lane, and so to a push with
        ``starts_in``, on any shard of this node (None: none held)."""
        times = [t for d in self.dispatchers.values() if (t := d.next_hand_over()) is not None]
        return min(times, default=None)

    def wake_claims(self) -> None:
        """Wake every waiting claim to look again (a worker stream's credits changed)."""
        self.ready.wake()

    def _ran(self, job: Job) -> None:
        """A write of this node ended ``job``'s run (a result, a cancel): if its owner is this
        node, the entries its claim left pending are handled now (durably written, the job's
        row needs them no more), not when its lease would have ended."""
        if job.state is not JobState.RUNNING:
            d = self.dispatchers.get(job.shard)
            if d is not None:
                d.ran(job.job_id)
