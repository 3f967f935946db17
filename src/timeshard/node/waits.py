"""Clients waiting for jobs to finish (``WaitJobs``), served by the node, not by client polling.

A job is finished when it is succeeded, dead, cancelled or expired. A node hears at once of what it
writes itself: every result, cancel and lease expiry goes through it (``JobWaits.finished``).
A job another node dispatches is finished through that node (its workers report there): this
node asks it (``PeerWaits``: one long poll per peer at a time, ``WaitFinished``, for every job
waited for here that it dispatches) and reads a job again once the peer names it. Beside that,
and for whatever a peer does not answer, the store is re-read: one task per node, not one per
waiter, reads every job still waited for each ``reread_s`` (default 1 s), in batches of
``limits.MAX_BATCH``. So a waiter hears of a job a store read after it finished through its
dispatching node, and at most ``reread_s`` plus one store read after it finished elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from timeshard.clock import Clock, sleep_or_wake, wake
from timeshard.coordinator.base import Member
from timeshard.errors import NotFound, TimeshardError, WaitTimeout
from timeshard.limits import MAX_BATCH
from timeshard.model import Job
from timeshard.observe.logs import Quieted
from timeshard.store.base import Store

log = logging.getLogger(__name__)

WAIT_REREAD_S = 1.0
"""How often the jobs waited for are read again from the store (those another node finished)."""
PEER_WAIT_S = 30.0
"""One long poll of a peer (``WaitFinished``) lasts at most this long; then another."""
PEER_RETRY_S = 1.0
"""After a failed poll of a peer, ask it again this much later (the re-read covers meanwhile)."""
QUIET_S = 60.0
"""A peer whose polls keep failing is logged at most this often."""

AskPeer = Callable[[Member, Sequence[str], float], Awaitable[list[str]]]
"""Ask a peer which of these jobs are finished, waiting up to that many seconds for one."""


class _Watch:
    """One call's wait: the jobs it still waits for and those finished but not yet handed out."""

    __slots__ = ("done", "pending", "waker")

    def __init__(self, job_ids: Sequence[str]) -> None:
        self.pending = set(job_ids)
        self.done: dict[str, Job] = {}
        self.waker: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def put(self, job: Job) -> None:
        if job.job_id in self.pending and job.job_id not in self.done:
            self.done[job.job_id] = job
            wake(self.waker)


