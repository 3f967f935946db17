"""The console's schedule page shows the schedule's occurrence ledger: the latest decisions,
skips included, with their reason, job, deciding node and epoch, and why in words (the rows
`timeshard why` reads)."""

from __future__ import annotations

from pathlib import Path

import httpx
from starlette.applications import Starlette

from tests.unit.helpers import advance, running
from tests.unit.test_schedules import occ, sched
from timeshard.testing.waits import wait_until
from timeshard.views.console.app import ConsoleSettings, build


async def test_the_schedule_page_lists_the_ledger_with_skips_and_why(tmp_path: Path) -> None:
    async with running(tmp_path / "s.db") as (node, clock):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards")
        mount, parts = build(node, ConsoleSettings(audit_path=tmp_path / "audit.jsonl"))
        transport = httpx.ASGITransport(app=Starlette(routes=[mount]))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            await node.schedules.create(sched())
            await advance(node, clock, 60, step=5)
            await node.claims.claim(worker="w", types=["cron.t"], limit=1, wait_s=0, lease_s=600)
            await advance(node, clock, 60, step=5)  # minute 1 still running: minute 2 skipped
            page = await client.get("/console/schedules/s1")
            assert page.status_code == 200
            table = page.text.split('id="ledger"', 1)[1].split("</table>", 1)[0]
            assert 'class="ledger-created"' in table and occ(1) in table
            assert 'class="ledger-skipped_overlap"' in table
            assert "skipped: the previous run was still going" in table
            assert "1 earlier run(s) still going" in table and "test-node (epoch" in table
        parts.stop()
