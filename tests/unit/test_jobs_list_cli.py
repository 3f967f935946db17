"""``timeshard jobs list`` and ``timeshard jobs cancel --type`` against an embedded server: the
filters, the order, the header, the count and the line when the limit cut the list, "no jobs
match", and a bulk cancel that counts first and cancels only with --yes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from tests.unit.helpers import embedded_server
from timeshard.cli.main import main
from timeshard.console import Exit
from timeshard.model import JobState
from timeshard.node import JobSpec
from timeshard.observe import logs
from timeshard.server import Server

MIN_MS = 60_000
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\S+ (DEBUG|INFO|WARNING) ")
"""The embedded server's log lines, which share stderr with the command in this process."""


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def rows(self) -> list[list[str]]:
        """The table's lines under its header, split into columns."""
        lines = self.out.splitlines()
        assert lines[0].split() == ["JOB_ID", "TYPE", "STATE", "ATTEMPT", "RUN_AT", "KEY"]
        return [line.split() for line in lines[1:]]

    @property
    def keys(self) -> list[str]:
        return [row[5] for row in self.rows]


@dataclass
class Cli:
    server: Server
    capsys: pytest.CaptureFixture[str]

    async def __call__(self, *argv: str) -> Run:
        code = await asyncio.to_thread(main, ["--server", self.server.address, *argv])
        out = self.capsys.readouterr()
        said = [line for line in out.err.splitlines(keepends=True) if not LOG_LINE.match(line)]
        return Run(int(code), out.out, "".join(said))

    async def job(self, job_type: str, minutes: int, key: str = "", job_id: str = "") -> str:
        node = self.server.node
        job, _ = await node.jobs.schedule(
            JobSpec(
                job_type=job_type,
                payload=b"{}",
                run_at=node.clock.now_ms() + minutes * MIN_MS,
                idempotency_key=key,
                job_id=job_id,
            )
        )
        return job.job_id


@asynccontextmanager
async def cli_on(capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Cli]:
    logs.configure("text")  # (the root logger may point at a stream an earlier test closed)
    async with embedded_server() as server:
        yield Cli(server, capsys)


async def test_jobs_list_prints_a_header_its_jobs_by_due_time_and_a_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with cli_on(capsys) as cli:
        made = {}
        for key, job_type, minutes in [
            ("order-3:mail", "mail", 30),
            ("order-1:mail", "mail", 10),
            ("order-1:sms", "sms", 20),
            ("order-2:mail", "mail", 40),
            ("audit-1", "audit", 50),
        ]:
            made[key] = await cli.server.node.jobs.get(await cli.job(job_type, minutes, key))
        listed = await cli("jobs", "list")
        assert listed.code == Exit.OK
        by_due = ["order-1:mail", "order-1:sms", "order-3:mail", "order-2:mail", "audit-1"]
        assert listed.keys == by_due
        assert listed.rows[0][1:4] == ["mail", "scheduled", "0/3"]
        assert listed.err.strip() == "5 jobs (by due time)"

        cut = await cli("jobs", "list", "--limit", "2")
        assert cut.keys == by_due[:2]
        assert cut.err.strip() == (
            "2 of 5 jobs shown (by due time); more match: --limit N or --all lists more"
        )
        exact = await cli("jobs", "list", "--limit", "5")
        assert exact.keys == by_due and "more" not in exact.err
        every = await cli("jobs", "list", "--all", "--sort", "created")
        assert every.keys == sorted(made, key=lambda k: (made[k].created_at, made[k].job_id))
        assert every.err.strip() == "5 jobs (by creation time)"

        assert (await cli("jobs", "list", "--type", "mail")).keys == [
            "order-1:mail",
            "order-3:mail",
            "order-2:mail",
        ]
        assert (await cli("jobs", "list", "--key", "order-1:sms")).keys == ["order-1:sms"]
        prefix = await cli("jobs", "list", "--key-prefix", "order-1:")
        assert prefix.keys == ["order-1:mail", "order-1:sms"]
        window = await cli("jobs", "list", "--from", "now+15m", "--to", "now+45m")
        assert window.keys == ["order-1:sms", "order-3:mail", "order-2:mail"]

        as_json = await cli("jobs", "list", "--type", "sms", "--json")
        assert [j["idempotency_key"] for j in json.loads(as_json.out)] == ["order-1:sms"]
        assert as_json.err.strip() == "1 job (by due time)"


async def test_no_jobs_match_is_said_on_stderr_and_is_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with cli_on(capsys) as cli:
        await cli.job("mail", 10)
        none = await cli("jobs", "list", "--type", "sms")
        assert (none.code, none.out, none.err.strip()) == (Exit.OK, "", "no jobs match")
        empty = await cli("jobs", "list", "--state", "dead", "--json")
        assert (empty.code, json.loads(empty.out), empty.err.strip()) == (
            Exit.OK,
            [],
            "no jobs match",
        )


