"""The chaos suite, short and seed-fixed: about 100 s of delayed and cron jobs on 3 nodes and 4
workers while workers and nodes are killed and paused and a ZooKeeper server restarts, then a
drain and the checker (``timeshard.testing.chaos``). Every must-be-zero count must be zero.

The store is the single Cassandra node of the session (``TIMESHARD_CASSANDRA`` or started by
the fixture), shared with other tests, so no Cassandra node is killed and the store is never
taken away here: those faults need a Cassandra of the run's own (``tools/chaos.py
--cassandra-nodes 3`` for a node kill, ``--cassandra-nodes 1`` or 3 for a store outage). The
drain may take minutes on a busy machine; only what is not terminal when it ends counts as lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from timeshard.stack import ZooKeeperEnsemble
from timeshard.testing.chaos.check import MUST_BE_ZERO
from timeshard.testing.chaos.plan import FaultKind
from timeshard.testing.chaos.run import ChaosConfig, ChaosRun, Services

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900, func_only=True)]

CONFIG = ChaosConfig(
    duration_s=100.0,
    rate=5.0,
    seed=20261201,
    shards=16,
    session_s=4.0,
    drain_s=300.0,
    fault_gap_s=(3.0, 6.0),
)


def test_a_short_seeded_chaos_run_keeps_every_guarantee(
    tmp_path: Path, ensemble: ZooKeeperEnsemble, cassandra: str
) -> None:
    services = Services(zookeeper=ensemble.hosts, cassandra=cassandra, ensemble=ensemble)
    report = ChaosRun(CONFIG, services, tmp_path).run()
    counts = report.counts
    every_kind = {
        FaultKind.WORKER_KILL,
        FaultKind.WORKER_STOP,
        FaultKind.NODE_KILL,
        FaultKind.NODE_STOP,
        FaultKind.ZK_RESTART,
    }
    assert set(counts["faults"]) == every_kind, f"faults injected: {counts['faults']}"
    assert not counts["fault_errors"], counts["fault_errors"]
    assert counts["jobs"] > 300 and counts["cron_occurrences"] >= 90, report.text()
    assert counts["drained"], report.text()
    assert {k: counts[k] for k in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, 0), report.text()
    # Every nominal cron occurrence has an occurrence ledger entry that agrees with its job.
    assert counts["ledger_coverage"] == 1.0, report.text()
