"""A due job nobody claims (a type without workers, or misspelt) shows as an age that keeps
growing: per type on /metrics, the status page and ``timeshard status``, and it
raises TimeshardJobsUnclaimed. Its entry is written again, due now, every minute so it never
pins its shard's cursor; the age counts from the job's own due time all the same, on its
owner and on a new owner after failover. The old node showed it only as a dispatch lag that
sawed between 0 and 60 s, which no alert could see."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.helpers import START_MS, FixedCoordinator, advance, running
from timeshard.clock import FakeClock
from timeshard.node import JobSpec, Node
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.views.metrics import node_registry
from timeshard.views.page import render
from timeshard.views.status import node_status

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
DESCRIPTION = (
    "Due jobs of mial are not claimed by any worker (timeshard_type_unclaimed_jobs). Check that "
    "workers for this type run and name it exactly so, whether the type is paused, and its "
    "concurrency limit."
)


def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(node_registry(node)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def age(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], job_type: str) -> float:
    return got[("timeshard_type_oldest_unclaimed_age_seconds", (("type", job_type),))]


async def test_an_unclaimed_job_ages_on_metrics_from_its_own_due_time_and_alerts(
    tmp_path: Path,
) -> None:
    due = START_MS + 1000
    ages: list[float] = []
    lags: list[float] = []
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(JobSpec(job_type="mial", payload=b"", run_at=due))
        await node.jobs.schedule(JobSpec(job_type="mail", payload=b"", run_at=due))
        # The first scrape half a second after they came due, not at the very instant: on the
        # fake clock a dispatcher's timer for that instant may land a hair after it, so one of
        # the two could still be on its way to the ready queue.
        await advance(node, clock, 1.5)
        await wait_until(lambda: node.ready.count() == 2, timeout=30, what="both jobs ready")
        for i in range(19 * 4 + 1):  # a scrape every 15 s for 19 minutes from its due time
            if i:
                await advance(node, clock, 15, step=5)
            got = scrape(node)
            ages.append(age(got, "mial"))
            lags.append(got[("timeshard_shard_dispatch_lag_seconds", (("shard", str(job.shard)),))])
            assert age(got, "mial") == pytest.approx((clock.now_ms() - due) / 1000)
            assert got[("timeshard_type_unclaimed_jobs", (("type", "mial"),))] == 1
        assert node.ready.count() == 2, "the jobs were claimed or lost"
        entries = await node.store.read_bucket(
            job.shard, (clock.now_ms() // 60_000) - 1, due_from=0, due_to=2**62
        )
        assert any(e.job_id == job.job_id for e in entries), "not re-filed every minute"
        # A type whose jobs get claimed falls back to 0 (the series stays).
        await node.claims.claim(worker="w", types=["mail"], limit=1, wait_s=0, lease_s=30)
        got = scrape(node)
        assert got[("timeshard_type_unclaimed_jobs", (("type", "mail"),))] == 0
        assert age(got, "mail") == 0
        status = await node_status(node)
    assert ages == sorted(ages) and ages[-1] == pytest.approx(19 * 60 + 0.5)
    assert max(lags) < 30, "a job waiting for a claim counts as dispatch lag again"
    # The status page names the type and its age.
    (waiting,) = status.unclaimed
    assert (waiting.job_type, waiting.jobs, waiting.oldest_age_ms) == ("mial", 1, 1_140_500)
    page = render(status)
    assert 'id="unclaimed"' in page and "mial" in page and "19.0 min" in page

    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (apt-get install prometheus): alert not evaluated")
    test = tmp_path / "scraped_test.yml"
    test.write_text(
        textwrap.dedent(
            f"""\
            rule_files: [{ALERTS}]
            evaluation_interval: 15s
            tests:
              - interval: 15s
                input_series:
                  - series: 'timeshard_type_oldest_unclaimed_age_seconds{{type="mial"}}'
                    values: '{" ".join(f"{v:g}" for v in ages)}'
                  - series: 'timeshard_shard_dispatch_lag_seconds{{shard="{job.shard}"}}'
                    values: '{" ".join(f"{v:g}" for v in lags)}'
                alert_rule_test:
                  - {{eval_time: 19m, alertname: TimeshardDispatchLagHigh}}
                  - eval_time: 19m
                    alertname: TimeshardJobsUnclaimed
                    exp_alerts:
                      - exp_labels: {{severity: warning, type: mial}}
                        exp_annotations:
                          summary: "Jobs of type mial wait unclaimed (oldest due 19m 0s ago)"
                          description: {json.dumps(DESCRIPTION)}
            """
        )
    )
    result = subprocess.run(
        ["promtool", "test", "rules", str(test)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_a_new_owner_ages_the_waiting_job_from_its_original_due_time(
    tmp_path: Path,
) -> None:
    """After failover the new owner reads the re-filed entry (due at the re-filing) and the
    job row, which keeps ``run_at``: the age goes on from the original due time."""
    db = tmp_path / "t.db"
    due = START_MS + 1000
    async with running(db) as (node, clock):
        await node.jobs.schedule(JobSpec(job_type="mial", payload=b"", run_at=due))
        await advance(node, clock, 300, step=5)  # re-filed four or five times
        assert age(scrape(node), "mial") == pytest.approx((clock.now_ms() - due) / 1000)
    async with running(db, clock=clock) as (node2, clock2):
        await advance(node2, clock2, 2)
        assert node2.ready.count() == 1
        assert age(scrape(node2), "mial") == pytest.approx((clock2.now_ms() - due) / 1000)


async def test_a_run_again_after_its_lease_expired_ages_from_the_expiry() -> None:
    """An expired lease is a failed attempt, retried after the type's backoff: the re-run has
    been due since its retry time (after the lease ran out), not since its first due time."""
    async with running() as (node, clock):
        job, _ = await node.jobs.schedule(
            JobSpec(job_type="slow", payload=b"", run_at=START_MS + 1000)
        )
        await advance(node, clock, 2)
        await node.claims.claim(worker="w", types=["slow"], limit=1, wait_s=0, lease_s=60)
        await advance(node, clock, 75, step=5)  # the lease ends 62 s in; nobody claims since
        stored = await node.jobs.get(job.job_id)
        due_since = max(stored.run_at, stored.lease_until)
        assert due_since >= START_MS + 62_000, "aged from the first due time"
        got = scrape(node)
        assert got[("timeshard_type_unclaimed_jobs", (("type", "slow"),))] == 1
        assert age(got, "slow") == pytest.approx((clock.now_ms() - due_since) / 1000)


class MovableCoordinator(FixedCoordinator):
    """Owns the given shards until told one has gone, and never reports the loss (a
    ZooKeeper loss report that is late)."""

    def lose(self, shard: int) -> None:
        self._owned = self._owned - {shard}


async def test_a_deposed_dispatcher_stops_reporting_its_shard(tmp_path: Path) -> None:
    """A dispatcher deposed by a newer epoch stays in the node's map until the coordinator's
    loss report; meanwhile its shard was counted twice (old and new owner) and its stopped
    reads showed a dispatch lag growing on the node that no longer dispatches it."""
    coordinator = MovableCoordinator(range(4))
    clock = FakeClock(START_MS)
    node = Node(
        store=SqliteStore(tmp_path / "t.db", num_shards=4),
        coordinator=coordinator,
        clock=clock,
        node_id="old-owner",
    )
    await node.start()
    try:
        await advance(node, clock, 2)
        coordinator.lose(1)
        node.dispatchers[1].deposed_by_store()  # a write of ours met a newer epoch
        await advance(node, clock, 60, step=5)
        assert 1 in node.dispatchers, "the test needs the deposed dispatcher kept"
        got = scrape(node)
        assert ("timeshard_shard_epoch", (("shard", "1"),)) not in got
        assert ("timeshard_shard_dispatch_lag_seconds", (("shard", "1"),)) not in got
        assert got[("timeshard_node_shards_owned", ())] == 3
        status = await node_status(node)
        assert not status.shards[1].here
    finally:
        await node.stop()
