"""What a held type looks like from outside: /metrics counts its held jobs by reason (paused, or
no rate token left) and shows the pause and the rate; the status page and its JSON mark the
waiting jobs with why they are held."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.helpers import START_MS, advance, running
from timeshard.node import JobSpec, Node
from timeshard.node.flow import FlowChange
from timeshard.views.metrics import node_registry
from timeshard.views.page import render
from timeshard.views.status import node_status

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
PAUSED_SUMMARY = "Type invoice.send has been paused for over an hour with jobs waiting"
PAUSED_DESCRIPTION = (
    "invoice.send is paused and its due jobs are held. Resume it with "
    "`timeshard types resume invoice.send` once its downstream is back."
)
RATE_DESCRIPTION = (
    "Due jobs of email.send are held by the type's rate "
    '(timeshard_type_held_jobs{reason="rate"}). Raise the rate '
    "(`timeshard types set email.send --rate N`) if the downstream allows it."
)


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
                await node.jobs.schedule(
                    JobSpec(job_type=job_type, payload=b"", run_at=START_MS + 500)
                )
        await advance(node, clock, 1)
        claim = {"worker": "w", "types": ["email.send"], "limit": 10, "wait_s": 0, "lease_s": 60}
        # The bucket starts empty.
        assert await node.claims.claim(**claim) == []  # type: ignore[arg-type]
        await advance(node, clock, 2)
        got = await node.claims.claim(**claim)  # type: ignore[arg-type]
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


def test_the_paused_and_rate_alerts_fire_on_held_jobs(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (apt-get install prometheus): alerts not evaluated")
    test = tmp_path / "flow_test.yml"
    test.write_text(
        textwrap.dedent(
            f"""\
            rule_files: [{ALERTS}]
            evaluation_interval: 1m
            tests:
              - interval: 1m
                input_series:
                  - series: 'timeshard_type_paused{{type="invoice.send"}}'
                    values: '1x90'
                  - series: 'timeshard_type_held_jobs{{type="invoice.send",reason="paused"}}'
                    values: '5x90'
                  - series: 'timeshard_type_paused{{type="email.send"}}'
                    values: '0x90'
                  - series: 'timeshard_type_held_jobs{{type="email.send",reason="rate"}}'
                    values: '40x90'
                  - series: 'timeshard_type_oldest_unclaimed_age_seconds{{type="email.send"}}'
                    values: '0+60x90'
                alert_rule_test:
                  - {{eval_time: 30m, alertname: TimeshardTypePaused}}
                  - eval_time: 70m
                    alertname: TimeshardTypePaused
                    exp_alerts:
                      - exp_labels: {{severity: info, type: invoice.send}}
                        exp_annotations:
                          summary: {json.dumps(PAUSED_SUMMARY)}
                          description: {json.dumps(PAUSED_DESCRIPTION)}
                  - {{eval_time: 20m, alertname: TimeshardTypeHeldByRate}}
                  - eval_time: 40m
                    alertname: TimeshardTypeHeldByRate
                    exp_alerts:
                      - exp_labels: {{severity: info, type: email.send}}
                        exp_annotations:
                          summary: "Jobs of type email.send wait over 15 min for their rate"
                          description: {json.dumps(RATE_DESCRIPTION)}
            """
        )
    )
    result = subprocess.run(
        ["promtool", "test", "rules", str(test)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
