"""OpenTelemetry spans of a job's life: schedule -> dispatch -> claim -> handler -> finish.

Used when the ``opentelemetry`` packages are installed (``pip install 'timeshard[otel]'``: the
SDK, opentelemetry-distro's ``opentelemetry-instrument`` and the OTLP/gRPC exporter) and a
tracer provider is configured (``opentelemetry-instrument timeshard server ...``, or a provider
set in code); otherwise every call is a no-op.

The spans of one job are written by different processes (the node a client called, the shard's
owner, the worker, the node that took the result) that share nothing but the job id. So each
span is made a child of a parent derived from the job id (its trace id and span id are a hash
of it): every span of a job lands in the same trace, with no context stored in the job row.
The parent itself is never recorded; trace viewers show the job's spans under a missing root.

A span is recorded after the fact, with the start and end times of what it measures (in the
node's clock), so the hooks that report it are single calls after the work.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

try:
    from opentelemetry import trace as _otel
except ImportError:  # the optional extra is not installed
    _otel = None  # type: ignore[assignment]

AttrValue = str | int | float | bool


def available() -> bool:
    return _otel is not None


def job_parent(job_id: str) -> tuple[int, int]:
    """The (trace id, span id) every span of ``job_id`` hangs under."""
    digest = hashlib.sha256(job_id.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


class Tracing:
    """Records job spans on ``provider`` (default: the global tracer provider)."""

    def __init__(self, provider: Any = None) -> None:
        self._tracer: Any = None
        self._global = provider is None
        self._look_at = 0.0  # (monotonic) when to look for a global provider next
        if _otel is not None:
            self._tracer = _otel.get_tracer("timeshard", tracer_provider=provider)

    @property
    def enabled(self) -> bool:
        """A provider that records is set. With the package importable but no provider
        configured, the spans would be no-ops that still cost ~15 % of a node's firing CPU
        (docs/benchmarks.md), so they are not built at all."""
        if self._tracer is None:
            return False
        if self._global:  # set at most once, maybe after this was made: look until it is,
            now = time.monotonic()  # once a second (the look reads the environment: ~4 us,
            if now < self._look_at:  # and it was made three times per job)
                return False
            self._look_at = now + 1.0
            assert _otel is not None
            provider = _otel.get_tracer_provider()
            if isinstance(provider, _otel.ProxyTracerProvider | _otel.NoOpTracerProvider):
                return False
            self._global = False
        return True

    def _context(self, job_id: str) -> Any:
        assert _otel is not None
        trace_id, span_id = job_parent(job_id)
        parent = _otel.SpanContext(
            trace_id=trace_id,
            span_id=span_id,
            is_remote=True,
            trace_flags=_otel.TraceFlags(_otel.TraceFlags.SAMPLED),
        )
        return _otel.set_span_in_context(_otel.NonRecordingSpan(parent))

    def record(
        self,
        name: str,
        job_id: str,
        *,
        start_ms: int,
        end_ms: int,
        attributes: dict[str, AttrValue],
        error: str = "",
    ) -> None:
        """A finished span ``name`` of job ``job_id`` from ``start_ms`` to ``end_ms``."""
        span = self.start(name, job_id, start_ms=start_ms, attributes=attributes)
        self.end(span, end_ms=end_ms, error=error)

    def start(
        self, name: str, job_id: str, *, start_ms: int, attributes: dict[str, AttrValue]
    ) -> Any:
        """An open span (None when tracing is off); close it with ``end``."""
        if not self.enabled:
            return None
        attrs: dict[str, AttrValue] = {"timeshard.job_id": job_id, **attributes}
        return self._tracer.start_span(
            name,
            context=self._context(job_id),
            attributes=attrs,
            start_time=start_ms * 1_000_000,
        )

    def end(self, span: Any, *, end_ms: int, error: str = "") -> None:
        if span is None:
            return
        assert _otel is not None
        if error:
            span.set_status(_otel.Status(_otel.StatusCode.ERROR, error[:200]))
        span.end(end_time=end_ms * 1_000_000)
