"""The console of one node of a two-node cluster on real Cassandra and ZooKeeper: it lists both
nodes and their shards, sums both nodes' live numbers (asked over gRPC, ``PeerService.Live``),
lists the workers connected to the other node, finds a job scheduled through the other node, a
type paused and rate-limited through it holds on the other node within 2 s (its refresh of the
stored settings), and the action is in the audit the other node reads from the store."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from timeshard.clock import SystemClock
from timeshard.coordinator.zookeeper import ZooKeeperCoordinator
from timeshard.node import JobSpec, Node
from timeshard.server import Server
from timeshard.store.cassandra import CassandraStore
from timeshard.views.console.app import ConsoleSettings, build
from timeshard.views.console.audit import AuditLog

pytestmark = pytest.mark.timeout(300)

SHARDS = 8
TYPE = "it.console"


async def wait_for(pred: Any, timeout: float, what: str) -> float:
    """Seconds until ``pred()`` held."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not pred():
        if loop.time() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)
    return loop.time() - started


async def test_one_nodes_console_sees_and_steers_the_cluster(
    cassandra_address: str, keyspace: str, zookeeper_hosts: str
) -> None:
    url = f"cassandra://{cassandra_address}/{keyspace}"
    zk = f"zookeeper://{zookeeper_hosts}/timeshard-console/{uuid.uuid4().hex[:8]}"
    a, b = (
        Node(
            store=CassandraStore.from_url(url, num_shards=SHARDS),
            coordinator=ZooKeeperCoordinator.from_url(zk),
            clock=SystemClock(),
            node_id=name,
        )
        for name in ("node-a", "node-b")
    )
    server_a, server_b = Server(a, port=0), Server(b, port=0)
    mount, parts = build(a, ConsoleSettings(peers=server_a.live_asker))
    transport = httpx.ASGITransport(app=Starlette(routes=[mount]))
    try:
        await server_a.start()
        await server_b.start()
        await wait_for(
            lambda: (
                len(a.dispatching) + len(b.dispatching) == SHARDS
                and len(a.dispatching) > 0
                and len(b.dispatching) > 0
            ),
            60,
            "both nodes to own shards",
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://a") as client:
            page = (await client.get("/console/")).text
            rows = dict(
                re.findall(r"<th scope=\"row\">(node-[ab])[^<]*(?:<span[^>]*>[^<]*</span>)?"
                           r"</th><td>[^<]*</td><td>(\d+)</td>", page)
            )  # fmt: skip
            assert set(rows) == {"node-a", "node-b"}, page
            assert sum(map(int, rows.values())) == SHARDS

            job, _ = await b.jobs.schedule(
                JobSpec(job_type=TYPE, payload=b"{}", run_at=b.clock.now_ms() + 3_600_000)
            )
            found = await client.get(f"/console/jobs?type={TYPE}")
            assert "<b>1</b> job match" in found.text and job.job_id[:12] in found.text

            # Live: b's counters on a's console (b scheduled the job), b's worker listed.
            b.workers.claimed("w-it", [TYPE], 2)
            workers = (await client.get("/console/workers")).text
            row = workers.split('data-worker="w-it"')[1].split("</tr>")[0]
            assert "<td>node-b</td>" in row and f"{TYPE} (2)" in row, row
            sample = await parts.sampler.refresh()
            assert [(n.node_id, n.error) for n in sample.nodes] == [
                ("node-a", ""),
                ("node-b", ""),
            ]
            assert sum(n.owned for n in sample.nodes) == SHARDS
            (it,) = [t for t in sample.types if t.job_type == TYPE]
            assert it.totals["scheduled"] == 1

            types_page = (await client.get("/console/types")).text
            csrf = re.search(r'name="csrf" value="([^"]+)"', types_page)
            assert csrf
            r = await client.post(
                "/console/types", data={"csrf": csrf.group(1), "what": "pause", "job_type": TYPE}
            )
            assert r.status_code == 303
            assert a.flow.held(TYPE) == "paused"  # the node called: at once
            took = await wait_for(lambda: b.flow.held(TYPE) == "paused", 5, "b to pause")
            assert took <= 2.5, f"the pause reached the other node after {took:.1f} s"

            r = await client.post(
                f"/console/types/{TYPE}",
                data={"csrf": csrf.group(1), "what": "limits", "rate": "7", "burst": "3"},
            )
            assert r.status_code == 303

            def b_rate() -> bool:
                flow = b.type_policies.flows().get(TYPE)
                return flow is not None and flow.rate == 7 and flow.burst == 3

            took = await wait_for(b_rate, 5, "b to take the rate")
            assert took <= 2.5, f"the rate reached the other node after {took:.1f} s"

            audit = await AuditLog(b.store, b.clock).read()  # the other node, from the store
            assert [(e.action, e.target, e.node) for e in audit[:2]] == [
                ("type-limits", TYPE, "node-a"),
                ("type-pause", TYPE, "node-a"),
            ]
    finally:
        parts.stop()
        await server_b.stop(0)
        await server_a.stop(0)
