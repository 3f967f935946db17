"""The Python SDK says what the server noticed (issue 35, item 5): a type no worker has asked
for is logged once per type (``logging.WARNING``) and kept in ``Scheduled.warnings``; a key
repeated at another time raises ``AlreadyExists``, and ``if_exists="return"`` gets the key's
job whatever the call asks for. Real gRPC, an in-process node on the embedded store."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

import pytest

import timeshard.testing
from tests.unit.helpers import embedded_server
from timeshard.client import AsyncClient, Client, NewJob
from timeshard.errors import AlreadyExists, InvalidArgument
from timeshard.worker import Worker


def warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "timeshard.client" and r.levelno == logging.WARNING
    ]


async def test_a_type_no_worker_asked_for_is_logged_once_per_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with embedded_server() as server:

        def run() -> None:
            with Client(server.address, tls=False, token="", retries=0) as c:
                first = c.schedule("emial.send", {"to": "a"})
                assert first.warnings and "'emial.send'" in first.warnings[0]
                assert c.schedule("emial.send", {"to": "b"}).warnings == first.warnings
                many = c.schedule_many(
                    [NewJob(job_type=t, delay=60) for t in ("emial.send", "report", "report")]
                )
                assert [len(m.warnings) for m in many] == [1, 1, 1]

        with caplog.at_level(logging.WARNING, logger="timeshard.client"):
            await asyncio.to_thread(run)
        lines = warned(caplog)
        assert len(lines) == 2, lines  # once for each type, however often it was scheduled
        assert lines[0].startswith("job type 'emial.send': no worker has asked this node")
        assert "is the type spelt as in its handler?" in lines[0]
        assert lines[1].startswith("job type 'report': ")


async def test_the_async_client_logs_it_too_and_a_claimed_type_is_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        server.node.polled.asked(["served"])  # as a worker's claim does
        with caplog.at_level(logging.WARNING, logger="timeshard.client"):
            quiet = await c.schedule("served")
            loud = await c.schedule("unserved")
            await c.schedule_many([NewJob(job_type="unserved")])
        assert quiet.warnings == () and loud.warnings
        assert len(warned(caplog)) == 1 and "'unserved'" in warned(caplog)[0]


async def test_a_key_at_another_time_raises_and_if_exists_return_gets_its_job() -> None:
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        first = await c.schedule("t", {"n": 1}, delay=timedelta(minutes=5), key="k")
        again = await c.schedule("t", {"n": 1}, delay=timedelta(minutes=5), key="k")
        assert not again.created and again.job_id == first.job_id
        with pytest.raises(AlreadyExists, match="a different time"):
            await c.schedule("t", {"n": 1}, delay=timedelta(minutes=10), key="k")
        with pytest.raises(AlreadyExists, match="different body"):
            await c.schedule("t", {"n": 2}, delay=timedelta(minutes=5), key="k")
        got = await c.schedule("t", {"n": 2}, delay=timedelta(hours=3), key="k", if_exists="return")
        assert not got.created and got.job == first.job
        with pytest.raises(InvalidArgument) as bad:
            await c.schedule("t", key="k", if_exists="replace")
        assert bad.value.field == "if_exists"
        many = await c.schedule_many(
            [NewJob(job_type="t", payload={"n": 3}, key="k", if_exists="return")]
        )
        assert [m.job_id for m in many] == [first.job_id]


@dataclass
class Order:
    n: int


async def test_a_task_passes_if_exists_on() -> None:
    worker = Worker(worker_id="w1")

    @worker.task("orders.charge")
    def charge(order: Order) -> None:
        """Never run here: only scheduled."""

    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        first = await charge.schedule_async(Order(n=1), delay=60, key="o1", client=c)
        with pytest.raises(AlreadyExists):
            await charge.schedule_async(Order(n=1), delay=600, key="o1", client=c)
        same = await charge.schedule_async(
            Order(n=1), delay=600, key="o1", client=c, if_exists="return"
        )
        assert same.job_id == first.job_id


async def test_testing_local_yields_once_its_worker_asks_so_a_test_gets_no_warning() -> None:
    worker = Worker(worker_id="w1")

    @worker.handler("served")
    def handle(ctx: object) -> None:
        """Runs the job."""

    for _ in range(3):
        async with timeshard.testing.local_async(worker) as client:
            done = await client.schedule("served")
            assert done.warnings == ()
