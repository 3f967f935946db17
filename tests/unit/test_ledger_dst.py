"""Daylight saving in the occurrence ledger and in ``why`` (embedded store, fake clock): a
local time a gap skips (``dst_gap=skip``) or a fold's second pass (``dst_fold=first``) gets a
row naming the rule, decided with the schedule's next run; ``why`` asked for a local time in a
gap or a fold names the clocks' change, the rule and what became of each instant; the rule's
skips are counted by reason but are no skipped runs (no alert)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import grpc
import httpx
import pytest
from starlette.applications import Starlette

from tests.unit.helpers import advance, embedded_server, running
from tests.unit.test_grpc_api import serving, status_of
from tests.unit.test_ledger import ledger
from tests.unit.test_schedules import sched
from timeshard.api.explain import ledger_to_pb
from timeshard.cli.main import main
from timeshard.cli.why import entry_line
from timeshard.clock import FakeClock, format_rfc3339
from timeshard.console import when
from timeshard.errors import NotFound
from timeshard.ledger import Reason
from timeshard.model import MisfirePolicy, OverlapPolicy
from timeshard.node import Node
from timeshard.node.why import row_words
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.console.app import ConsoleSettings, build
from timeshard.wire import ts


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


BERLIN_SPRING = ms(2027, 3, 28, 1)  # 02:00 CET -> 03:00 CEST
NY_AUTUMN = ms(2027, 11, 7, 6)  # 02:00 EDT -> 01:00 EST
GAP_WALL = datetime(2027, 3, 28, 2, 30)
FOLD_WALL = datetime(2027, 11, 7, 1, 30)


def decided(node: Node, reason: str) -> float | None:
    return node.metrics.registry.get_sample_value(
        "timeshard_schedule_occurrences_total", {"reason": reason}
    )


async def test_a_gap_skipped_time_gets_a_row_with_the_rule_and_why_names_it() -> None:
    async with running(clock=FakeClock(ms(2027, 3, 27, 23))) as (node, clock):
        await node.schedules.create(
            sched(cron="30 2 * * *", timezone="Europe/Berlin", dst_gap="skip")
        )
        early = await node.explain.local("s1", GAP_WALL)  # asked before its next run
        assert early.found and early.row is None
        assert (
            "not in the ledger yet: recorded with the schedule's first run after it"
            in (early.steps[-1])
        )
        await advance(node, clock, 26 * 3600, step=600)  # to 2027-03-29T01:00Z
        rows = await ledger(node)
        assert [(r.nominal, r.reason) for r in rows] == [
            (BERLIN_SPRING - 1, Reason.SKIPPED_DST_GAP),
            (ms(2027, 3, 29, 0, 30), Reason.CREATED),  # 02:30 CEST the next day
        ]
        gap = rows[0]
        assert gap.job_id == "" and gap.count == 1 and gap.decided_at >= ms(2027, 3, 29, 0, 30)
        assert gap.notes == (
            "02:30 local did not exist on 2027-03-28 in Europe/Berlin (clocks went 02:00 -> "
            "03:00); rule dst_gap=skip: no run",
        )
        e = await node.explain.local("s1", GAP_WALL)
        assert e.found and e.row == gap and e.nominal == BERLIN_SPRING - 1
        assert e.nominal_local == "2027-03-28T02:30:00"
        assert e.steps[1] == gap.notes[0]
        assert "by node test-node" in e.steps[2] and "DST gap, dst_gap=skip" in e.steps[2]
        assert len(e.steps) == 3  # (the rule's words once)
        assert decided(node, "skipped_dst_gap") == 1
        assert (
            node.metrics.registry.get_sample_value(
                "timeshard_schedule_occurrences_skipped_total",
                {"schedule": "s1", "reason": "skipped_dst_gap"},
            )
            is None
        )  # never due: not a skipped run, no alert


async def test_an_outage_across_a_gap_has_its_misses_and_the_rules_skip_apart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    every_quarter = sched(
        cron="*/15 * * * *",  # default for '*': skip the gap (02:00-02:45 CET never exist)
        timezone="Europe/Berlin",
        misfire=MisfirePolicy.ONCE,
        misfire_grace_ms=30_000,
        overlap=OverlapPolicy.ALLOW,  # (no worker here: the runs stay unfinished)
        max_concurrent=5,
    )
    async with running(path, clock=FakeClock(ms(2027, 3, 28, 0, 5))) as (node, clock):
        await node.schedules.create(every_quarter)
        await advance(node, clock, 11 * 60, step=30)  # 00:15Z runs
    clock.advance(94 * 60)  # down until 01:50Z, across the gap
    async with running(path, clock=clock) as (node, clock):
        await advance(node, clock, 2, step=1)
        # the restart's catch-up is the node's own work: a loaded machine may take a while
        rows = await wait_until(
            lambda: ledger(node), 30, "the catch-up", until=lambda r: len(r) >= 4
        )
        assert [(r.nominal, r.end, r.count, r.reason) for r in rows] == [
            (ms(2027, 3, 28, 0, 15), ms(2027, 3, 28, 0, 15), 1, Reason.CREATED),
            (ms(2027, 3, 28, 0, 30), ms(2027, 3, 28, 1, 30), 5, Reason.MISSED_SKIPPED),
            (BERLIN_SPRING - 1, BERLIN_SPRING - 1, 4, Reason.SKIPPED_DST_GAP),
            (ms(2027, 3, 28, 1, 45), ms(2027, 3, 28, 1, 45), 1, Reason.CAUGHT_UP),
        ]
        assert "02:00 to 02:45 (4 times) local did not exist" in rows[2].notes[0]
        # Shown as the one instant they are recorded at and a count, a real span as a span.
        gap_at, missed_from = (
            format_rfc3339(BERLIN_SPRING - 1),
            format_rfc3339(ms(2027, 3, 28, 0, 30)),
        )
        assert f"one of 4 occurrences at {gap_at}, all no run" in row_words(rows[2])[0]
        assert f"one of 5 occurrences from {missed_from} to " in row_words(rows[1])[0]
        assert entry_line(ledger_to_pb(rows[2])).startswith(f"  {when(BERLIN_SPRING - 1)} (4)  ")
        assert " .. " in entry_line(ledger_to_pb(rows[1]))
        mount, parts = build(node, ConsoleSettings(audit_path=tmp_path / "audit.jsonl"))
        transport = httpx.ASGITransport(app=Starlette(routes=[mount]))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            page = (await client.get("/console/schedules/s1")).text
        parts.stop()
        cells = {
            row.split('"', 1)[0]: row.split("<td", 2)[1]
            for row in page.split('<tr class="ledger-')[1:]
        }
        assert "(4)" in cells["skipped_dst_gap"] and "&ndash;" not in cells["skipped_dst_gap"]
        assert "(5)" in cells["missed_skipped"] and "&ndash;" in cells["missed_skipped"]
        assert (await node.schedules.get("s1")).skipped == 5  # the rule's are not counted
        e = await node.explain.local("s1", GAP_WALL)  # inside the missed run: the rule's row
        assert e.found and e.row == rows[2]
        missed = await node.explain.occurrence("s1", BERLIN_SPRING)  # 03:00 CEST
        assert missed.row == rows[1]
        off = await node.explain.local("s1", datetime(2027, 3, 28, 2, 20))
        assert not off.found and "(in a DST gap: clocks went 02:00 -> 03:00)" in off.steps[-1]


async def test_a_gap_shifted_time_says_it_ran_at_the_end_of_the_gap_with_its_job() -> None:
    async with running(clock=FakeClock(ms(2027, 3, 27, 23))) as (node, clock):
        await node.schedules.create(sched(cron="30 2 * * *", timezone="Europe/Berlin"))
        await advance(node, clock, 3 * 3600, step=600)
        (row,) = await ledger(node)
        assert row.reason is Reason.CREATED and row.nominal == BERLIN_SPRING  # 03:00 CEST
        e = await node.explain.local("s1", GAP_WALL)
        assert e.found and e.row == row and e.job is not None and e.job.job_id == row.job_id
        words = "\n".join(e.steps)
        assert "02:30 local did not exist on 2027-03-28" in words
        assert "rule dst_gap=shift: its run is at 03:00 local instead" in words
        assert f"created its job: job {row.job_id}" in words
        assert decided(node, "skipped_dst_gap") is None


async def test_a_folds_second_pass_gets_a_row_and_why_tells_both_instants() -> None:
    async with running(clock=FakeClock(ms(2027, 11, 7, 4))) as (node, clock):
        await node.schedules.create(
            sched(
                cron="30 1 * * *",
                timezone="America/New_York",
                overlap=OverlapPolicy.ALLOW,  # (no worker here: the runs stay unfinished)
                max_concurrent=5,
            )
        )
        await advance(node, clock, 27 * 3600, step=600)  # to 2027-11-08T07:00Z
        rows = await ledger(node)
        first, second = ms(2027, 11, 7, 5, 30), ms(2027, 11, 7, 6, 30)
        assert [(r.nominal, r.reason) for r in rows] == [
            (first, Reason.CREATED),  # 01:30 EDT
            (second, Reason.SKIPPED_DST_FOLD),  # 01:30 EST: the rule's, no run
            (ms(2027, 11, 8, 6, 30), Reason.CREATED),  # the next day's, which decided it
        ]
        assert rows[1].decided_at == rows[2].decided_at and rows[1].job_id == ""
        e = await node.explain.local("s1", FOLD_WALL)
        assert e.found and e.nominal == first and e.row == rows[0] and e.job is not None
        words = list(e.steps)
        assert words[1] == (
            "01:30 local happened twice on 2027-11-07 in America/New_York (clocks went 02:00 -> "
            "01:00): at 2027-11-07T05:30:00Z and at 2027-11-07T06:30:00Z; rule dst_fold=first: a "
            "run at the first only, none at the second"
        )
        at_first = words.index("the first, at 2027-11-07T05:30:00Z (2027-11-07T01:30:00-04:00):")
        at_second = words.index("the second, at 2027-11-07T06:30:00Z (2027-11-07T01:30:00-05:00):")
        assert any("created its job" in w for w in words[at_first:at_second])
        assert any("no run at the second pass" in w for w in words[at_second:])
        exact = await node.explain.occurrence("s1", second)  # the instant, with its offset
        assert exact.found and exact.row == rows[1]
        assert decided(node, "skipped_dst_fold") == 1


async def test_a_fold_with_both_runs_tells_each_run() -> None:
    async with running(clock=FakeClock(ms(2027, 11, 7, 4))) as (node, clock):
        await node.schedules.create(
            sched(
                cron="30 1 * * *",
                timezone="America/New_York",
                dst_fold="both",
                overlap=OverlapPolicy.ALLOW,
                max_concurrent=2,
            )
        )
        await advance(node, clock, 3 * 3600, step=600)
        e = await node.explain.local("s1", FOLD_WALL)
        words = "\n".join(e.steps)
        assert "rule dst_fold=both: a run at each" in words
        assert words.count("created its job") == 2
        assert decided(node, "skipped_dst_fold") is None


async def test_a_gap_time_that_is_no_occurrence_says_so_with_the_nearest() -> None:
    async with running(clock=FakeClock(ms(2027, 3, 27, 23))) as (node, _):
        await node.schedules.create(sched(cron="0 3 * * *", timezone="Europe/Berlin"))
        e = await node.explain.local("s1", GAP_WALL)
        assert not e.found and e.row is None
        assert e.steps[-1].startswith(
            "2027-03-28T02:30:00 local (in a DST gap: clocks went 02:00 -> 03:00) is no "
            "occurrence of it; nearest: "
        )
        assert BERLIN_SPRING in e.nearest  # 03:00 CEST, the first after it
        with pytest.raises(NotFound, match="nosuch"):
            await node.explain.local("nosuch", GAP_WALL)


async def test_at_local_is_checked_over_grpc() -> None:
    async with serving() as ch:
        jobs = pb_grpc.JobServiceStub(ch)
        wall = "2027-03-28T02:30"
        req = pb.ExplainOccurrenceRequest
        for request, said in (
            (req(schedule_id="s", at_local="yesterday"), "not a local"),
            (req(schedule_id="s", at_local=wall + "+01:00"), "offset"),
            (req(schedule_id="s", at=ts(1), at_local=wall), "not both"),
            (req(job_id="j", at_local=wall), "not both"),
            (req(schedule_id="s", at_local="x" * 65), "over the limit"),
            (req(schedule_id="s", at_local="1970-01-01T00:00"), "1971-9998"),
        ):
            code, msg = await status_of(jobs.ExplainOccurrence(request))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and said in msg, (request, msg)
        code, msg = await status_of(
            jobs.ExplainOccurrence(pb.ExplainOccurrenceRequest(schedule_id="nosuch", at_local=wall))
        )
        assert code is grpc.StatusCode.NOT_FOUND and "nosuch" in msg


async def test_why_at_a_gap_and_a_fold_time_in_text_and_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with embedded_server() as server:
        node = server.node
        await node.schedules.create(
            sched("gap", cron="30 2 * * *", timezone="Europe/Berlin", dst_gap="skip")
        )
        await node.schedules.create(sched("fold", cron="30 1 * * *", timezone="America/New_York"))
        address = ["--server", server.address]

        code = await asyncio.to_thread(main, [*address, "why", "gap", "2027-03-28T02:30"])
        text = capsys.readouterr().out
        assert code == 0
        assert (
            "2. 02:30 local did not exist on 2027-03-28 in Europe/Berlin (clocks went 02:00 -> "
            "03:00); rule dst_gap=skip: no run" in text
        )
        code = await asyncio.to_thread(main, [*address, "why", "gap", "2027-03-28T02:30", "--json"])
        got = json.loads(capsys.readouterr().out)
        assert code == 0 and got["found"] and got["entry"] is None
        assert got["nominal"] == "2027-03-28T00:59:59.999Z"
        assert got["nominal_local"] == "2027-03-28T02:30:00"
        assert any("rule dst_gap=skip: no run" in s for s in got["steps"])

        argv = [*address, "why", "fold", "2027-11-07T01:30", "--json"]
        code = await asyncio.to_thread(main, argv)
        got = json.loads(capsys.readouterr().out)
        assert code == 0 and got["found"] and got["nominal"] == "2027-11-07T05:30:00Z"
        assert any("rule dst_fold=first: a run at the first only" in s for s in got["steps"])
        assert any(s.startswith("the second, at 2027-11-07T06:30:00Z") for s in got["steps"])

        code = await asyncio.to_thread(main, [*address, "why", "fold", "2027-11-07T01:31"])
        out = capsys.readouterr().out
        assert code == 3 and "(in a DST fold: clocks went 02:00 -> 01:00) is no occurrence" in out
