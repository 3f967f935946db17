"""The Prometheus endpoint: scraped over HTTP, it shows the store's live counters (read at
scrape time, not copied) and the node's gauges, and answers other paths with 404."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tests.unit.helpers import START_MS, advance, running, settle
from timeshard.node import Beat, JobSpec
from timeshard.store.stats import StoreStats
from timeshard.testing.waits import wait_until
from timeshard.views.health import HealthWatcher
from timeshard.views.http import HttpServer, metrics_route, serve_node
from timeshard.views.metrics import StoreCollector


async def scrape(port: int, path: str = "/metrics") -> tuple[int, dict[str, str], str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    await writer.wait_closed()
    head, _, body = raw.decode().partition("\r\n\r\n")
    status_line, *header_lines = head.split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_store_counters_are_read_live_at_each_scrape() -> None:
    stats = StoreStats()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: stats))
    server = HttpServer({"/metrics": metrics_route(registry)}, port=0)
    await server.start()
    try:
        status, headers, body = await scrape(server.port)
        assert status == 200
        assert headers["content-type"].startswith("text/plain")
        assert samples(body)[("timeshard_store_paxos_rounds_total", ())] == 0

        stats.round(rows=50, kind="claim+complete")
        stats.round()
        stats.operations["claim_jobs"] += 3
        stats.errors["claim_jobs"] += 1
        stats.seconds["claim_jobs"] += 0.25
        got = samples((await scrape(server.port))[2])
        assert got[("timeshard_store_paxos_rounds_total", ())] == 2
        assert got[("timeshard_store_conditional_rows_total", ())] == 51
        by_kind = "timeshard_store_paxos_rounds_by_kind_total"
        assert got[(by_kind, (("kind", "claim+complete"),))] == 1
        assert got[(by_kind, (("kind", "other"),))] == 1
        assert got[("timeshard_store_operations_total", (("op", "claim_jobs"),))] == 3
        assert got[("timeshard_store_errors_total", (("op", "claim_jobs"),))] == 1
        assert got[("timeshard_store_operation_seconds_total", (("op", "claim_jobs"),))] == 0.25
    finally:
        await server.stop()


async def test_a_store_without_stats_exports_no_store_metrics() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: None))
    server = HttpServer({"/metrics": metrics_route(registry)}, port=0)
    await server.start()
    try:
        status, _, body = await scrape(server.port)
        assert status == 200
        assert "timeshard_store" not in body
    finally:
        await server.stop()


async def test_a_node_serves_its_gauges_at_metrics() -> None:
    async with running() as (node, _):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards taken")
        server = await serve_node(node, host="127.0.0.1", port=0)
        try:
            status, _, body = await scrape(server.port)
            assert status == 200
            got = samples(body)
            assert got[("timeshard_node_shards_owned", ())] == node.num_shards
            assert got[("timeshard_node_ready_jobs", ())] == 0
            assert ("process_cpu_seconds_total", ()) in got
            if getattr(node.store, "stats", None) is not None:
                assert ("timeshard_store_paxos_rounds_total", ()) in got

            assert (await scrape(server.port, "/nothing-here"))[0] == 404
        finally:
            await server.stop()


# -- a scripted run: the counters say exactly what happened ------------------------------------


def value(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return got.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_scripted_run_shows_in_the_metrics_with_the_right_values() -> None:
    """Schedule N, fail M (retried, then they succeed), dead-letter K, cancel one, let one
    lease expire, leave one unclaimed: every counter, the lateness histogram and the shard
    gauges agree with what happened."""
    n, m, k = 12, 3, 2
    async with running() as (node, clock):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards taken")
        http = await serve_node(node, host="127.0.0.1", port=0)
        try:
            for _ in range(n):
                await node.jobs.schedule(
                    JobSpec(job_type="mail", payload=b"{}", run_at=START_MS + 1000)
                )
            victim, _ = await node.jobs.schedule(
                JobSpec(job_type="mail", payload=b"{}", run_at=START_MS + 60_000)
            )
            await node.jobs.cancel(victim.job_id)
            await advance(node, clock, 2.5)  # due 1 s in, claimed 2.5 s in: 1.5 s late each

            claimed = await node.claims.claim(
                worker="w", types=["mail"], limit=n, wait_s=0, lease_s=30
            )
            assert len(claimed) == n
            for c in claimed[:m]:
                await node.attempts.fail(
                    c.job.job_id, c.job.fence, "timeout talking to smtp", False
                )
            for c in claimed[m : m + k]:
                await node.attempts.fail(c.job.job_id, c.job.fence, "bad address", True)
            for c in claimed[m + k :]:
                await node.attempts.complete(c.job.job_id, c.job.fence)
            first = samples((await scrape(http.port))[2])

            # One run whose lease runs out, then runs again.
            slow, _ = await node.jobs.schedule(
                JobSpec(job_type="slow", payload=b"", run_at=START_MS + 2500)
            )
            await settle(node)
            (run1,) = await node.claims.claim(
                worker="w", types=["slow"], limit=1, wait_s=0, lease_s=1
            )
            started = Beat(slow.job_id, run1.job.fence, 0.0, clock.now_ms())
            node.attempts.notice_starts([started])  # its handler started, then hung
            await advance(node, clock, 2.0)
            (run2,) = await node.claims.claim(
                worker="w2", types=["slow"], limit=1, wait_s=0, lease_s=30
            )
            assert run2.job.job_id == slow.job_id and run2.job.fence > run1.job.fence

            # The retries (backoff at most 1 s) are due by now: they succeed.
            retried = await node.claims.claim(
                worker="w", types=["mail"], limit=n, wait_s=0, lease_s=30
            )
            assert sorted(c.job.job_id for c in retried) == sorted(
                c.job.job_id for c in claimed[:m]
            )
            for c in retried:
                await node.attempts.complete(c.job.job_id, c.job.fence)

            # One due job nobody claims: its shard shows it due, and how late.
            idle, _ = await node.jobs.schedule(
                JobSpec(job_type="idle", payload=b"", run_at=clock.now_ms())
            )
            await advance(node, clock, 3.0)
            got = samples((await scrape(http.port))[2])
        finally:
            await http.stop()

    # Lateness of the first runs: each 1.5 s late (in the 2.5 s bucket, not the 1 s one).
    assert value(first, "timeshard_fire_lateness_seconds_count", type="mail") == n
    assert value(first, "timeshard_fire_lateness_seconds_sum", type="mail") == pytest.approx(
        1.5 * n
    )
    assert value(first, "timeshard_fire_lateness_seconds_bucket", type="mail", le="1.0") == 0
    assert value(first, "timeshard_fire_lateness_seconds_bucket", type="mail", le="2.5") == n

    assert value(got, "timeshard_jobs_scheduled_total", type="mail") == n + 1
    assert value(got, "timeshard_jobs_claimed_total", type="mail") == n + m
    assert value(got, "timeshard_jobs_failed_total", type="mail") == m + k
    assert value(got, "timeshard_jobs_retries_total", type="mail") == m
    assert value(got, "timeshard_jobs_dead_lettered_total", type="mail") == k
    assert value(got, "timeshard_jobs_succeeded_total", type="mail") == n - k
    assert value(got, "timeshard_jobs_cancelled_total", type="mail") == 1
    assert value(got, "timeshard_fire_lateness_seconds_count", type="mail") == n + m
    # The expired lease: one expiry, one re-run, and the re-run is not counted as lateness.
    assert value(got, "timeshard_lease_expiries_total", type="slow") == 1
    assert value(got, "timeshard_job_reruns_total", type="slow") == 1
    assert value(got, "timeshard_jobs_claimed_total", type="slow") == 2
    assert value(got, "timeshard_fire_lateness_seconds_count", type="slow") == 1
    # The unclaimed job: ready on its shard and 3 s old for its type; its owner is not behind
    # (it made the job ready at once), so no shard shows dispatch lag or a due entry.
    shard = str(idle.shard)
    assert value(got, "timeshard_shard_ready_jobs", shard=shard) == 1
    assert value(got, "timeshard_type_unclaimed_jobs", type="idle") == 1
    assert value(got, "timeshard_type_oldest_unclaimed_age_seconds", type="idle") == (
        pytest.approx(3.0)
    )
    assert value(got, "timeshard_type_unclaimed_jobs", type="mail") == 0
    for s in range(node.num_shards):
        assert value(got, "timeshard_shard_epoch", shard=str(s)) >= 1
        assert value(got, "timeshard_shard_dispatch_lag_seconds", shard=str(s)) == 0
        assert value(got, "timeshard_shard_due_jobs", shard=str(s)) == 0
    assert value(got, "timeshard_cluster_shards") == node.num_shards
    assert value(got, "timeshard_coordinator_connected") == 1
    # No job id ever becomes a label.
    assert all(victim.job_id not in str(key) and slow.job_id not in str(key) for key in got)


async def test_the_dead_letter_count_comes_from_the_store() -> None:
    async with running() as (node, _):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards taken")
        for _ in range(3):
            await node.jobs.schedule(
                JobSpec(job_type="t", payload=b"", run_at=START_MS, max_attempts=1)
            )
        await settle(node)
        for c in await node.claims.claim(worker="w", types=["t"], limit=3, wait_s=0, lease_s=30):
            await node.attempts.fail(c.job.job_id, c.job.fence, "nope", False)  # out of attempts

        async def ignore(_: bool) -> None:
            return None

        watcher = HealthWatcher(node, ignore)
        await watcher.count_dead_letters(force=True)
        http = await serve_node(node, host="127.0.0.1", port=0)
        try:
            got = samples((await scrape(http.port))[2])
        finally:
            await http.stop()
        assert value(got, "timeshard_dead_letter_jobs") == 3
        assert len(node.metrics.health.latest_dead) == 3


async def test_jobs_a_cron_schedule_creates_count_as_scheduled() -> None:
    """An occurrence is a job created like any other: NodeStatus's per-type counts (behind
    ``timeshard status``) and ``timeshard_jobs_scheduled_total`` count it, so scheduled minus
    finished stays the jobs not finished, never negative. A fire repeated after the occurrence
    was made (two dispatchers, a fire cut off) does not count it again."""
    from timeshard.model import Schedule
    from timeshard.views.status import node_status

    async with running() as (node, clock):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards taken")
        s = Schedule(
            schedule_id="every-minute",
            shard=0,
            cron="* * * * *",
            timezone="UTC",
            job_type="cron.t",
            next_fire=0,
            created_at=0,
        )
        await node.schedules.create(s)
        for _ in range(3):
            await advance(node, clock, 60, step=5)
            for c in await node.claims.claim(
                worker="w", types=["cron.t"], limit=10, wait_s=0, lease_s=30
            ):
                await node.attempts.complete(c.job.job_id, c.job.fence)
        # The fire of the third minute again, as a second dispatcher would: made already.
        stored = await node.schedules.get("every-minute")
        again = stored.with_(next_fire=START_MS + 3 * 60_000)
        await node.store.update_schedule(again, stored.version, None)
        assert node.dispatch_parts.firer is not None
        await node.dispatch_parts.firer.fire("every-minute", again.next_fire)
        status = await node_status(node)
        http = await serve_node(node, host="127.0.0.1", port=0)
        try:
            got = samples((await scrape(http.port))[2])
        finally:
            await http.stop()
    counts = status.totals["cron.t"]
    assert (counts["scheduled"], counts["succeeded"]) == (3, 3)
    assert value(got, "timeshard_jobs_scheduled_total", type="cron.t") == 3


def test_job_types_past_the_limit_count_under_other_and_each_count_stays_its_own() -> None:
    """The node keeps each type's series after its first use (``labels()`` per job was a lock
    and a check each time): the counts must still land on the right series, and a type past
    ``max_types`` on ``_other``, however often it comes."""
    from timeshard.clock import FakeClock
    from timeshard.model import Job, JobState
    from timeshard.observe.events import NodeMetrics

    metrics = NodeMetrics(FakeClock(START_MS), max_types=2)

    def job(job_type: str, state: JobState) -> Job:
        return Job(
            job_id=f"{job_type}-{state.value}",
            shard=0,
            job_type=job_type,
            payload=b"",
            run_at=START_MS,
            created_at=START_MS,
            state=state,
            priority=3,
        )

    for job_type in ["a", "b", "c", "a", "c", "d"]:
        metrics.scheduled([job(job_type, JobState.SCHEDULED)], START_MS)
        metrics.claimed(job(job_type, JobState.RUNNING), START_MS + 2000)
        metrics.written(job(job_type, JobState.SUCCEEDED))
    totals = metrics.totals()
    assert {t: (n["scheduled"], n["claimed"], n["succeeded"]) for t, n in totals.items()} == {
        "a": (2, 2, 2),
        "b": (1, 1, 1),
        "_other": (3, 3, 3),
    }
    waits = {
        (s.name, s.labels.get("priority")): s.value
        for family in metrics.registry.collect()
        if family.name == "timeshard_claim_wait_seconds"
        for s in family.samples
        if s.name.endswith("_count")
    }
    assert waits == {("timeshard_claim_wait_seconds_count", "3"): 6}


def test_the_time_in_the_garbage_collector_is_counted_by_generation() -> None:
    """``timeshard_gc_seconds_total``: a full collection shows as time and a run of
    generation 2 (the load tool reads it to tell the collector's share of a run)."""
    import gc

    from timeshard.views.metrics import GC_TIME, registry_of

    registry = registry_of()  # (installs the callback, once per process)
    registry_of()

    def read() -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels["generation"]): s.value
            for s in registry.collect()
            for s in s.samples
            if s.name.startswith("timeshard_gc_")
        }

    before = read()
    gc.collect()
    after = read()
    assert after[("timeshard_gc_collections_total", "2")] == (
        before[("timeshard_gc_collections_total", "2")] + 1
    )
    assert after[("timeshard_gc_seconds_total", "2")] > before[("timeshard_gc_seconds_total", "2")]
    assert gc.callbacks.count(GC_TIME._on_gc) == 1