class JobWaits:
    def __init__(self, store: Store, clock: Clock, *, reread_s: float = WAIT_REREAD_S) -> None:
        self._store = store
        self._clock = clock
        self.reread_s = reread_s
        self._watches: dict[str, set[_Watch]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.peers: PeerWaits | None = None
        """Asks the nodes that dispatch the jobs waited for (``use_peers``); None: none."""
        self._answering: set[_Watch] = set()  # peers' waits (``finished_of``) open here
        self._stopping = False

    def use_peers(self, owner_of: Callable[[str], Member | None], ask: AskPeer) -> None:
        """Ask ``owner_of(job_id)`` (another node; None: this one, or unknown) with ``ask``
        about the jobs waited for here (the server sets its transport)."""
        self.peers = PeerWaits(self, self._clock, owner_of, ask)

    @property
    def waited_for(self) -> int:
        """Jobs some call is waiting for now."""
        return len(self._watches)

    def finished(self, job: Job) -> None:
        """This node wrote ``job`` (the row after the write): hand it to its waiters if it is
        finished. Costs one dict lookup when nobody waits for it."""
        watches = self._watches.get(job.job_id)
        if watches and job.state.terminal:
            for watch in watches:
                watch.put(job)

    async def wait(self, job_ids: Sequence[str], timeout_s: float) -> AsyncIterator[Job]:
        """Each of ``job_ids`` (distinct) as it is finished, those already finished first.
        ``NotFound`` naming the first unknown id before anything is yielded; ``WaitTimeout``
        naming the jobs not finished when ``timeout_s`` has passed."""
        watch = _Watch(job_ids)
        self._register(watch)
        try:
            # Read after registering: a job finished in between is either read finished or
            # handed over by ``finished``; none falls between the two.
            stored = await self._store.get_jobs(list(job_ids))
            for job_id in job_ids:
                if job_id not in stored:
                    self._not_found(job_id)
            for job_id in job_ids:  # those finished already, in the order asked
                if stored[job_id].state.terminal:
                    watch.put(stored[job_id])
            self._ensure_reader()
            if self.peers is not None and len(watch.done) < len(watch.pending):
                self.peers.follow([i for i in job_ids if i not in watch.done])
            deadline = self._clock.monotonic() + timeout_s
            while watch.pending:
                if not watch.done:
                    left = deadline - self._clock.monotonic()
                    if left <= 0:
                        raise WaitTimeout(sorted(watch.pending), timeout_s)
                    await sleep_or_wake(self._clock, left, watch.waker)
                    watch.waker = asyncio.get_running_loop().create_future()
                for job_id, job in list(watch.done.items()):
                    del watch.done[job_id]
                    watch.pending.discard(job_id)
                    yield job
        finally:
            self._forget(watch, job_ids)

    async def finished_of(self, job_ids: Sequence[str], timeout_s: float) -> list[str]:
        """Those of ``job_ids`` finished, or unknown, as this node knows: at once if any is,
        else as soon as one is (or none once ``timeout_s`` has passed). What a peer's
        ``WaitFinished`` answers."""
        watch = _Watch(job_ids)
        self._register(watch)
        self._answering.add(watch)
        try:
            stored = await self._store.get_jobs(list(job_ids))
            gone = [i for i in job_ids if i not in stored]  # the asker reads them itself
            for job_id in job_ids:
                if job_id in stored and stored[job_id].state.terminal:
                    watch.put(stored[job_id])
            if not gone and not watch.done and not self._stopping:
                self._ensure_reader()
                await sleep_or_wake(self._clock, timeout_s, watch.waker)
            return [*gone, *watch.done]
        finally:
            self._answering.discard(watch)
            self._forget(watch, job_ids)

    def stop_answering(self) -> None:
        """The node is stopping: the peers' waits open here answer now with what is finished
        (their nodes ask another time, or re-read), so none holds up the server's stop."""
        self._stopping = True
        for watch in self._answering:
            wake(watch.waker)

    def _register(self, watch: _Watch) -> None:
        for job_id in watch.pending:
            self._watches.setdefault(job_id, set()).add(watch)

    def waiting_for(self, job_id: str) -> bool:
        return job_id in self._watches

    async def read_again(self, job_ids: Sequence[str]) -> None:
        """Read ``job_ids`` (a peer named them finished) and hand out those finished."""
        found = await self._store.get_jobs([i for i in job_ids if i in self._watches])
        for job in found.values():
            self.finished(job)

    def _not_found(self, job_id: str) -> None:
        if self._store.expired(job_id):
            raise NotFound("job", job_id, "it finished and expired after the retention period")
        raise NotFound("job", job_id)

    def _forget(self, watch: _Watch, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            watches = self._watches.get(job_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[job_id]

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._reread(), name="wait-reread")

    async def _reread(self) -> None:
        """While anyone waits: every ``reread_s``, read the jobs waited for and hand out those
        finished (by another node, or by this one while the waiter was registering)."""
        while self._watches:
            await self._clock.sleep(self.reread_s)
            ids = list(self._watches)
            for start in range(0, len(ids), MAX_BATCH):
                try:
                    found = await self._store.get_jobs(ids[start : start + MAX_BATCH])
                except TimeshardError as exc:  # the store is away: the next pass tries again
                    log.warning("waited-for jobs not read again (%s); retrying", exc)
                    break
                except Exception:  # never let the one reader die while calls still wait
                    log.exception("waited-for jobs not read again; retrying")
                    break
                for job in found.values():
                    self.finished(job)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self.peers is not None:
            await self.peers.close()


class PeerWaits:
    """For the jobs waited for here that another node dispatches: one long poll of that node
    at a time (``ask``), over every such job of it, asked again with the new set when a wait
    adds one; a job it names is read again (``JobWaits.read_again``)."""

    def __init__(
        self,
        waits: JobWaits,
        clock: Clock,
        owner_of: Callable[[str], Member | None],
        ask: AskPeer,
    ) -> None:
        self._waits = waits
        self._clock = clock
        self._owner_of = owner_of
        self._ask = ask
        self._jobs: dict[str, set[str]] = {}  # peer address -> job ids asked of it
        self._peers: dict[str, Member] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._quiet = Quieted(log, QUIET_S, " (the jobs are re-read from the store instead)")

    def follow(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            peer = self._owner_of(job_id)
            if peer is None:
                continue
            self._peers[peer.address] = peer
            jobs = self._jobs.setdefault(peer.address, set())
            if job_id not in jobs:
                jobs.add(job_id)
                self._changed.setdefault(peer.address, asyncio.Event()).set()
        for address in self._changed:
            task = self._tasks.get(address)
            if self._jobs.get(address) and (task is None or task.done()):
                self._tasks[address] = asyncio.create_task(
                    self._poll(address), name=f"peer-wait:{address}"
                )

    async def _poll(self, address: str) -> None:
        changed = self._changed[address]
        while True:
            jobs = self._jobs.get(address, set())
            jobs.intersection_update(j for j in list(jobs) if self._waits.waiting_for(j))
            if not jobs:
                self._jobs.pop(address, None)
                return
            changed.clear()
            asked = sorted(jobs)[:MAX_BATCH]
            call = asyncio.ensure_future(self._ask(self._peers[address], asked, PEER_WAIT_S))
            woken = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait({call, woken}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # closing: the call goes too
                call.cancel()
                raise
            finally:
                woken.cancel()
            if not call.done():  # a new job to ask about: ask again with it
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
                continue
            try:
                named = call.result()
            except Exception as exc:  # a hint: the re-read finds what the peer would have named
                self._quiet.info(address, f"waits asked of {address} failed: {exc}")
                await self._clock.sleep(PEER_RETRY_S)
                continue
            if named:
                jobs.difference_update(named)
                try:
                    await self._waits.read_again(named)
                except TimeshardError as exc:
                    log.warning("jobs a peer named finished not read (%s); the re-read will", exc)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
