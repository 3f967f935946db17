"""What a node counts as it works: ``NodeMetrics``, the one object the node, its dispatchers and
its servicers report to, each with a single call after the fact.

It keeps:
- Prometheus counters and histograms by job type, in a registry of its own (several nodes may
  share a process in tests): jobs scheduled, claimed, succeeded, failed, retried,
  dead-lettered, cancelled, lease expiries and the re-runs they cause, and fire lateness;
- a window of recent lateness (``LatenessWindow``) and the last failures and dead letters, for
  the status page and ``timeshard status``;
- ``health``: what the health watcher last found (store, coordinator, dead-letter count);
- the OpenTelemetry spans of each job (``Tracing``; a no-op without the packages).

Label sets are bounded: the only label of job counters is the job type, and past
``max_types`` distinct types the rest count under ``type="_other"``. A job id is never a
label; it appears only in the bounded lists of recent events.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.registry import CollectorRegistry

from timeshard.clock import Clock
from timeshard.model import GIVEN_BACK, LEASE_EXPIRED, NOT_STARTED, Job, JobState
from timeshard.observe.occurrences import OccurrenceMetrics
from timeshard.observe.retrying import RetryWaits
from timeshard.observe.tracing import Tracing
from timeshard.observe.window import LatenessWindow

log = logging.getLogger(__name__)

LATENESS_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    900.0,
    3600.0,
)
RPC_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OTHER_TYPE = "_other"
RECENT = 50
COUNTED = (
    "scheduled",
    "claimed",
    "succeeded",
    "failed",
    "retries",
    "dead_lettered",
    "cancelled",
    "lease_expiries",
    "job_reruns",
    "expired",
    "not_started",
    "dead_unstarted",
)
"""The per-type counters, as ``totals()`` names them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobEvent:
    """One recent failure or dead letter, as the status page lists it."""

    at_ms: int
    job_id: str
    job_type: str
    shard: int
    attempt: int
    kind: str
    """``retry``, ``dead`` or ``lease expired``."""
    error: str
    traceback: str = ""
    """The end of the failed attempt's traceback (``EVENT_TRACEBACK_CHARS``), when it had one."""


EVENT_TRACEBACK_CHARS = 2000
"""How much of a traceback a recent failure keeps (the end: the error and where it was raised)."""


def last_traceback(job: Job) -> str:
    """The end of the traceback of ``job``'s last attempt, or ""."""
    if not job.history or not job.history[-1].traceback:
        return ""
    return job.history[-1].traceback[-EVENT_TRACEBACK_CHARS:]


@dataclass(kw_only=True, slots=True)
class Health:
    """What the health watcher found at its last probe (``views.health``)."""

    store_ok: bool = True
    store_error: str = ""
    coordinator_ok: bool = True
    checked_at_ms: int = 0
    dead_letters: int | None = None
    """Dead jobs in the store, counted by the node that owns shard 0 (None: not counted here)."""
    dead_letters_at_ms: int = 0
    latest_dead: list[Job] = field(default_factory=list)
    """The newest dead jobs found by that count."""

    @property
    def serving(self) -> bool:
        return self.store_ok and self.coordinator_ok


def type_label(seen: set[str], max_types: int, job_type: str) -> str:
    """The ``type`` label of ``job_type``: itself, or ``_other`` once ``max_types`` distinct
    types are in ``seen`` (which it adds to), so a typo or a flood of types can not make the
    series of a metric unbounded. The node's and the worker's metrics share it."""
    if job_type in seen:
        return job_type
    if len(seen) >= max_types:
        return OTHER_TYPE
    seen.add(job_type)
    return job_type


