"""``timeshard worker`` adds its metrics (and, unless --quiet, its progress printer) to the event
hook a Worker was built with, and keeps that hook: a worker's own record of its results (the
chaos suite's ledger, an audit log) must not go silent when it runs under the CLI."""

from __future__ import annotations

import pytest

from timeshard.cli.serve import install_event_hooks
from timeshard.worker import JobContext, Worker
from timeshard.worker.metrics import WorkerMetrics


def ctx() -> JobContext:
    return JobContext(
        job_id="j1",
        job_type="t",
        payload=b"",
        attempt=1,
        max_attempts=3,
        fence=1,
        idempotency_key="j1",
        run_at=1000,
        started_at_ms=1000,
        worker_id="w",
    )


@pytest.mark.parametrize("quiet", [True, False])
def test_the_workers_own_event_hook_still_hears_every_event(
    quiet: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    heard: list[tuple[str, str]] = []
    worker = Worker(worker_id="w", on_event=lambda kind, c, detail: heard.append((kind, detail)))
    install_event_hooks(worker, WorkerMetrics(), quiet=quiet)
    worker._emit("succeeded", ctx())
    worker._emit("unreported", ctx(), "not sent: the lease is over")
    assert heard == [("succeeded", ""), ("unreported", "not sent: the lease is over")]
    printed = capsys.readouterr().out
    assert ("succeeded" in printed) is not quiet  # progress, unless --quiet
    assert "unreported" not in printed  # a problem: the SDK's WARNING log line, not a print


def test_without_a_hook_of_its_own_the_worker_gets_metrics_only() -> None:
    worker = Worker(worker_id="w")
    metrics = WorkerMetrics()
    install_event_hooks(worker, metrics, quiet=True)
    worker._emit("succeeded", ctx())  # counted, nothing else to call
    counted = metrics.registry.get_sample_value(
        "timeshard_worker_jobs_total", {"type": "t", "outcome": "succeeded"}
    )
    assert counted == 1.0
