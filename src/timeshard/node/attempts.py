"""The workers' side of a node: what the holder of a lease tells it about its attempt —
heartbeats that extend the lease, start notices that make the attempt count (invariant 9), and
the attempt's end (complete, fail, give back), each conditional on the lease's fence (invariant
5) — and when a failed attempt runs again. The ``Node`` owns one ``Attempts``, which the
servicers call as ``node.attempts``; no gRPC types here."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from timeshard.clock import Clock
from timeshard.errors import NotFound, StaleFence, TimeshardError
from timeshard.limits import truncate_error, truncate_traceback
from timeshard.model import NOT_STARTED, BucketEntry, Job, JobState, WriteResult, validate_result
from timeshard.node.amends import amend_lease_end
from timeshard.node.claims import Claims
from timeshard.node.retry import RetryPolicy
from timeshard.node.starts import StartNotices
from timeshard.node.waits import JobWaits
from timeshard.observe.events import NodeMetrics
from timeshard.store.base import Completion, Store, entry_for

log = logging.getLogger(__name__)

RESULT_LINGER_S = 0.05
"""A result waits this long at most at the store for another write of its partition to share
a Paxos round with (a claim, most often), rather than take a round of its own."""
RESULT_LINGER_MAX_S = 2.0
"""The longest a result lingers (however long the claims-ahead window)."""
RESULT_LINGER_BESIDE_BEATS_S = 0.25
"""The longest a result lingers when heartbeats reach the node with it (in one group of
worker stream requests): they are answered with it, and a lease must not wait on a result."""


def result_linger_s(reach_ms: int) -> float:
    """How long a result may linger (``Store.complete_jobs``): ``RESULT_LINGER_S``; with claims
    ahead, their reach (``NodeConfig.ahead_reach_ms``): at a trickle a shard's claims ahead
    go out about that often, so a result lingering that long rides the next one's round (under
    load they go out more often, and the results with them)."""
    return min(RESULT_LINGER_MAX_S, max(RESULT_LINGER_S, reach_ms / 1000))


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat of one lease (``lease_s`` asked for) or a start notice: ``started_at`` (epoch
    ms, not 0) when the worker started its handler."""

    job_id: str
    fence: int
    lease_s: float = 0.0
    started_at: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class FinishItem:
    job_id: str
    fence: int
    failed: bool = False
    error: str = ""
    permanent: bool = False
    give_back: bool = False
    """The worker hands the job back unfinished (``Attempts.give_back``); wins over ``failed``."""
    not_started: bool = False
    """With ``give_back``: its handler never started (invariant 9)."""
    result: bytes = b""
    result_encoding: str = ""
    """A completion's result and how to read it (``json``, ``bytes``; "" for none)."""
    traceback: str = ""
    """A failure's traceback, kept on the attempt."""
    refused: str = ""
    """Why the API refused this completion's result (the item is then a permanent failure
    saying so, and its answer is INVALID_ARGUMENT)."""