class Series:
    """Each labelled series of some metrics, kept after its first look: prometheus_client's
    ``labels()`` takes a lock and checks its arguments on every call, and the per-job hooks of
    the node and the worker would call it several times per job. The labels must come from a
    bounded set (a type label, an outcome, a kind)."""

    __slots__ = ("_children",)

    def __init__(self) -> None:
        self._children: dict[tuple[object, ...], Any] = {}

    def of(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


class NodeMetrics:
    def __init__(self, clock: Clock, *, max_types: int = 200, tracer_provider: Any = None) -> None:
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=False)
        self.max_types = max_types
        self._types: set[str] = set()
        self._series = Series()
        self.window = LatenessWindow(clock)
        self.failures: deque[JobEvent] = deque(maxlen=RECENT)
        self.dead: deque[JobEvent] = deque(maxlen=RECENT)
        self.health = Health()
        self.tracing = Tracing(tracer_provider)
        self.retry_waits = RetryWaits(clock)
        """Failed attempts recorded here whose retry is not due yet (the console's count)."""
        self._job_counters(self.registry)
        self._start_and_flow(self.registry)
        self._lease_counters(self.registry)
        self._messages(self.registry)
        self._lateness(self.registry)
        self.occurrences = OccurrenceMetrics(self.registry)
        self.decided = self.occurrences.decided
        """A schedule's fire wrote these ledger rows (``observe.occurrences``)."""

    def _job_counters(self, r: CollectorRegistry) -> None:
        """The ``timeshard_jobs_*`` counters, by type."""

        def jobs(name: str, what: str) -> Counter:
            return Counter(f"timeshard_jobs_{name}", what, ["type"], registry=r)

        self.scheduled_total = jobs(
            "scheduled",
            "Jobs created: by a client, or as the occurrence of a cron schedule (a repeated "
            "idempotent call, or a repeated fire of an occurrence made already, not).",
        )
        self.claimed_total = jobs("claimed", "Claims that applied: a run handed to a worker.")
        self.succeeded_total = jobs("succeeded", "Jobs completed by their worker.")
        self.failed_total = jobs("failed", "Failures reported by workers (retried or not).")
        self.retries_total = jobs("retries", "Failures scheduled to run again after a backoff.")
        self.dead_lettered_total = jobs(
            "dead_lettered", "Jobs moved to the dead-letter queue (permanent or out of attempts)."
        )
        self.cancelled_total = jobs("cancelled", "Jobs cancelled by a client.")
        self.expired_total = jobs(
            "expired", "Jobs not started by their deadline, so never run (state expired)."
        )
        self.not_started_total = jobs(
            "not_started",
            "Deliveries that ended without a handler start (given back unstarted, or a lease "
            "over with no start notice): not attempts, the job runs again at once.",
        )
        self.dead_unstarted_total = jobs(
            "dead_unstarted",
            "Jobs dead after max_unstarted deliveries without a handler start (counted in "
            "dead_lettered too).",
        )

    def _start_and_flow(self, r: CollectorRegistry) -> None:
        """How long jobs waited for a handler start, and the worker streams and calls held
        back because the node was behind."""
        self.schedule_to_start = Histogram(
            "timeshard_schedule_to_start_seconds",
            "From a job's due time to its handler's start (the worker's start notice), on the "
            "node that delivered it: the wait, apart from lease and run times.",
            ["type"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )
        self.start_windows: dict[str, LatenessWindow] = {}
        """Schedule-to-start per type, recent (``timeshard status``, the status page)."""
        self.streams_behind = Gauge(
            "timeshard_worker_streams_behind",
            "Worker streams whose pushes are behind (a push would reach its worker with less "
            "than half its lease left): nothing is claimed for them until they catch up.",
            registry=r,
        )
        self.behind = 0
        """The streams behind now (the gauge's value)."""
        self.stream_pauses_total = Counter(
            "timeshard_stream_pauses",
            "Times a worker stream stopped claiming because its pushes were behind.",
            registry=r,
        )
        self.ready_refusals_total = Counter(
            "timeshard_ready_refusals",
            "ScheduleJob calls for due-now work refused (RESOURCE_EXHAUSTED) because the node "
            "held --max-ready due jobs not started.",
            registry=r,
        )

    def _lease_counters(self, r: CollectorRegistry) -> None:
        """Leases that ran out, and the claims that ran a job again after one, by type
        (``totals()`` counts them with the job counters)."""
        self.lease_expiries_total = Counter(
            "timeshard_lease_expiries",
            "Leases that ran out without a result: a failed attempt (retried, or dead at the "
            "last attempt; counted in retries or dead_lettered too).",
            ["type"],
            registry=r,
        )
        self.reruns_total = Counter(
            "timeshard_job_reruns",
            "Claims of a job whose previous run's lease expired (it may have run twice).",
            ["type"],
            registry=r,
        )

    def _messages(self, r: CollectorRegistry) -> None:
        """Messages and calls: of the worker protocol, of gRPC services, between peers."""
        self.worker_messages_total = Counter(
            "timeshard_worker_messages",
            "Messages of the worker protocol, by kind: claim (a Claim request, or a worker "
            "stream's push of claimed jobs) or result (a Finish, Complete or Fail request, or "
            "a stream request carrying results).",
            ["kind"],
            registry=r,
        )
        self.results_received_total = Counter(
            "timeshard_results_received",
            "Results (complete, fail, give back) received from workers, in any message.",
            registry=r,
        )
        self.rpc_requests_total = Counter(
            "timeshard_rpc_requests",
            "gRPC calls answered, by service, method and status code.",
            ["grpc_service", "grpc_method", "grpc_code"],
            registry=r,
        )
        self.worker_stream_messages = Counter(
            "timeshard_worker_stream_messages",
            "Messages of worker streams (WorkerService.Work): in, requests read; out, responses"
            " written (pushes of jobs, answers).",
            ["direction"],
            registry=r,
        )
        self.revokes_asked = Counter(
            "timeshard_revokes_asked",
            "Leases cancelled on this node and handed out by another, revoked through their "
            "shard's owner (PeerService.Revoke), by outcome: started or not_started (the "
            "owner's answer), unknown (the owner could not say), failed (the call failed), "
            "no_owner (no other owner known). The last three make the cancel wait out the "
            "latest start the job could have.",
            ["outcome"],
            registry=r,
        )
        self.peer_hint_entries = Counter(
            "timeshard_peer_hint_entries",
            "Bucket entries written by one node for a shard another node dispatches, hinted to "
            "that node (PeerService.Land), by direction (sent, received) and outcome: taken "
            "(by the node dispatching the shard), not_owned (left to the owner's next read), "
            "failed (the call failed; the owner's next read finds them).",
            ["direction", "outcome"],
            registry=r,
        )
        self.rpc_duration = Histogram(
            "timeshard_rpc_duration_seconds",
            "Time to answer a gRPC call (a long-polling Claim includes its wait).",
            ["grpc_service", "grpc_method"],
            buckets=RPC_BUCKETS_S,
            registry=r,
        )

    def _lateness(self, r: CollectorRegistry) -> None:
        """From a job's due time to its claim, by type and by priority."""
        self.lateness = Histogram(
            "timeshard_fire_lateness_seconds",
            "From a job's due time to the claim that handed it to a worker, on the owner node "
            "(first runs and retries; re-runs after a lease expiry are counted apart).",
            ["type"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )
        self.wait_by_priority = Histogram(
            "timeshard_claim_wait_seconds",
            "From a job's due time to the claim that handed it to a worker, by the job's "
            "priority (0-9), on the owner node (first runs and retries).",
            ["priority"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )

    def totals(self) -> dict[str, dict[str, int]]:
        """The job counters by type: ``{type: {"scheduled": n, "claimed": n, ...}}``."""
        out: dict[str, dict[str, int]] = {}
        for family in self.registry.collect():
            name = family.name.removeprefix("timeshard_jobs_").removeprefix("timeshard_")
            if name not in COUNTED:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    row = out.setdefault(sample.labels["type"], dict.fromkeys(COUNTED, 0))
                    row[name] = int(sample.value)
        return out

    def type_label(self, job_type: str) -> str:
        """``job_type``, or ``_other`` once ``max_types`` distinct types were seen."""
        return type_label(self._types, self.max_types, job_type)

    def _typed(self, metric: Any, job_type: str) -> Any:
        """``metric``'s child for ``job_type``'s label (``type_label``: at most ``max_types``
        of them and ``_other``), kept after the first look: prometheus_client's ``labels()``
        takes a lock and checks its arguments on every call, and the hooks run once per job."""
        return self._child(metric, self.type_label(job_type))

    def _child(self, metric: Any, label: str) -> Any:
        """``metric``'s child for ``label`` (a bounded set: a type label, a kind, a
        priority), kept after the first look."""
        return self._series.of(metric, label)

    # -- hooks: each called once, after the fact -------------------------------------------

    def scheduled(self, jobs: list[Job], started_ms: int) -> None:
        """``jobs`` were created (durably) by a call that started at ``started_ms``: a
        client's, or a schedule's fire (its occurrences). A job that a repeated call or fire
        found made already is not in ``jobs``."""
        now = self.clock.now_ms()
        tracing = self.tracing.enabled
        for job in jobs:
            child = self._typed(self.scheduled_total, job.job_type)
            child.inc()
            if not tracing:
                continue
            self.tracing.record(
                "timeshard.schedule",
                job.job_id,
                start_ms=started_ms,
                end_ms=now,
                attributes=_attrs(job),
            )

    def claim_message(self) -> None:
        """A worker asked for jobs (one Claim request), or a stream pushed claimed jobs."""
        self._child(self.worker_messages_total, "claim").inc()

    def result_message(self, results: int) -> None:
        """A worker sent ``results`` results in one message."""
        self._child(self.worker_messages_total, "result").inc()
        self.results_received_total.inc(results)

    def peer_hints_sent(self, outcome: str, entries: int) -> None:
        """``entries`` hinted to another node ended with ``outcome`` (taken, not_owned,
        failed)."""
        if entries:
            self.peer_hint_entries.labels("sent", outcome).inc(entries)

    def revoke_asked(self, outcome: str) -> None:
        """A lease cancelled here was revoked through its shard's owner with ``outcome``."""
        self.revokes_asked.labels(outcome).inc()

    def peer_hints_received(self, taken: int, not_owned: int) -> None:
        """Another node hinted entries here: ``taken`` of shards dispatched here."""
        if taken:
            self.peer_hint_entries.labels("received", "taken").inc(taken)
        if not_owned:
            self.peer_hint_entries.labels("received", "not_owned").inc(not_owned)

    def dispatched(self, job: Job, now: int) -> None:
        """The owner's dispatcher made ``job`` ready (due, or its lease expired) at ``now``."""
        if not self.tracing.enabled:
            return
        self.tracing.record(
            "timeshard.dispatch",
            job.job_id,
            start_ms=min(job.run_at, now),
            end_ms=now,
            attributes=_attrs(job),
        )

    def claimed(self, job: Job, started_ms: int) -> None:
        """A claim that started at ``started_ms`` applied: ``job`` is running (its new fence)."""
        self._typed(self.claimed_total, job.job_type).inc()
        rerun = len(job.history) >= 2 and job.history[-2].outcome == LEASE_EXPIRED
        redelivered = len(job.history) >= 2 and job.history[-2].outcome == NOT_STARTED
        if rerun:
            self._typed(self.reruns_total, job.job_type).inc()
        elif not redelivered:  # (a job delivered again had its lateness counted the first time)
            late_ms = max(0, started_ms - job.run_at)
            self._typed(self.lateness, job.job_type).observe(late_ms / 1000)
            self._child(self.wait_by_priority, str(job.priority)).observe(late_ms / 1000)
            self.window.add(late_ms)
        if not self.tracing.enabled:
            return
        self.tracing.record(
            "timeshard.claim",
            job.job_id,
            start_ms=started_ms,
            end_ms=self.clock.now_ms(),
            attributes={
                **_attrs(job),
                "timeshard.worker": job.lease_owner,
                "timeshard.rerun": rerun,
            },
        )

    def stream_behind(self, change: int) -> None:
        """A worker stream fell behind (+1: its claims pause) or caught up (-1)."""
        self.behind += change
        self.streams_behind.set(self.behind)
        if change > 0:
            self.stream_pauses_total.inc()

    def started(self, job_type: str, seconds: float) -> None:
        """A handler started ``seconds`` after its job was due (a start notice)."""
        self._typed(self.schedule_to_start, job_type).observe(seconds)
        label = self.type_label(job_type)
        window = self.start_windows.get(label)
        if window is None:
            window = self.start_windows[label] = LatenessWindow(self.clock)
        window.add(seconds * 1000)

    def unstarted(self, job: Job) -> None:
        """A delivery of ``job`` ended without a handler start (invariant 9): ``job`` is the row
        after it, due again (``scheduled``) or dead after ``max_unstarted`` of them."""
        label = self.type_label(job.job_type)
        self.not_started_total.labels(label).inc()
        if job.state is not JobState.DEAD:
            return
        self.dead_unstarted_total.labels(label).inc()
        self._dead_lettered(job, label, "")

    def _dead_lettered(self, job: Job, label: str, when: str) -> None:
        """Count, list and log ``job`` dead (``when``: after which attempt, or "")."""
        self.dead_lettered_total.labels(label).inc()
        event = self._event(job, "dead", job.last_error)
        self.failures.appendleft(event)
        self.dead.appendleft(event)
        log.warning(
            "job %s (%s) dead-lettered%s: %s",
            job.job_id,
            job.job_type,
            when,
            job.last_error[:300],
            extra={"job_id": job.job_id, "shard": job.shard, "event": "job.dead_lettered"},
        )

    def lease_expired(self, job: Job) -> None:
        """The dispatcher released ``job``'s expired lease, a failed attempt: ``job`` is the
        row after it, retried (``scheduled``) or out of attempts (``dead``)."""
        label = self.type_label(job.job_type)
        self.lease_expiries_total.labels(label).inc()
        if job.state is not JobState.DEAD:
            self.retries_total.labels(label).inc()
            self.retry_waits.retrying(job.job_id, job.job_type, job.run_at)
            self.failures.appendleft(self._event(job, LEASE_EXPIRED, LEASE_EXPIRED))
            return
        self.dead_lettered_total.labels(label).inc()
        event = self._event(job, "dead", LEASE_EXPIRED)
        self.failures.appendleft(event)
        self.dead.appendleft(event)
        log.warning(
            "job %s (%s) dead-lettered: its lease expired on attempt %d/%d",
            job.job_id,
            job.job_type,
            job.attempt,
            job.max_attempts,
            extra={"job_id": job.job_id, "shard": job.shard, "event": "job.dead_lettered"},
        )

    def deadline_expired(self, job: Job, now: int) -> None:
        """The dispatcher expired ``job`` (the row after it): it was not started by its
        deadline and will not run."""
        self.expired_total.labels(self.type_label(job.job_type)).inc()
        self.failures.appendleft(self._event(job, "expired", job.last_error))
        self._finish_span(job)

    def written(self, job: Job) -> None:
        """A conditional write by a worker or client applied; ``job`` is the row after it.
        Counts results (succeeded, retry, dead) and cancels; an extended lease counts nothing."""
        label = self.type_label(job.job_type)
        if job.state is JobState.RUNNING:
            return
        if job.state is JobState.CANCELLED:
            self.cancelled_total.labels(label).inc()
            self.retry_waits.left(job.job_id)
            return
        if (
            job.history
            and job.history[-1].outcome == NOT_STARTED
            and job.state
            in (
                JobState.SCHEDULED,
                JobState.DEAD,
            )
        ):
            self.unstarted(job)
        elif job.state is JobState.SUCCEEDED:
            self._typed(self.succeeded_total, job.job_type).inc()
        elif job.state is JobState.SCHEDULED and _given_back(job):
            log.info(
                "job %s (%s) given back by its worker (%s); runs again now",
                job.job_id,
                job.job_type,
                job.last_error,
                extra={"job_id": job.job_id, "shard": job.shard, "event": "job.given_back"},
            )
        elif job.state is JobState.SCHEDULED:
            self.failed_total.labels(label).inc()
            self.retries_total.labels(label).inc()
            self.retry_waits.retrying(job.job_id, job.job_type, job.run_at)
            self.failures.appendleft(self._event(job, "retry", job.last_error))
            log.info(
                "job %s (%s) failed attempt %d/%d; retry at %d",
                job.job_id,
                job.job_type,
                job.attempt,
                job.max_attempts,
                job.run_at,
                extra={"job_id": job.job_id, "shard": job.shard, "event": "job.retry"},
            )
        elif job.state is JobState.DEAD:
            self.failed_total.labels(label).inc()
            self._dead_lettered(job, label, f" after attempt {job.attempt}/{job.max_attempts}")
        self._finish_span(job)

    def _finish_span(self, job: Job) -> None:
        if not self.tracing.enabled:
            return
        last = job.history[-1] if job.history else None
        now = self.clock.now_ms()
        self.tracing.record(
            "timeshard.finish",
            job.job_id,
            start_ms=last.finished_at if last and last.finished_at else now,
            end_ms=now,
            attributes={**_attrs(job), "timeshard.state": job.state.value},
            error=job.last_error if job.state is not JobState.SUCCEEDED else "",
        )

    def _event(self, job: Job, kind: str, error: str) -> JobEvent:
        return JobEvent(
            at_ms=self.clock.now_ms(),
            job_id=job.job_id,
            job_type=job.job_type,
            shard=job.shard,
            attempt=job.attempt,
            kind=kind,
            error=error[:300],
            traceback=last_traceback(job),
        )


def _attrs(job: Job) -> dict[str, str | int | float | bool]:
    return {
        "timeshard.job_type": job.job_type,
        "timeshard.shard": job.shard,
        "timeshard.fence": job.fence,
        "timeshard.attempt": job.attempt,
    }


def _given_back(job: Job) -> bool:
    return bool(job.history) and job.history[-1].outcome == GIVEN_BACK