async def test_jobs_list_finds_a_schedules_runs_and_jobs_in_several_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with cli_on(capsys) as cli:
        runs = [await cli.job("report", m, job_id=f"nightly@{m}") for m in (1, 2)]
        await cli.job("report", 3, job_id="nightly-2@3")
        mail = await cli.job("mail", 4, key="m")
        await cli.server.node.jobs.cancel(mail)
        found = await cli("jobs", "list", "--schedule", "nightly")
        assert [row[0] for row in found.rows] == runs
        both = await cli("jobs", "list", "--state", "cancelled", "--state", "scheduled")
        assert len(both.rows) == 4
        assert [row[2] for row in (await cli("jobs", "list", "--state", "cancelled")).rows] == [
            "cancelled"
        ]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--from", "now+2h", "--to", "now+1h"], "--to: "),
        (["--from", "yesterday"], "--from: "),
        (["--to", "now+soon"], "--to: "),
        (["--schedule", "no/such id"], "schedule_id: "),
        (["--type", "bad type"], "type: "),
    ],
)
async def test_a_bad_filter_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    async with cli_on(capsys) as cli:
        bad = await cli("jobs", "list", *argv)
        assert bad.code == Exit.USAGE
        assert bad.err.startswith(f"error (INVALID_ARGUMENT): {said}"), bad.err


async def test_bulk_cancel_counts_first_and_cancels_only_with_yes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with cli_on(capsys) as cli:
        mail = [await cli.job("mail", m, key=f"order-{m}") for m in range(1, 6)]
        other = await cli.job("sms", 1)
        node = cli.server.node

        dry = await cli("jobs", "cancel", "--type", "mail", "--to", "now+3m30s")
        assert dry.code == Exit.OK
        assert dry.out.startswith("3 jobs would be cancelled: type mail, state scheduled or ")
        assert "nothing was cancelled (a dry run)" in dry.err and "--yes" in dry.err
        states = {j: (await node.jobs.get(j)).state for j in [*mail, other]}
        assert set(states.values()) == {JobState.SCHEDULED}

        done = await cli("jobs", "cancel", "--type", "mail", "--to", "now+3m30s", "--yes")
        assert done.code == Exit.OK
        assert done.out.startswith("cancelled 3 jobs of 3 matching: type mail")
        after = [(await node.jobs.get(j)).state for j in mail]
        assert after == [JobState.CANCELLED] * 3 + [JobState.SCHEDULED] * 2
        assert (await node.jobs.get(other)).state is JobState.SCHEDULED

        rest = await cli("jobs", "cancel", "--type", "mail", "--yes", "--json")
        assert json.loads(rest.out) == {
            "matched": 2,
            "dry_run": False,
            "cancelled": mail[3:],
            "finished_meanwhile": [],
        }
        none = await cli("jobs", "cancel", "--type", "mail", "--json")
        assert json.loads(none.out)["matched"] == 0
        assert none.code == Exit.OK and none.err.startswith("no jobs match: type mail")


async def test_bulk_cancel_needs_a_type_and_no_job_id(capsys: pytest.CaptureFixture[str]) -> None:
    async with cli_on(capsys) as cli:
        job_id = await cli.job("mail", 5)
        no_type = await cli("jobs", "cancel", "--key-prefix", "order-")
        assert no_type.code == Exit.USAGE and "--type" in no_type.err
        both = await cli("jobs", "cancel", job_id, "--type", "mail")
        assert both.code == Exit.USAGE and "not both" in both.err
        assert (await cli.server.node.jobs.get(job_id)).state is JobState.SCHEDULED
        with pytest.raises(SystemExit) as usage:  # only cancellable states are choices
            main(["jobs", "cancel", "--type", "mail", "--state", "dead"])
        assert usage.value.code == Exit.USAGE
        capsys.readouterr()
        one = await cli("jobs", "cancel", job_id)
        assert one.code == Exit.OK and "cancelled" in one.out


async def test_bulk_cancel_takes_running_jobs_and_counts_those_finished_meanwhile(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a bulk cancel takes every job it can cancel, running ones too; a job that
    finished between the listing and its cancel is counted apart, not an error."""
    from timeshard.client.proto import ProtoClient

    async with cli_on(capsys) as cli:
        node = cli.server.node
        jobs = [await cli.job("mail", 0) for _ in range(3)]
        [claim] = await node.claims.claim(worker="w", types=["mail"], limit=1, wait_s=5, lease_s=60)
        assert claim.job.state is JobState.RUNNING
        listed = ProtoClient.list_jobs_page

        def raced(self: ProtoClient, request: object) -> object:
            page = listed(self, request)  # type: ignore[arg-type]
            if page.jobs and request.page_size > 1:  # type: ignore[attr-defined]
                self.cancel(page.jobs[-1].job_id)  # someone else was quicker
            return page

        monkeypatch.setattr(ProtoClient, "list_jobs_page", raced)
        done = await cli("jobs", "cancel", "--type", "mail", "--yes", "--json")
        report = json.loads(done.out)
        assert done.code == Exit.OK
        assert report["matched"] == 3 and len(report["finished_meanwhile"]) == 1
        assert sorted(report["cancelled"] + report["finished_meanwhile"]) == sorted(jobs)
        assert claim.job.job_id in report["cancelled"] + report["finished_meanwhile"]
        assert {(await node.jobs.get(j)).state for j in jobs} == {JobState.CANCELLED}
