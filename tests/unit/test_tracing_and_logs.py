"""OpenTelemetry spans of a job's life (schedule -> dispatch -> claim -> handler -> finish, one
trace per job across processes), the worker's metrics, and ``--log-format json``."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from tests.unit.helpers import START_MS, advance, running
from timeshard.clock import FakeClock
from timeshard.node import JobSpec
from timeshard.observe import logs
from timeshard.observe.logs import JsonFormatter
from timeshard.observe.tracing import Tracing, job_parent
from timeshard.testing.waits import wait_until
from timeshard.worker import JobContext
from timeshard.worker.metrics import WorkerMetrics

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
export = pytest.importorskip("opentelemetry.sdk.trace.export")


async def test_a_jobs_spans_share_one_trace_with_its_id_and_fence() -> None:
    exporter = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    async with running() as (node, clock):
        node.metrics.tracing = Tracing(provider)
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards taken")
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="mail", payload=b"", run_at=START_MS + 1000)
        )
        await advance(node, clock, 1.5)
        (claimed,) = await node.claims.claim(
            worker="w1", types=["mail"], limit=1, wait_s=0, lease_s=30
        )

        # The worker, in another process in real life: its spans join the job's trace too.
        worker = WorkerMetrics(clock=clock, tracer_provider=provider)
        ctx = JobContext(
            job_id=job.job_id,
            job_type="mail",
            payload=b"",
            attempt=1,
            max_attempts=3,
            fence=claimed.job.fence,
            idempotency_key=job.job_id,
            run_at=job.run_at,
            started_at_ms=claimed.job.started_at,
            worker_id="w1",
        )
        worker.on_event("started", ctx, "")
        clock.advance(0.25)
        await node.attempts.complete(job.job_id, claimed.job.fence)
        worker.on_event("succeeded", ctx, "")

    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert names == [
        "timeshard.schedule",
        "timeshard.dispatch",
        "timeshard.claim",
        "timeshard.finish",
        "timeshard.handler",
    ]
    trace_id, parent_id = job_parent(job.job_id)
    for span in spans:
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == parent_id
        assert span.attributes["timeshard.job_id"] == job.job_id
    by_name = {s.name: s for s in spans}
    assert by_name["timeshard.claim"].attributes["timeshard.fence"] == claimed.job.fence
    assert by_name["timeshard.claim"].attributes["timeshard.worker"] == "w1"
    assert by_name["timeshard.finish"].attributes["timeshard.state"] == "succeeded"
    handler = by_name["timeshard.handler"]
    assert handler.attributes["timeshard.fence"] == claimed.job.fence
    assert handler.attributes["timeshard.outcome"] == "succeeded"
    assert handler.end_time - handler.start_time == 250_000_000  # ns, on the injected clock
    # The dispatch span runs from the due time to the moment the job was made ready.
    dispatch = by_name["timeshard.dispatch"]
    assert dispatch.start_time == job.run_at * 1_000_000


def test_tracing_without_a_provider_builds_no_span_and_does_not_fail() -> None:
    tracing = Tracing()  # the global provider: none configured in this process
    assert not tracing.enabled
    span = tracing.start("timeshard.x", "job-1", start_ms=1, attributes={})
    assert span is None  # a no-op span would still cost its building
    tracing.end(span, end_ms=2)


def test_tracing_looks_for_a_global_provider_once_a_second_not_once_per_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The look reads the environment (about 4 us) and ran three times per job: a second of
    jobs now costs one look. A provider set later is still found, at the next look."""
    from opentelemetry import trace

    import timeshard.observe.tracing as tracing_module

    looks: list[int] = []
    real = trace.get_tracer_provider
    later = sdk_trace.TracerProvider()
    given = [real()]

    def get_tracer_provider() -> object:
        looks.append(1)
        return given[0]

    now = [1000.0]
    monkeypatch.setattr(tracing_module._otel, "get_tracer_provider", get_tracer_provider)
    monkeypatch.setattr(tracing_module.time, "monotonic", lambda: now[0])
    tracing = Tracing()
    looks.clear()  # (making the tracer looked too)
    assert not any(tracing.enabled for _ in range(1000))
    assert len(looks) == 1
    given[0] = later  # a provider is set (opentelemetry-instrument, or in code)
    now[0] += 0.5
    assert not tracing.enabled and len(looks) == 1
    now[0] += 0.6
    assert tracing.enabled and len(looks) == 2
    assert tracing.enabled and len(looks) == 2, "found once: never looked for again"


