"""The jobs side of a node: scheduling jobs (checked, admitted under the ready bound, created
durable before acknowledged and landed where their owner reads, invariants 1 and 4), reading,
listing and finding them, cancelling and rescheduling them. The ``Node`` owns one ``Jobs``, which
the servicers call as ``node.jobs``; no gRPC types here."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from timeshard.clock import Clock, format_rfc3339
from timeshard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TimeshardError,
)
from timeshard.limits import (
    DEFAULT_PAGE_SIZE,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_PAGE_SIZE,
    START_GRACE_MS,
    check_attempts,
    check_bytes,
    check_range,
)
from timeshard.model import (
    BucketEntry,
    Job,
    JobState,
    validate_deadline,
    validate_job_id,
    validate_priority,
)
from timeshard.node.ready import ReadyQueues
from timeshard.node.repeats import AskedTime, IfExists, conflict
from timeshard.node.starts import REVOKE_MARGIN_S, StartNotices
from timeshard.node.waits import JobWaits
from timeshard.observe.events import NodeMetrics
from timeshard.sharding import shard_of
from timeshard.store.base import CreateResult, JobPage, Store, entry_for, repeats_due
from timeshard.store.listing import JobQuery

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """What a client asks for when it schedules a job."""

    job_type: str
    payload: bytes
    run_at: int
    idempotency_key: str = ""
    max_attempts: int = 0
    job_id: str = ""
    deadline: int = 0
    """No attempt starts after it (epoch ms; 0: none); not before ``run_at``."""
    priority: int = 0
    asked: AskedTime | None = None
    """How the request gave ``run_at``, for a repeat of its key (``node.repeats``); None: the
    time of a repeat is not compared."""
    if_exists: IfExists = IfExists.CHECK


class Land(Protocol):
    """``Node._land``: notify the dispatchers of entries just written, with the rows written
    with them (``jobs``: a create), and write again (due now) the ones that landed late, and
    ``again``, before returning."""

    def __call__(
        self,
        entries: Sequence[BucketEntry],
        jobs: Sequence[Job] = (),
        /,
        *,
        again: Sequence[BucketEntry] = (),
    ) -> Awaitable[None]: ...


class Jobs:
    """The jobs of a node's API. ``land`` hands the node entries it just wrote
    (``Node._land``); ``left_ready`` and ``ran`` tell the dispatcher of a job's shard, when it
    is this node's, that the job left the ready queue or ended its run (``Node._left_ready``,
    ``Node._ran``); ``through_owner`` asks the owner of a job's shard whether the handler of a
    lease this node cancelled started (``Revokes.through_owner``); ``max_attempts`` is a type's
    default attempts and ``max_ready`` the bound on due jobs held ready (``NodeConfig``)."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        ready: ReadyQueues,
        metrics: NodeMetrics,
        starts: StartNotices,
        waits: JobWaits,
        land: Land,
        left_ready: Callable[[Job], bool],
        ran: Callable[[Job], None],
        max_attempts: Callable[[str], int],
        max_ready: int,
        through_owner: Callable[[Job, float], Awaitable[bool | None]] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._ready = ready
        self._metrics = metrics
        self._starts = starts
        self._waits = waits
        self._land = land
        self._left_ready = left_ready
        self._ran = ran
        self._max_attempts = max_attempts
        self._max_ready = max_ready
        self._through_owner = through_owner

    async def schedule(self, spec: JobSpec) -> tuple[Job, bool]:
        """Create a job; durable before it returns (invariant 1). Returns (job, created). (The
        one-job form of ``schedule_many``.)"""
        (result,) = await self.schedule_many([spec])
        return result

    async def schedule_many(self, specs: Sequence[JobSpec]) -> list[tuple[Job, bool]]:
        """Create jobs in one store round trip. Every spec is checked before anything is
        written; an invalid one fails the call naming its index."""
        now = self._clock.now_ms()
        jobs = []
        for i, spec in enumerate(specs):
            try:
                jobs.append(self._new_job(spec, now))
            except InvalidArgument as exc:
                field = f"jobs[{i}].{exc.field}" if len(specs) > 1 else exc.field
                raise InvalidArgument(field, exc.problem) from None
        self._admit(jobs, now)
        await self._refuse_conflicts(specs, jobs)
        entries = [entry_for(job, job.run_at, now) for job in jobs]
        fresh = {job.job_id for job, spec in zip(jobs, specs, strict=True) if not spec.job_id}
        # Shielded: once written, a job is notified (and re-landed when late) even if the
        # caller gives up meanwhile (a client's deadline), or its entry could stay unread.
        creating = asyncio.ensure_future(self._create(jobs, entries, fresh, now))
        try:
            results = await asyncio.shield(creating)
        except asyncio.CancelledError:
            creating.add_done_callback(_note_abandoned_create)
            raise
        for spec, job, result in zip(specs, jobs, results, strict=True):
            why = None if result.created else conflict(job, result.job, spec.asked, spec.if_exists)
            if why:
                raise AlreadyExists(
                    f"{_what(spec)} is already used by job {result.job.job_id}{why}"
                )
        return [(r.job, r.created) for r in results]

    def _admit(self, jobs: Sequence[Job], now: int) -> None:
        """Back-pressure at ingest (``NodeConfig.max_ready``): while this node holds that many
        due jobs not started, more due-now work is refused with a time to try again; future
        jobs are always accepted (they wait in the store, not in memory)."""
        bound = self._max_ready
        if not bound or all(job.run_at > now for job in jobs):
            return
        ready = self._ready.count()
        if ready < bound:
            return
        retry_after_ms = min(5_000, max(250, 500 * ready // bound))
        self._metrics.ready_refusals_total.inc()
        raise ResourceExhausted(
            f"this node holds {ready} due jobs not started (--max-ready {bound}): due-now work "
            f"is refused for now; try again in {retry_after_ms / 1000:g}s (jobs for later are "
            "accepted)",
            retry_after_ms,
        )

    async def _create(
        self, jobs: Sequence[Job], entries: Sequence[BucketEntry], fresh: set[str], now: int
    ) -> list[CreateResult]:
        results = await self._store.create_jobs(list(zip(jobs, entries, strict=True)), fresh=fresh)
        self._metrics.scheduled([r.job for r in results if r.created], now)
        # The entries the store wrote name the jobs it created, which are not always the ids
        # generated here (a key can name a job a failed call left half-made).
        created = [r.job for r in results if r.created]
        written = {e.job_id: e for e in entries}
        landing = [written.get(j.job_id) or entry_for(j, j.run_at, now) for j in created]
        await self._land(landing, created, again=repeats_due(results, now))
        return results

    async def _refuse_conflicts(self, specs: Sequence[JobSpec], jobs: Sequence[Job]) -> None:
        """A batch is all or nothing: a key or id used twice in it with different bodies, or
        already stored with a different body, fails the call before anything is written.
        (Two calls racing on one key can still both pass this check; the store then creates
        the job once and the later call reports the conflict after writing its other jobs.)"""
        seen: dict[str, Job] = {}
        for i, (spec, job) in enumerate(zip(specs, jobs, strict=True)):
            name = (spec.idempotency_key and f"key:{spec.idempotency_key}") or spec.job_id
            if not name:
                continue
            why = conflict(job, seen.setdefault(name, job), spec.asked, spec.if_exists)
            if why:
                raise AlreadyExists(
                    f"jobs[{i}] reuses {_what(spec)} of an earlier job in this batch{why}"
                )
        keyed = [j for j in jobs if j.idempotency_key]
        chosen = [j for j, s in zip(jobs, specs, strict=True) if s.job_id and not s.idempotency_key]
        if not keyed and not chosen:
            return
        stored = await self._store.find_existing(keyed, chosen)
        for spec, job in zip(specs, jobs, strict=True):
            other = stored.get(job.idempotency_key or job.job_id)
            why = conflict(job, other, spec.asked, spec.if_exists) if other else None
            if other and why:
                raise AlreadyExists(f"{_what(spec)} is already used by job {other.job_id}{why}")

    def _new_job(self, spec: JobSpec, now: int) -> Job:
        """The job ``spec`` asks for; ``Job`` itself checks its type and payload."""
        check_attempts(spec.max_attempts)
        check_bytes("idempotency_key", spec.idempotency_key, MAX_IDEMPOTENCY_KEY_BYTES)
        validate_deadline(spec.deadline, spec.run_at)
        validate_priority(spec.priority)
        job_id = validate_job_id(spec.job_id) if spec.job_id else uuid.uuid4().hex
        return Job(
            job_id=job_id,
            shard=shard_of(job_id, self._store.num_shards),
            job_type=spec.job_type,
            payload=spec.payload,
            run_at=spec.run_at,
            created_at=now,
            max_attempts=spec.max_attempts or self._max_attempts(spec.job_type),
            idempotency_key=spec.idempotency_key,
            deadline=spec.deadline,
            priority=spec.priority,
        )

    async def get(self, job_id: str) -> Job:
        job = await self._store.get_job(validate_job_id(job_id))
        if job is None:
            if self._store.expired(job_id):
                raise NotFound("job", job_id, "it finished and expired after the retention period")
            raise NotFound("job", job_id)
        return job

    async def list_jobs(
        self, *, state: JobState | None, job_type: str | None, limit: int, page_token: str
    ) -> JobPage:
        check_range("page_size", limit, 0, MAX_PAGE_SIZE)
        return await self._store.list_jobs(
            state=state, job_type=job_type, limit=limit or DEFAULT_PAGE_SIZE, page_token=page_token
        )

    async def find_jobs(self, query: JobQuery, *, limit: int, page_token: str) -> JobPage:
        """The jobs ``query`` finds, a page of ``limit`` (0: the default), counted."""
        check_range("page_size", limit, 0, MAX_PAGE_SIZE)
        return await self._store.find_jobs(
            query, limit=limit or DEFAULT_PAGE_SIZE, page_token=page_token, count=True
        )

    async def cancel(self, job_id: str, *, wait_s: float = 30.0) -> Job:
        """Cancel a scheduled or running job. For a running one the answer says in
        ``start_noticed`` whether its handler had started (``_started_before_cancel``, waiting
        at most ``wait_s`` for its start notice)."""
        for _ in range(20):
            job = await self.get(job_id)
            if job.state.terminal:
                raise FailedPrecondition(
                    f"job {job_id!r} is already {job.state.value}; only scheduled or running "
                    "jobs can be cancelled"
                )
            out = await self._store.cancel_job(job_id, job.state, job.fence, self._clock.now_ms())
            if out.applied and out.job is not None:
                self._metrics.written(out.job)
                self._waits.finished(out.job)
                mine = self._left_ready(job)
                self._ran(out.job)
                if job.state is JobState.RUNNING:
                    started = await self._started_before_cancel(job, wait_s, mine)
                    return out.job.with_(start_noticed=started)
                return out.job
        raise FailedPrecondition(f"job {job_id!r} kept changing; try again")

    async def _started_before_cancel(self, job: Job, wait_s: float, mine: bool = False) -> bool:
        """Whether the handler of ``job``'s lease (cancelled just now) started: its start
        notice came, or comes while its push may still be on its way (``IN_FLIGHT_S``, at
        most until the lease ends). Known here for the leases this node delivered; for others,
        from the row (a heartbeat wrote it). Not started by then: a worker that was stalled
        with the push could still start it before the lease's end; its first heartbeat then
        stops it (the answer's ``lease_until`` says until when).

        A lease pushed by this node with ``starts_in`` is revoked: the answer waits for the
        worker's notice or revoke, or for the time past which it can not start it. A lease
        this node did not deliver (``mine`` False: not one it claimed ahead and still held) is
        revoked through the owner of its shard, which answers as it would answer the cancel
        (``node.revokes``). With no answer from there (no other owner, unreachable, a failover
        since the claim), it may sit with a worker that starts it on its own clock: the answer
        waits until that worker can no longer start it, ``START_GRACE_MS`` after its claim
        time (its due time when claimed ahead), if the push was made then."""
        if job.start_noticed:
            return True
        now = self._clock.now_ms()
        wait_s = min(wait_s, (job.lease_until - now) / 1000)
        started = await self._starts.started_by(job.job_id, job.fence, wait_s)
        if started is not None:
            self._starts.ended(job.with_(state=JobState.CANCELLED))
            return started
        if not mine and self._through_owner is not None:
            owners = await self._through_owner(job, wait_s)
            if owners is not None:
                return owners
        if not mine:
            # Claimed by another node (or ahead of time), which pushes it at once (or at its due
            # time at the latest, when claimed ahead) to a worker that starts it on its own
            # clock: no later than this.
            latest = max(job.run_at, job.started_at) + START_GRACE_MS - now
            if latest > 0:  # (however short ``wait_s``: no answer rather than a wrong one)
                await self._clock.sleep(latest / 1000 + REVOKE_MARGIN_S)
        return False

    async def reschedule(self, job_id: str, run_at: int, *, wait_s: float = 30.0) -> Job:
        """Move a scheduled job to ``run_at``; or one claimed ahead and not yet due
        (``_reschedule_ahead``), answered once its worker can no longer start it, as a cancel
        (``start_noticed`` says if its handler had started: the job then runs again no earlier
        than that lease's end). A job running otherwise can not be moved."""
        for _ in range(20):
            job = await self.get(job_id)
            now = self._clock.now_ms()
            ahead = job.state is JobState.RUNNING and not job.start_noticed and job.run_at > now
            if job.state is not JobState.SCHEDULED and not ahead:
                raise FailedPrecondition(
                    f"job {job_id!r} is {job.state.value}; only a scheduled job (or one claimed "
                    "ahead that is not yet due) can be rescheduled"
                )
            if job.deadline and run_at > job.deadline:
                raise InvalidArgument(
                    "run_at",
                    f"{format_rfc3339(run_at)} is after the job's deadline "
                    f"{format_rfc3339(job.deadline)}: it could never start",
                )
            if ahead:
                moved = await self._reschedule_ahead(job, run_at, now, wait_s)
                if moved is not None and (moved.start_noticed or moved.run_at == run_at):
                    return moved
                continue  # (not started: moved to ``run_at`` as a scheduled job next)
            out = await self._store.reschedule_job(job_id, job.fence, run_at, now)
            if out.applied and out.job is not None:
                await self._land([entry_for(out.job, run_at, now)])
                self._left_ready(out.job)
                return out.job
        raise FailedPrecondition(f"job {job_id!r} kept changing; try again")

    async def _reschedule_ahead(self, job: Job, run_at: int, now: int, wait_s: float) -> Job | None:
        """``job``, claimed ahead and not yet due, rescheduled: its lease ends in the store
        (``scheduled`` no earlier than the lease's end, ``Store.reschedule_job``), then is
        dropped from the owner's hold or revoked from the worker it was pushed to, as a cancel
        is (``_started_before_cancel``). The row as it is then; None if it changed first."""
        out = await self._store.reschedule_job(
            job.job_id, job.fence, run_at, now, expect_state=JobState.RUNNING
        )
        if not out.applied or out.job is None:
            return None
        await self._land([entry_for(out.job, out.job.run_at, now)])
        mine = self._left_ready(job)
        self._ran(out.job)
        if not await self._started_before_cancel(job, wait_s, mine):
            return out.job
        counted = await self._store.amend_lease_end(
            job.job_id, out.job.fence, self._clock.now_ms(), started=True
        )
        return (counted.job if counted.applied and counted.job else out.job).with_(
            start_noticed=True
        )


def _what(spec: JobSpec) -> str:
    if spec.idempotency_key:
        return f"idempotency key {spec.idempotency_key!r}"
    return f"job id {spec.job_id!r}"


def _note_abandoned_create(task: asyncio.Future[Any]) -> None:
    """A create whose caller gave up (its deadline) goes on, shielded; if it then fails, the
    caller was told nothing was acknowledged, so a log line says it (asyncio would print a
    traceback: "Task exception was never retrieved")."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, TimeshardError):
        log.error("a create failed after its caller gave up", exc_info=exc)
    elif exc is not None:
        log.info("a create failed after its caller gave up: %s", exc)
