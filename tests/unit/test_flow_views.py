"""What a held type looks like from outside: /metrics counts its held jobs by reason (paused, or
no rate token left) and shows the pause and the rate; the status page and its JSON mark the
waiting jobs with why they are held."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.helpers import START_MS, advance, running
from timeshard.node import Node
from timeshard.node.flow import FlowChange
from timeshard.views.metrics import node_registry
from timeshard.views.page import render
from timeshard.views.status import node_status


def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(node_registry(node)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_held_jobs_show_by_reason_on_metrics_and_the_status_page() -> None:
    async with running() as (node, clock):
        await node.type_policies.set_flows(
            [
                FlowChange(job_type="invoice.send", paused=True),
                FlowChange(job_type="email.send", rate=1, burst=1),
            ]
        )
        for job_type, n in (("invoice.send", 3), ("email.send", 4)):
            for _ in range(n):
                await node.schedule(job_type=job_type, payload=b"", run_at=START_MS + 500)
        await advance(node, clock, 1)
        claim = {"worker": "w", "types": ["email.send"], "limit": 10, "wait_s": 0, "lease_s": 60}
        assert await node.claim(**claim) == []  # type: ignore[arg-type]  # the bucket starts empty
        await advance(node, clock, 2)
        got = await node.claim(**claim)  # type: ignore[arg-type]
        assert len(got) == 1  # the one token; the other three are held by the rate
        m = scrape(node)
        held = "timeshard_type_held_jobs"
        assert m[(held, (("reason", "paused"), ("type", "invoice.send")))] == 3
        assert m[(held, (("reason", "rate"), ("type", "invoice.send")))] == 0
        assert m[(held, (("reason", "rate"), ("type", "email.send")))] == 3
        assert m[("timeshard_type_paused", (("type", "invoice.send"),))] == 1
        assert m[("timeshard_type_paused", (("type", "email.send"),))] == 0
        assert m[("timeshard_type_rate_limit", (("type", "email.send"),))] == 1.0
        status = await node_status(node)
        rows = {w.job_type: w for w in status.unclaimed}
        assert rows["invoice.send"].held == "paused" and rows["email.send"].held == "rate"
        page = render(status)
        assert "held by rate" in page and "paused" in page
        assert status.as_json()["unclaimed"][0]["held"] in ("paused", "rate")
