"""A repeat of an idempotency key returns the job the key names, ``created=False``, in whatever
state it is. The client gives programs that flag; the CLI says what happened and fails when the
job will not run (cancelled, dead), so nobody is told "scheduled" for a job that never runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.unit.helpers import embedded_server
from timeshard.cli.main import main
from timeshard.client import Client, NewJob
from timeshard.model import JobState


@asynccontextmanager
async def serving() -> AsyncIterator[str]:
    async with embedded_server() as server:
        yield server.address


def _schedule(address: str, key: str) -> tuple[bool, JobState, str]:
    with Client(address, retries=0) as c:
        done = c.schedule("mail.send", {"to": "a"}, delay=600, key=key)
        return done.created, done.job.state, done.job_id


def _cancel(address: str, job_id: str) -> None:
    with Client(address, retries=0) as c:
        c.cancel(job_id)


async def test_the_client_says_whether_a_keyed_call_created_its_job() -> None:
    async with serving() as address:
        created, state, job_id = await asyncio.to_thread(_schedule, address, "k1")
        assert created and state is JobState.SCHEDULED
        again = await asyncio.to_thread(_schedule, address, "k1")
        assert again == (False, JobState.SCHEDULED, job_id)
        await asyncio.to_thread(_cancel, address, job_id)
        after_cancel = await asyncio.to_thread(_schedule, address, "k1")
        assert after_cancel == (False, JobState.CANCELLED, job_id)


def _schedule_many(address: str) -> list[tuple[bool, str, bool]]:
    with Client(address, retries=0) as c:
        first = c.schedule("mail.send", {}, delay=600, key="gone")
        c.cancel(first.job.job_id)
        jobs = [
            NewJob(job_type="mail.send", delay=600, key="gone"),
            NewJob(job_type="mail.send", delay=600, key="new"),
            NewJob(job_type="mail.send", delay=600, key="new"),
        ]
        return [(r.created, r.job.job_id, r.will_run) for r in c.schedule_many(jobs)]


async def test_schedule_many_gives_each_job_its_created_flag() -> None:
    async with serving() as address:
        (gone, new, repeat) = await asyncio.to_thread(_schedule_many, address)
        assert gone[0] is False and gone[2] is False  # the cancelled job the key names
        assert new[0] is True and new[2] is True
        assert repeat == (False, new[1], True)  # the same key twice in one batch: one job


async def test_the_cli_fails_when_the_key_names_a_cancelled_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with serving() as address:

        def cli(*args: str) -> int:
            return main(["--server", address, "jobs", "schedule", "mail.send", *args])

        code = await asyncio.to_thread(cli, "--in", "10m", "--key", "welcome-42")
        out = capsys.readouterr()
        job_id = out.out.split()[-1]
        assert code == 0 and out.out.startswith("scheduled mail.send at ")

        code = await asyncio.to_thread(cli, "--in", "10m", "--key", "welcome-42")
        out = capsys.readouterr()
        assert code == 0
        assert out.out.startswith("already scheduled: key 'welcome-42' names mail.send at ")
        assert "which is scheduled: " in out.out and out.out.split()[-1] == job_id

        await asyncio.to_thread(_cancel, address, job_id)
        code = await asyncio.to_thread(cli, "--in", "10m", "--key", "welcome-42")
        out = capsys.readouterr()
        assert code != 0 and out.out == ""
        assert f"not scheduled: key 'welcome-42' names job {job_id}, which is cancelled" in out.err
