"""A worker's metrics and spans, fed by the worker's event hook (``Worker(on_event=...)``).

- ``timeshard_worker_start_lateness_seconds{type}``: from a job's due time to its handler's
  start, on this worker (the job's due time is the node's; clocks of different machines differ
  by their skew);
- ``timeshard_worker_jobs_total{type, outcome}``: runs by how they ended: ``succeeded``,
  ``failed`` (reported, retried or dead-lettered by the node), ``lost`` (the lease ended first),
  ``unreported`` (the result could not be sent before the lease ended), ``rejected`` (the node
  refused the result: stale fence);
- ``timeshard_worker_job_seconds{type, outcome}``: from the handler's start to its result being
  accepted (or given up);
- the ``timeshard.handler`` span of each run, from its start to its end (``observe.tracing``).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.registry import CollectorRegistry

from timeshard.clock import Clock, SystemClock
from timeshard.observe.events import LATENESS_BUCKETS_S, Series, type_label
from timeshard.observe.tracing import AttrValue, Tracing
from timeshard.worker.context import EventHook, JobContext

OUTCOMES = frozenset({"succeeded", "failed", "lost", "unreported", "rejected"})
RUN_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class WorkerMetrics:
    def __init__(
        self, *, clock: Clock | None = None, max_types: int = 200, tracer_provider: Any = None
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.max_types = max_types
        self._types: set[str] = set()
        self._started: dict[tuple[str, int], tuple[int, Any]] = {}  # (job, fence) -> (ms, span)
        self._series = Series()  # (each run looks up three labelled series)
        self.tracing = Tracing(tracer_provider)
        self.lateness = Histogram(
            "timeshard_worker_start_lateness_seconds",
            "From a job's due time to its handler's start on this worker.",
            ["type"],
            buckets=LATENESS_BUCKETS_S,
            registry=self.registry,
        )
        self.jobs_total = Counter(
            "timeshard_worker_jobs",
            "Runs by how they ended (succeeded, failed, lost, unreported, rejected).",
            ["type", "outcome"],
            registry=self.registry,
        )
        self.run_seconds = Histogram(
            "timeshard_worker_job_seconds",
            "From a handler's start to its result being accepted (or given up).",
            ["type", "outcome"],
            buckets=RUN_BUCKETS_S,
            registry=self.registry,
        )

    def _label(self, job_type: str) -> str:
        return type_label(self._types, self.max_types, job_type)

    def on_event(self, kind: str, ctx: JobContext, detail: str) -> None:
        """The worker's event hook: ``started`` and one of ``OUTCOMES`` per run."""
        now = self.clock.now_ms()
        label = self._label(ctx.job_type)
        key = (ctx.job_id, ctx.fence)
        if kind == "started":
            self._series.of(self.lateness, label).observe(max(0, now - ctx.run_at) / 1000)
            self._started[key] = (now, self._handler_span(ctx, now))
            return
        if kind not in OUTCOMES:
            return
        self._series.of(self.jobs_total, label, kind).inc()
        started = self._started.pop(key, None)
        if started is None:
            return
        started_ms, span = started
        self._series.of(self.run_seconds, label, kind).observe(max(0, now - started_ms) / 1000)
        if span is not None:
            span.set_attribute("timeshard.outcome", kind)
        self.tracing.end(span, end_ms=now, error=detail if kind != "succeeded" else "")

    def _handler_span(self, ctx: JobContext, now: int) -> Any:
        if not self.tracing.enabled:
            return None
        attributes: dict[str, AttrValue] = {
            "timeshard.job_type": ctx.job_type,
            "timeshard.fence": ctx.fence,
            "timeshard.attempt": ctx.attempt,
            "timeshard.worker": ctx.worker_id,
        }
        return self.tracing.start(
            "timeshard.handler", ctx.job_id, start_ms=now, attributes=attributes
        )

    def hook(self, then: EventHook | None = None) -> EventHook:
        """An event hook that counts, then calls ``then`` (e.g. the CLI's printer)."""

        def both(kind: str, ctx: JobContext, detail: str) -> None:
            self.on_event(kind, ctx, detail)
            if then is not None:
                then(kind, ctx, detail)

        return both
