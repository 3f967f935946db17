"""``timeshard status`` against a real node: the NodeStatus RPC and the merged summary."""

from __future__ import annotations

import asyncio
import json

import pytest

from timeshard.cli.main import main
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import JobSpec, Node
from timeshard.security.auth import Role, required_role
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until


async def test_status_summarises_the_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        node_id="node-a",
    )
    server = Server(node, port=0)
    await server.start()
    try:
        now = node.clock.now_ms()
        for _ in range(4):
            await node.jobs.schedule(JobSpec(job_type="report", payload=b"", run_at=now - 200))
        await wait_until(lambda: node.ready.count() == 4, what="jobs ready")
        claimed = await node.claims.claim(
            worker="w", types=["report"], limit=4, wait_s=0, lease_s=30
        )
        await node.attempts.fail(claimed[0].job.job_id, claimed[0].job.fence, "no <printer>", True)
        for c in claimed[1:]:
            await node.attempts.complete(c.job.job_id, c.job.fence)
        await server.health_watcher.count_dead_letters(force=True)
        await node.jobs.schedule(JobSpec(job_type="reprot", payload=b"", run_at=now - 90_000))
        await wait_until(lambda: node.ready.count() == 1, what="the misspelt job ready")

        code = await asyncio.to_thread(main, ["--server", server.address, "status", "--json"])
        st = json.loads(capsys.readouterr().out)
        assert code == 0
        assert st["num_shards"] == 4 and st["shards_without_owner"] == []
        (n,) = st["nodes"]
        assert n["node_id"] == "node-a" and n["serving"] and n["shards"] == 4
        assert st["dead_letters"]["count"] == 1 and st["dead_letters"]["counted_by"] == "node-a"
        assert st["lateness"]["count"] == 4
        assert 200 <= st["lateness"]["p50_ms"] <= st["lateness"]["max_ms"] < 10_000
        (failure,) = st["recent_failures"]
        assert failure["job_id"] == claimed[0].job.job_id and failure["kind"] == "dead"
        assert failure["error"] == "no <printer>"
        (waiting,) = [t for t in st["unclaimed"] if t["jobs"]]
        assert waiting["type"] == "reprot" and waiting["jobs"] == 1
        assert 90_000 <= waiting["oldest_age_ms"] < 120_000

        code = await asyncio.to_thread(main, ["--server", server.address, "status"])
        text = capsys.readouterr().out
        assert code == 0
        assert "1 node(s), 4 shards, 0 without an owner" in text
        assert "dead letters: 1 (counted" in text and "(4 claims)" in text
        assert "node-a" in text and "SERVING" in text and "no <printer>" in text
        assert "due jobs nobody has claimed" in text
        assert "  reprot: 1 waiting, oldest due 9" in text and "<- check" in text
    finally:
        await server.stop(0)


def test_node_status_needs_the_admin_role() -> None:
    assert required_role("/timeshard.v1.AdminService/NodeStatus") is Role.ADMIN
