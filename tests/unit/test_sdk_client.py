"""The typed client (sync and async): records with aware UTC datetimes and enums, plain
arguments, the environment read as the CLI reads it, typed errors, schedules put by id."""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime, timedelta
from typing import get_type_hints

import pytest

from tests.unit.helpers import embedded_server
from timeshard.client import (
    AsyncClient,
    Client,
    JobOptionArgs,
    JobOptions,
    NewJob,
    ScheduleSpec,
)
from timeshard.client.records import Job, Schedule
from timeshard.errors import AlreadyExists, InvalidArgument, NotFound
from timeshard.model import JobState, MisfirePolicy, OverlapPolicy
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.worker.tasks import Task


def _sync(address: str) -> Client:
    return Client(address, tls=False, token="", retries=0)


async def test_schedule_returns_a_job_with_aware_utc_times_and_one_job_state() -> None:
    async with embedded_server() as server:
        before = datetime.now(UTC)

        def run() -> tuple[Job, Job]:
            with _sync(server.address) as c:
                done = c.schedule("email.send", {"to": "a"}, delay=timedelta(hours=1), key="k")
                return done.job, c.get(done.job_id)

        job, again = await asyncio.to_thread(run)
        assert job == again
        assert job.state is JobState.SCHEDULED and isinstance(job.state, JobState)
        assert job.run_at.tzinfo is not None and job.run_at.utcoffset() == timedelta(0)
        assert timedelta(minutes=59) < job.run_at - before < timedelta(minutes=61)
        assert job.payload == {"to": "a"} and job.idempotency_key == "k"
        assert job.lease_until is None and job.history == ()


async def test_delay_in_seconds_at_a_datetime_and_reschedule_and_cancel() -> None:
    async with embedded_server() as server:
        at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
        async with AsyncClient(server.address, tls=False, token="") as c:
            in_seconds = (await c.schedule("t", delay=90)).job
            at_time = (await c.schedule("t", at=at)).job
            assert at_time.run_at == at
            assert timedelta(seconds=89) < in_seconds.run_at - in_seconds.created_at
            moved = await c.reschedule(in_seconds.job_id, at=at + timedelta(hours=1))
            assert moved.run_at == at + timedelta(hours=1)
            cancelled = await c.cancel(at_time.job_id)
            assert cancelled.state is JobState.CANCELLED and not cancelled.will_run
            states = {j.job_id: j.state async for j in c.list_jobs()}
            assert states == {in_seconds.job_id: JobState.SCHEDULED, at_time.job_id: "cancelled"}
            only = [j.job_id async for j in c.list_jobs(state="cancelled")]
            assert only == [at_time.job_id]


async def test_bad_times_are_refused_with_the_field_named_before_or_by_the_server() -> None:
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="", retries=0) as c,
    ):
        with pytest.raises(InvalidArgument, match=r"^at: a naive datetime"):
            await c.schedule("t", at=datetime(2030, 1, 1))
        with pytest.raises(InvalidArgument, match=r"^at: give a delay or an at time"):
            await c.schedule("t", delay=1, at=datetime.now(UTC))
        with pytest.raises(InvalidArgument, match=r"^delay: must not be negative"):
            await c.schedule("t", delay=timedelta(seconds=-5))
        with pytest.raises(InvalidArgument, match=r"^delay: give a timedelta or seconds"):
            await c.schedule("t", delay="5s")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=r"^payload: not JSON-serialisable"):
            await c.schedule("t", {"when": object()})
        with pytest.raises(InvalidArgument, match=r"^state: 'done' is not a job state"):
            [j async for j in c.list_jobs(state="done")]
        with pytest.raises(NotFound):
            await c.get("no-such-job")
        assert [j async for j in c.list_jobs()] == []  # nothing was half-sent


