"""Clients waiting for jobs to finish (``WaitJobs``), served by the node, not by client polling.

A job is finished when it is succeeded, dead or cancelled. A node hears at once of what it
writes itself: every result, cancel and lease expiry goes through it (``JobWaits.finished``).
A job finished through another node is found by re-reading the store: one task per node, not
one per waiter, reads every job still waited for each ``reread_s`` (default 1 s), in batches
of ``limits.MAX_BATCH``. So a waiter hears of a job at most ``reread_s`` plus one store read
after it finished, wherever its result was reported.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

from timeshard.clock import Clock, sleep_or_wake, wake
from timeshard.errors import NotFound, TimeshardError, WaitTimeout
from timeshard.limits import MAX_BATCH
from timeshard.model import Job
from timeshard.store.base import Store

log = logging.getLogger(__name__)

WAIT_REREAD_S = 1.0
"""How often the jobs waited for are read again from the store (those another node finished)."""


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
        for job_id in watch.pending:
            self._watches.setdefault(job_id, set()).add(watch)
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
