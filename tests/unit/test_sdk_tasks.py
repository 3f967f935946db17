"""Tasks: typed payloads checked where scheduled and where run, retry and limits pushed to the
cluster as the type's policy, cron schedules declared in code and put by id at start."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import TypedDict

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from tests.unit.helpers import embedded_server
from timeshard.client import AsyncClient, ScheduleSpec
from timeshard.errors import AlreadyExists, InvalidArgument
from timeshard.model import JobState
from timeshard.node.retry import RetryPolicy
from timeshard.testing import local, local_async
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.worker import JobContext, PermanentError, Retry, Worker


@dataclass
class Email:
    to: str
    subject: str = ""


class Invoice(TypedDict):
    customer: str
    cents: int


def test_a_dataclass_payload_is_checked_where_scheduled_and_given_to_the_handler() -> None:
    worker = Worker(lease_s=5)
    got: list[tuple[Email, int]] = []

    @worker.task("email.send")
    async def send(email: Email, ctx: JobContext) -> None:
        got.append((email, ctx.attempt))

    with local(worker) as client:
        done = send.schedule(Email(to="a@example.com"))
        from_dict = send.schedule({"to": "b@example.com", "subject": "hi"})
        assert client.finished(done.job_id).state is JobState.SUCCEEDED
        assert client.finished(from_dict.job_id).state is JobState.SUCCEEDED
        with pytest.raises(InvalidArgument, match=r"^payload: does not match Email: to: "):
            send.schedule({"to": 3})
        with pytest.raises(InvalidArgument, match=r"subject: Input should be a valid string"):
            send.schedule(Email(to="c", subject=5))  # type: ignore[arg-type]
        assert len(list(client.list_jobs())) == 2  # the refused ones were never sent
    assert sorted(got, key=lambda g: g[0].to) == [
        (Email(to="a@example.com"), 1),
        (Email(to="b@example.com", subject="hi"), 1),
    ]


def test_a_payload_that_fails_its_type_at_run_time_is_dead_with_the_reason() -> None:
    worker = Worker(lease_s=5)
    ran: list[Invoice] = []

    @worker.task("invoice.send")
    def send(invoice: Invoice) -> None:  # a plain def, a TypedDict
        ran.append(invoice)

    with local(worker) as client:
        ok = client.schedule("invoice.send", {"customer": "acme", "cents": 1200})
        wrong = client.schedule("invoice.send", {"customer": "acme", "cents": "12.00"})
        missing = client.schedule("invoice.send", {"cents": 1})
        assert client.finished(ok.job_id).state is JobState.SUCCEEDED
        dead = client.finished(wrong.job_id)
        assert dead.state is JobState.DEAD and dead.attempt == 1  # permanent: not retried
        assert "payload does not match Invoice: cents: Input should be a valid integer" in (
            dead.last_error
        )
        assert "customer: Field required" in client.finished(missing.job_id).last_error
        assert [d.job_id for d in client.dead_letters()] != []
    assert ran == [{"customer": "acme", "cents": 1200}]


def test_an_unannotated_payload_is_the_decoded_json_and_a_bad_signature_is_refused() -> None:
    worker = Worker()

    @worker.task("any")
    def anything(payload):  # type: ignore[no-untyped-def]
        return payload

    assert anything.payload_type.decode(b'{"a": [1]}') == {"a": [1]}
    assert anything({"x": 1}) == {"x": 1}  # calling the task calls the handler

    with pytest.raises(TypeError, match="must take its payload and, optionally, a parameter"):

        @worker.task("two")
        def two(a: Email, b: Email) -> None: ...

    with pytest.raises(ValueError, match="a handler is already registered"):

        @worker.task("any")
        def again(payload: Email) -> None: ...


def test_a_bad_cron_zone_policy_or_id_in_a_decorator_fails_where_it_is_declared() -> None:
    worker = Worker()
    cases = [
        ({"cron": "61 * * * *", "id": "a"}, "minute|expression|61"),
        ({"cron": "0 2 * * *", "id": "b", "tz": "Mars/Olympus"}, "timezone"),
        ({"cron": "0 2 * * *", "id": "c", "overlap": "sometimes"}, "overlap: unknown policy"),
        ({"cron": "0 2 * * *", "id": "has space"}, "schedule_id"),
        ({"cron": "0 2 * * *", "id": "e", "overlpa": "skip"}, "unexpected keyword"),
    ]
    for n, (kwargs, message) in enumerate(cases):
        cron, schedule_id = kwargs.pop("cron"), kwargs.pop("id")
        with pytest.raises(InvalidArgument, match=message):

            @worker.cron(cron, id=schedule_id, job_type=f"t{n}", **kwargs)
            def job(payload: dict[str, int]) -> None: ...

    assert worker.schedules == [] and worker.handlers == {}  # nothing half-registered


def test_a_schedule_id_declared_twice_is_refused() -> None:
    worker = Worker()

    @worker.cron("0 2 * * *", id="nightly")
    def one(payload: dict[str, int]) -> None: ...

    with pytest.raises(InvalidArgument, match="'nightly' is declared twice in this worker"):

        @worker.cron("0 3 * * *", id="nightly", job_type="other")
        def two(payload: dict[str, int]) -> None: ...

    with pytest.raises(InvalidArgument, match="'nightly' is declared twice"):
        worker.declare(ScheduleSpec(job_type="x", cron="0 4 * * *", schedule_id="nightly"))


def test_a_cron_payload_is_checked_against_the_task_type() -> None:
    worker = Worker()

    @worker.task("email.send")
    def send(email: Email) -> None: ...

    with pytest.raises(InvalidArgument, match="payload: does not match Email: to: Field required"):
        worker.cron("0 9 * * 1", id="weekly")(send)
    worker.cron("0 9 * * 1", id="weekly", payload=Email(to="team@example.com"))(send)
    assert worker.schedules[0].job_type == "email.send"


async def _run_worker(worker: Worker, address: str) -> asyncio.Task[None]:
    task = asyncio.create_task(worker.run([address], discover_every_s=0))
    await wait_until(lambda: worker.declared or task.done(), 10, "the worker to declare")
    if task.done():
        task.result()
    return task


def _nightly_worker(cron: str = "0 2 * * *") -> Worker:
    worker = Worker(lease_s=5)

    @worker.cron(cron, tz="Europe/Berlin", id="nightly-report", payload={"kind": "all"})
    def report(payload: dict[str, str]) -> None: ...

    return worker


async def test_declared_schedules_are_put_by_id_across_restarts_and_workers_at_once() -> None:
    async with embedded_server() as server:
        node = server.node
        # Three workers start at once: one schedule.
        workers = [_nightly_worker() for _ in range(3)]
        tasks = await asyncio.gather(*(_run_worker(w, server.address) for w in workers))
        (stored,) = (await node.store.list_schedules(limit=10, page_token=""))[0]
        assert stored.schedule_id == "nightly-report" and stored.job_type == "cron.nightly-report"
        assert stored.payload == b'{"kind":"all"}' and stored.timezone == "Europe/Berlin"
        for w in workers:
            w.stop(0)
        await asyncio.gather(*tasks)
        # A restart with the same declaration changes nothing (not even the version).
        again = _nightly_worker()
        await _run_worker(again, server.address)
        (same,) = (await node.store.list_schedules(limit=10, page_token=""))[0]
        assert same.version == stored.version and same.next_fire == stored.next_fire
        again.stop(0)
        # A new declaration updates it, by id.
        changed = _nightly_worker("30 3 * * *")
        task = await _run_worker(changed, server.address)
        (updated,) = (await node.store.list_schedules(limit=10, page_token=""))[0]
        assert updated.cron == "30 3 * * *" and updated.version > stored.version
        changed.stop(0)
        await task


async def test_a_schedule_id_taken_by_another_type_stops_the_worker_with_the_clash() -> None:
    async with embedded_server() as server:
        async with AsyncClient(server.address, tls=False, token="") as c:
            await c.create_schedule("billing", cron="0 1 * * *", schedule_id="nightly-report")
        worker = _nightly_worker()
        with pytest.raises(AlreadyExists, match="exists for job type 'billing'"):
            await asyncio.wait_for(worker.run([server.address], discover_every_s=0), 10)
        assert (await server.node.schedules.get("nightly-report")).job_type == "billing"


async def test_a_tasks_retry_and_cluster_limit_become_the_types_policy_on_start() -> None:
    worker = Worker(lease_s=5)
    attempts: list[int] = []

    @worker.task(
        "flaky",
        retry=Retry(max_attempts=4, backoff=0.01, max_backoff=0.05),
        cluster_concurrency=2,
    )
    def flaky(payload: dict[str, int], ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError("downstream is down")

    @worker.task("permanent")
    def permanent(payload: dict[str, int]) -> None:
        raise PermanentError("bad input")

    async with local_async(worker) as client:
        done = await flaky.schedule_async({"n": 1})
        assert done.job.max_attempts == 4
        job = await client.finished(done.job_id)
        assert job.state is JobState.DEAD and job.attempt == 4 and attempts == [1, 2, 3, 4]
        assert "downstream is down" in job.last_error
        dead = await client.finished((await permanent.schedule_async({})).job_id)
        assert dead.state is JobState.DEAD and dead.attempt == 1


async def test_set_type_policies_checks_its_input_and_is_stored_for_every_node() -> None:
    async with embedded_server() as server:
        node = server.node
        async with AsyncClient(server.address, tls=False, token="") as c:
            set_ = await c.set_type_policy(
                "email.send", retry=Retry(max_attempts=5, backoff=2, max_backoff=60), concurrency=3
            )
            assert (set_.max_attempts, set_.concurrency) == (5, 3)
            assert (set_.backoff, set_.max_backoff) == (timedelta(seconds=2), timedelta(minutes=1))
        policy = node.config.types["email.send"]
        assert policy.max_attempts == 5 and policy.concurrency == 3
        assert policy.retry == RetryPolicy(base_s=2, max_backoff_s=60)
        assert node.config.max_attempts("email.send") == 5
        assert "email.send" in await node.store.type_policies()

        channel = grpc.aio.insecure_channel(server.address)
        admin = pb_grpc.AdminServiceStub(channel)
        bad = [
            (pb.TypePolicy(type="", max_attempts=1), "policies[0].type"),
            (pb.TypePolicy(type="t", max_attempts=1001), "policies[0].max_attempts"),
            (pb.TypePolicy(type="t", concurrency=-1), "policies[0].concurrency"),
            (pb.TypePolicy(type="t", retry_base=Duration(seconds=-1)), "policies[0].retry_base"),
            (
                pb.TypePolicy(
                    type="t", retry_base=Duration(seconds=9), retry_max=Duration(seconds=1)
                ),
                "policies[0].retry_max",
            ),
        ]
        try:
            for policy_msg, field in bad:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await admin.SetTypePolicies(pb.SetTypePoliciesRequest(policies=[policy_msg]))
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert (err.value.details() or "").startswith(field)
            twice = [pb.TypePolicy(type="t", max_attempts=2)] * 2
            with pytest.raises(grpc.aio.AioRpcError, match="named twice"):
                await admin.SetTypePolicies(pb.SetTypePoliciesRequest(policies=twice))
        finally:
            await channel.close()
        assert "t" not in node.config.types and "t" not in await node.store.type_policies()


async def test_a_policy_set_on_one_node_reaches_another_from_the_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.unit.helpers import FixedCoordinator
    from timeshard.clock import SystemClock
    from timeshard.node import Node, TypePolicy
    from timeshard.store.sqlite import SqliteStore

    db = tmp_path / "jobs.db"
    a = Node(
        store=SqliteStore(db, num_shards=4),
        coordinator=FixedCoordinator(range(4)),
        clock=SystemClock(),
    )
    b = Node(
        store=SqliteStore(db, num_shards=4), coordinator=FixedCoordinator(()), clock=SystemClock()
    )
    await a.start()
    await b.start()
    try:
        await b.type_policies.set([("report", TypePolicy(max_attempts=9, concurrency=1))])
        assert "report" not in a.config.types  # until its next refresh
        await a.type_policies.load()  # what the refresh does every few seconds
        assert a.config.types["report"] == TypePolicy(max_attempts=9, concurrency=1)
    finally:
        await b.stop()
        await a.stop()
    restarted = Node(
        store=SqliteStore(db, num_shards=4),
        coordinator=FixedCoordinator(range(4)),
        clock=SystemClock(),
    )
    await restarted.start()
    try:
        assert restarted.config.max_attempts("report") == 9  # read at start
    finally:
        await restarted.stop()


async def test_a_schedules_list_is_declared_like_the_decorator() -> None:
    specs = [
        ScheduleSpec(job_type="report", cron="0 6 * * *", tz="Asia/Tokyo", schedule_id="a"),
        ScheduleSpec(job_type="report", cron="0 7 * * *", schedule_id="b", overlap="queue"),
    ]
    worker = Worker(lease_s=5, schedules=specs)

    @worker.task("report")
    def report(payload: dict[str, int]) -> None: ...

    async with local_async(worker) as client:
        stored = {s.schedule_id: s async for s in client.list_schedules()}
        assert stored.keys() == {"a", "b"} and stored["a"].timezone == "Asia/Tokyo"
        assert str(stored["b"].overlap) == "queue"
    with pytest.raises(InvalidArgument, match="declared twice"):
        Worker(schedules=[specs[0], specs[0]])
    with pytest.raises(InvalidArgument, match="needs an id"):
        Worker(schedules=[ScheduleSpec(job_type="report", cron="0 6 * * *")])


async def test_a_node_without_type_policies_does_not_keep_the_worker_from_starting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from timeshard.errors import Unimplemented
    from timeshard.worker.tasks import declare

    class OlderNode:
        address = "old:50051"

        async def set_type_policies(self, policies: object) -> None:
            raise Unimplemented("SetTypePolicies")

        async def put_schedule(self, spec: ScheduleSpec) -> tuple[None, str]:
            return None, "created"

    worker = Worker()

    @worker.task("t", retry=Retry(max_attempts=2))
    def t(payload: dict[str, int]) -> None: ...

    spec = ScheduleSpec(job_type="t", cron="0 1 * * *", schedule_id="s")
    done = await declare(OlderNode(), list(worker.tasks.values()), [spec])  # type: ignore[arg-type]
    assert done == {"s": "created"}
    assert "old:50051 does not take type policies" in caplog.text