def test_a_jobs_options_are_declared_once_and_checked_when_made() -> None:
    options = get_type_hints(JobOptions)
    assert list(options) == [
        "delay", "at", "key", "max_attempts", "deadline", "deadline_in", "priority", "if_exists"
    ]  # fmt: skip
    assert get_type_hints(JobOptionArgs) == options  # the keyword form: the same, no other
    for method in (Client.schedule, AsyncClient.schedule, Task.schedule, Task.schedule_async):
        params = inspect.signature(method).parameters
        assert params["options"].kind is inspect.Parameter.VAR_KEYWORD, method
        assert not set(params) & set(options), method  # none declared again

    with pytest.raises(InvalidArgument, match=r"^at: give a delay or an at time"):
        NewJob(job_type="t", delay=1, at=datetime.now(UTC))
    with pytest.raises(InvalidArgument, match=r"^deadline: give a deadline or a deadline_in"):
        JobOptions(deadline=datetime.now(UTC), deadline_in=5)
    with pytest.raises(InvalidArgument, match=r"^deadline_in: give a timedelta or seconds"):
        JobOptions(deadline_in="1h")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"^deadline: a naive datetime"):
        JobOptions(deadline=datetime(2030, 1, 1))
    with pytest.raises(InvalidArgument, match=r"^priority: give an int 0-9"):
        JobOptions(priority=True)
    with pytest.raises(InvalidArgument, match=r"^if_exists: give 'check' or 'return'"):
        JobOptions(key="k", if_exists="replace")

    req = NewJob(
        job_type="t",
        payload={"n": 1},
        at=datetime(2030, 1, 1, tzinfo=UTC),
        key="k",
        max_attempts=2,
        deadline_in=timedelta(seconds=1.5),
        priority=3,
        if_exists="return",
    ).request()
    assert (req.type, req.payload, req.idempotency_key) == ("t", b'{"n":1}', "k")
    assert req.run_at.seconds == int(datetime(2030, 1, 1, tzinfo=UTC).timestamp())
    assert (req.deadline_in.seconds, req.deadline_in.nanos) == (1, 500_000_000)
    assert (req.max_attempts, req.priority) == (2, 3) and not req.HasField("delay")
    assert req.if_exists == pb.IF_EXISTS_RETURN
    assert NewJob(job_type="t").request().if_exists == pb.IF_EXISTS_CHECK


async def test_schedule_many_says_what_each_did() -> None:
    async with embedded_server() as server:

        def run() -> list[tuple[bool, bool]]:
            with _sync(server.address) as c:
                batches: list[int] = []
                jobs = [
                    NewJob(job_type="t", payload={"n": n % 3}, delay=60, key=f"k{n % 3}")
                    for n in range(5)
                ]
                done = c.schedule_many(jobs, batch_size=2, on_batch=batches.append)
                assert batches == [2, 4, 5]
                return [(d.created, d.will_run) for d in done]

        assert await asyncio.to_thread(run) == [(True, True)] * 3 + [(False, True)] * 2