class Attempts:
    """The attempts of the jobs this node is told about, whichever node delivered them (a
    worker's heartbeats and results reach any node). ``claims`` follows the running jobs of
    limited types; ``land`` hands the node entries it just wrote (``Node._land``); ``ran``
    tells the dispatcher of a job's shard, when it is this node's, that the job's run ended
    (``Node._ran``); ``spawn`` starts a background task the node stops with it. ``lease_ms``,
    ``retry_policy`` and ``max_unstarted`` are the node's configuration (``NodeConfig``);
    ``result_linger_s`` how long a result may wait at the store (``result_linger_s``)."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        claims: Claims,
        starts: StartNotices,
        waits: JobWaits,
        metrics: NodeMetrics,
        land: Callable[[Sequence[BucketEntry]], Awaitable[None]],
        ran: Callable[[Job], None],
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        lease_ms: Callable[[float], int],
        retry_policy: Callable[[str], RetryPolicy],
        max_unstarted: Callable[[Job], int],
        rng: random.Random,
        result_linger_s: float = RESULT_LINGER_S,
    ) -> None:
        self._store = store
        self._clock = clock
        self._claims = claims
        self._starts = starts
        self._waits = waits
        self._metrics = metrics
        self._land = land
        self._ran = ran
        self._spawn = spawn
        self._lease_ms = lease_ms
        self._retry_policy = retry_policy
        self._max_unstarted = max_unstarted
        self._rng = rng
        self._result_linger_s = result_linger_s

    async def heartbeats(self, items: Sequence[Beat]) -> list[tuple[Job, int] | TimeshardError]:
        """Extend many leases at once, each conditional on its own fence; the store groups
        the writes. Each item gets its job and lease, or its error."""

        async def one(b: Beat) -> tuple[Job, int] | TimeshardError:
            try:
                return await self.heartbeat(b.job_id, b.fence, b.lease_s, started_at=b.started_at)
            except TimeshardError as exc:
                return exc

        return list(await asyncio.gather(*map(one, items)))

    def notice_starts(self, notices: Sequence[Beat]) -> None:
        """Start notices from a worker stream (invariant 9): kept in memory for the leases this
        node delivered; written into the row (as a heartbeat that extends nothing) for any
        other, in the background, so its owner counts the attempt too."""
        unknown = [n for n in notices if not self._starts.notice(n.job_id, n.fence, n.started_at)]
        for n in unknown:
            self._spawn(self._write_notice(n), f"start-notice-{n.job_id}")

    async def _write_notice(self, n: Beat) -> None:
        try:
            out = await self._store.heartbeat(n.job_id, n.fence, 0, started=True)
        except TimeshardError as exc:  # the lease's end counts it as not started: late only
            log.info("job %s: start notice not written: %s", n.job_id, exc)
            return
        if out.applied and out.job is not None:
            self._starts.observe_written(out.job, n.started_at)
        else:
            await self._amend_late(n.fence, out, started=True)

    def _check(self, job_id: str, fence: int, out: WriteResult) -> Job:
        if out.job is None:
            raise NotFound("job", job_id)
        self._claims.track(out.job)
        self._starts.ended(out.job)
        if not out.applied:
            raise StaleFence(job_id, fence, out.job.fence, out.job.state.value)
        self._metrics.written(out.job)
        self._waits.finished(out.job)
        self._ran(out.job)
        return out.job

    async def _amend_late(
        self, fence: int, out: WriteResult, *, started: bool, reason: str = ""
    ) -> None:
        """A word from the worker of the lease ``fence`` was refused: if that lease already
        ended and its job was not claimed again, the word amends how the end was counted
        (``Store.amend_lease_end``, invariant 9): ``started`` (a start notice, or a result,
        which is still refused: the job runs again) counts an attempt released as not
        started; a give-back not started (``reason``) uncounts one released as expired. A
        job claimed again since keeps its count (the one known gap: off by one)."""
        job = out.job
        if out.applied or job is None or job.state is not JobState.SCHEDULED:
            return
        if job.fence != fence:
            return
        amended = await amend_lease_end(
            self._store,
            job,
            self._clock.now_ms(),
            started=started,
            reason=reason,
            log=log,
            not_amended=f"late word of fence {fence} not amended",
        )
        if amended is not None:
            log.info(
                "job %s: the lease of fence %d amended by its worker's late word: %s "
                "(attempt %d/%d, %d deliveries without a start)",
                job.job_id,
                fence,
                amended.history[-1].outcome,
                amended.attempt,
                amended.max_attempts,
                amended.unstarted,
            )

    async def heartbeat(
        self, job_id: str, fence: int, lease_s: float, *, started_at: int = 0
    ) -> tuple[Job, int]:
        """Extend the lease; ``started_at`` (not 0): the heartbeat carries the worker's start
        notice (invariant 9), written into the row."""
        lease = self._lease_ms(lease_s)
        started = started_at > 0
        if started:
            self._starts.notice(job_id, fence, started_at)
        out = await self._store.heartbeat(
            job_id,
            fence,
            self._clock.now_ms() + lease,
            started=started,
            worker=self._starts.worker(job_id, fence),
        )
        if started:
            await self._amend_late(fence, out, started=True)
        job = self._check(job_id, fence, out)
        if started:
            self._starts.observe_written(job, started_at)
        return job, lease

    async def complete(
        self, job_id: str, fence: int, result: bytes = b"", result_encoding: str = ""
    ) -> Job:
        """The job succeeded, with the handler's result (checked first: size and encoding)."""
        validate_result(result, result_encoding)
        out = await self._store.complete_job(
            job_id,
            fence,
            self._clock.now_ms(),
            result=result,
            result_encoding=result_encoding,
            worker=self._starts.worker(job_id, fence),
        )
        await self._amend_late(fence, out, started=True)  # (a result: its handler ran)
        return self._check(job_id, fence, out)

    async def finish(
        self, items: Sequence[FinishItem], *, beside_beats: bool = False
    ) -> list[Job | TimeshardError]:
        """Complete or fail many jobs at once, each conditional on its own fence; the store
        groups the writes (the completions as one ``complete_jobs``). Each item gets its job
        or its error, in their order. ``beside_beats``: heartbeats are answered with these
        (a group of worker stream requests), so the completions linger less."""
        out: list[Job | TimeshardError | None] = [None] * len(items)
        completions = self._completions(items, out)

        async def complete_all() -> None:
            if not completions:
                return
            try:
                written = await self._store.complete_jobs(
                    [c for _, c in completions],
                    self._clock.now_ms(),
                    linger_s=self._linger_s([c for _, c in completions], beside_beats),
                )
            except TimeshardError as exc:  # (the store is down: each item says so)
                for n, _ in completions:
                    out[n] = exc
                return
            for (n, c), w in zip(completions, written, strict=True):
                await self._amend_late(c.fence, w, started=True)
                try:
                    out[n] = self._check(c.job_id, c.fence, w)
                except TimeshardError as exc:
                    out[n] = exc

        async def one(n: int, item: FinishItem) -> None:
            try:
                if item.give_back:
                    out[n] = await self.give_back(
                        item.job_id, item.fence, item.error, not_started=item.not_started
                    )
                else:
                    out[n] = await self.fail(
                        item.job_id, item.fence, item.error, item.permanent, item.traceback
                    )
            except TimeshardError as exc:
                out[n] = exc

        others = [one(n, i) for n, i in enumerate(items) if i.give_back or i.failed]
        await asyncio.gather(complete_all(), *others)
        done = [o for o in out if o is not None]
        assert len(done) == len(items)  # every item was answered above
        return done

    def _completions(
        self, items: Sequence[FinishItem], out: list[Job | TimeshardError | None]
    ) -> list[tuple[int, Completion]]:
        """The completions among ``items``, by their place; one whose result is refused gets
        its error in ``out`` instead."""
        completions: list[tuple[int, Completion]] = []
        for n, item in enumerate(items):
            if item.give_back or item.failed:
                continue
            try:
                validate_result(item.result, item.result_encoding)
            except TimeshardError as exc:
                out[n] = exc
                continue
            worker = self._starts.worker(item.job_id, item.fence)
            completion = Completion(
                item.job_id, item.fence, item.result, item.result_encoding, worker
            )
            completions.append((n, completion))
        return completions

    def _linger_s(self, completions: Sequence[Completion], beside_beats: bool) -> float:
        """How long these results may wait to share a round: not at all when one of them
        lets the next job of a type under a concurrency limit start, and not long when
        heartbeats wait for their answer with them (``beside_beats``)."""
        if any(self._claims.frees_room(c.job_id) for c in completions):
            return 0.0
        if beside_beats:
            return min(self._result_linger_s, RESULT_LINGER_BESIDE_BEATS_S)
        return self._result_linger_s

    async def fail(
        self, job_id: str, fence: int, error: str, permanent: bool, traceback: str = ""
    ) -> Job:
        """A retryable failure goes back to ``scheduled`` after a backoff, while attempts
        remain; otherwise the job is dead. Decided from the job as stored, in the write."""
        now = self._clock.now_ms()

        def retry_at(job: Job) -> int | None:
            return None if permanent else self.retry_at(job, now)

        out = await self._store.fail_job(
            job_id,
            fence,
            now,
            truncate_error(error),
            retry_at,
            traceback=truncate_traceback(traceback),
            worker=self._starts.worker(job_id, fence),
        )
        await self._amend_late(fence, out, started=True)  # (a result: its handler ran)
        failed = self._check(job_id, fence, out)
        if failed.state is JobState.SCHEDULED:
            await self._land([entry_for(failed, failed.run_at, now)])
        return failed

    async def give_back(
        self, job_id: str, fence: int, reason: str, *, not_started: bool = False
    ) -> Job:
        """The lease holder hands the job back unfinished (a worker shutting down stopped its
        handler): it runs again at once, elsewhere, and the attempt does not count against
        ``max_attempts`` (a deploy must not use up a job's attempts). ``not_started``: its
        handler never started (invariant 9): a delivery, bounded by the type's
        ``max_unstarted``."""
        now = self._clock.now_ms()
        default = f"{NOT_STARTED}: given back by its worker" if not_started else "given back"
        why = reason[:4000] or default
        out = await self._store.give_back_job(
            job_id, fence, now, why, not_started=not_started, max_unstarted=self._max_unstarted
        )
        if not_started:
            await self._amend_late(fence, out, started=False, reason=why)
        job = self._check(job_id, fence, out)
        if job.state is JobState.SCHEDULED:
            await self._land([entry_for(job, job.run_at, now)])
        return job

    def retry_at(self, job: Job, now: int) -> int | None:
        """When a failed attempt of ``job`` (as stored, the attempt just ended) runs again: after
        its type's backoff while attempts remain, else None (dead). The one rule for every
        retryable end of an attempt: a worker's failure and an expired lease."""
        if job.attempt >= job.max_attempts:
            return None
        policy = self._retry_policy(job.job_type)
        return now + policy.delay_ms(job.attempt, self._rng)