def test_worker_metrics_count_runs_and_lateness() -> None:
    clock = FakeClock(START_MS + 2000)
    metrics = WorkerMetrics(clock=clock)
    ctx = JobContext(
        job_id="j1",
        job_type="mail",
        payload=b"",
        attempt=1,
        max_attempts=3,
        fence=1,
        idempotency_key="j1",
        run_at=START_MS,
        started_at_ms=START_MS + 1500,
        worker_id="w",
    )
    seen: list[str] = []
    hook = metrics.hook(lambda kind, _ctx, _detail: seen.append(kind))
    hook("started", ctx, "")
    clock.advance(3)
    hook("failed", ctx, "boom")
    assert seen == ["started", "failed"]
    reg = metrics.registry
    assert reg.get_sample_value(
        "timeshard_worker_start_lateness_seconds_sum", {"type": "mail"}
    ) == pytest.approx(2.0)
    assert (
        reg.get_sample_value("timeshard_worker_jobs_total", {"type": "mail", "outcome": "failed"})
        == 1
    )
    assert reg.get_sample_value(
        "timeshard_worker_job_seconds_sum", {"type": "mail", "outcome": "failed"}
    ) == pytest.approx(3.0)


def _json_lines(emit: object) -> list[dict[str, object]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(node="node-7"))
    logger = logging.getLogger("timeshard.test.json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        emit(logger)  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_logs_carry_time_level_node_shard_job_and_event() -> None:
    def emit(log: logging.Logger) -> None:
        log.warning(
            "job %s dead-lettered: %s",
            "job-42",
            'quote " and newline \n',
            extra={"job_id": "job-42", "shard": 3, "event": "job.dead_lettered"},
        )
        log.info("plain %d", 5)

    first, second = _json_lines(emit)
    assert first["level"] == "warning" and first["node"] == "node-7"
    assert first["job_id"] == "job-42" and first["shard"] == 3
    assert first["event"] == "job.dead_lettered"
    assert first["message"] == 'job job-42 dead-lettered: quote " and newline \n'
    assert str(first["time"]).endswith("Z") and "T" in str(first["time"])
    assert second["event"] == "plain %d" and "shard" not in second and "job_id" not in second


def test_json_logs_name_the_shard_or_job_of_the_task_that_logged() -> None:
    async def main(log: logging.Logger) -> None:
        async def in_task() -> None:
            log.info("shard %d: deposed", 9)

        await asyncio.create_task(in_task(), name="dispatcher-9")
        await asyncio.create_task(in_task(), name="job-abc123")

    first, second = _json_lines(lambda log: asyncio.run(main(log)))
    assert first["shard"] == 9 and "job_id" not in first
    assert second["job_id"] == "abc123"


def test_a_quieted_log_says_each_key_once_per_quiet_period(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    quiet = logs.Quieted(logging.getLogger("test.quiet"), 60.0, " (then what happens)")
    with caplog.at_level(logging.INFO, logger="test.quiet"):
        said = [quiet.info("a", "a failed"), quiet.info("a", "a failed again")]
        said.append(quiet.info("b", "b failed"))
        now[0] += 60.0
        said.append(quiet.info("a", "a failed a minute later"))
    assert said == [True, False, True, True]
    assert [r.getMessage() for r in caplog.records] == [
        "a failed (then what happens)",
        "b failed (then what happens)",
        "a failed a minute later (then what happens)",
    ]