async def test_the_address_token_and_tls_come_from_the_environment_as_for_the_cli(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with embedded_server() as server:
        monkeypatch.setenv("TIMESHARD_SERVER", f"{server.address},127.0.0.1:1")
        monkeypatch.delenv("TIMESHARD_TLS_DIR", raising=False)
        monkeypatch.delenv("TIMESHARD_TOKEN", raising=False)
        async with AsyncClient() as c:
            assert c.address == server.address  # the first of the CLI's list
            assert (await c.schedule("t")).created
        monkeypatch.setenv("TIMESHARD_SERVER", "")
        with Client() as c:
            assert c.address == "127.0.0.1:50051"  # as the CLI's default


async def test_create_schedule_takes_plain_arguments_and_returns_a_schedule() -> None:
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        s = await c.create_schedule(
            "report",
            cron="0 2 * * *",
            tz="Europe/Berlin",
            schedule_id="nightly",
            payload={"kind": "invoices"},
            misfire="all",
            overlap=OverlapPolicy.QUEUE,
            misfire_grace=timedelta(minutes=5),
        )
        assert isinstance(s, Schedule) and s.schedule_id == "nightly"
        assert s.misfire is MisfirePolicy.ALL and s.overlap is OverlapPolicy.QUEUE
        assert s.misfire_grace == timedelta(minutes=5) and s.payload == {"kind": "invoices"}
        assert s.next_fire is not None and s.next_fire.utcoffset() == timedelta(0)
        assert s.next_fire.astimezone().hour is not None
        with pytest.raises(AlreadyExists):
            await c.create_schedule("report", cron="0 3 * * *", schedule_id="nightly")
        with pytest.raises(InvalidArgument, match=r"cron|expression"):
            await c.create_schedule("report", cron="61 * * * *")
        with pytest.raises(InvalidArgument, match=r"unexpected keyword argument 'overlpa'"):
            await c.create_schedule("report", cron="0 2 * * *", overlpa="skip")
        paused = await c.pause_schedule("nightly")
        assert paused.paused
        assert [x.schedule_id async for x in c.list_schedules()] == ["nightly"]
        await c.delete_schedule("nightly")
        with pytest.raises(NotFound):
            await c.get_schedule("nightly")


async def test_preview_gives_aware_utc_and_local_times() -> None:
    async with embedded_server() as server:

        def run() -> list[tuple[datetime, datetime, str]]:
            with _sync(server.address) as c:
                start = datetime(2026, 3, 7, 12, tzinfo=UTC)
                return [
                    (t.utc, t.local, t.note)
                    for t in c.preview("30 2 * * *", "America/New_York", start=start, count=2)
                ]

        (gap, normal) = await asyncio.to_thread(run)
        assert gap[0] == datetime(2026, 3, 8, 7, 0, tzinfo=UTC) and gap[1] == gap[0]
        assert gap[1].utcoffset() == timedelta(hours=-4) and "skip" in gap[2]
        assert normal[0] == datetime(2026, 3, 9, 6, 30, tzinfo=UTC) and normal[2] == ""


async def test_put_schedule_creates_then_leaves_alone_then_updates_and_keeps_a_pause() -> None:
    spec = ScheduleSpec(job_type="report", cron="0 2 * * *", tz="UTC", schedule_id="r")
    async with (
        embedded_server() as server,
        AsyncClient(server.address, tls=False, token="") as c,
    ):
        first, what = await c.put_schedule(spec)
        assert what == "created"
        again, what = await c.put_schedule(spec)
        assert what == "unchanged" and again.next_fire == first.next_fire
        await c.pause_schedule("r")
        changed = ScheduleSpec(job_type="report", cron="0 3 * * *", schedule_id="r")
        updated, what = await c.put_schedule(changed)
        assert what == "updated" and updated.cron == "0 3 * * *" and updated.paused
        other = ScheduleSpec(job_type="billing", cron="0 3 * * *", schedule_id="r")
        with pytest.raises(AlreadyExists, match=r"exists for job type 'report', not 'billing'"):
            await c.put_schedule(other)
        assert (await c.get_schedule("r")).job_type == "report"


async def test_put_schedule_from_many_callers_at_once_stores_one_schedule() -> None:
    spec = ScheduleSpec(job_type="report", cron="*/5 * * * *", schedule_id="shared")
    async with embedded_server() as server:
        clients = [AsyncClient(server.address, tls=False, token="") for _ in range(6)]
        try:
            done = await asyncio.gather(*(c.put_schedule(spec) for c in clients))
        finally:
            for c in clients:
                await c.close()
        assert sorted(what for _, what in done) == ["created"] + ["unchanged"] * 5
        assert len({s.next_fire for s, _ in done}) == 1
        async with AsyncClient(server.address, tls=False, token="") as c:
            assert [s.schedule_id async for s in c.list_schedules()] == ["shared"]


def _dead_address() -> str:
    """A loopback port nobody listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_a_client_given_several_nodes_moves_past_one_that_is_down() -> None:
    """``"dead,alive"``: a call that could not connect goes to the next node at once, even a
    create without a key (it never left, so it cannot run twice), and the client stays there.
    Before, the client dialled the first address only and every call failed UNAVAILABLE."""
    dead = _dead_address()
    async with embedded_server() as server:

        def run() -> tuple[str, Job, str]:
            with _sync(f"{dead},{server.address}") as c:
                done = c.schedule("t", delay=timedelta(hours=1))
                return done.job_id, c.get(done.job_id), c.address

        job_id, job, address = await asyncio.to_thread(run)
        assert job.job_id == job_id and address == server.address
        async with AsyncClient(f"{dead},{server.address}", tls=False, token="", retries=0) as c:
            made = await c.schedule("t", delay=timedelta(hours=1))
            assert (await c.get(made.job_id)).state is JobState.SCHEDULED
            assert c.address == server.address
            assert len([j async for j in c.list_jobs()]) == 2


async def test_a_client_whose_only_nodes_are_down_says_unavailable_after_trying_each() -> None:
    from timeshard.errors import Unavailable

    first, second = _dead_address(), _dead_address()

    def run() -> None:
        with _sync(f"{first},{second}") as c:
            c.get("some-job")

    with pytest.raises(Unavailable):
        await asyncio.to_thread(run)
