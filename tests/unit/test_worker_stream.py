"""The worker stream (``WorkerService.Work``): pushes never early and never beyond the credits,
heartbeats and results answered per item, a broken stream left to the lease, the SDK's fallback
to the unary calls, cancel and shutdown over the stream, and bad messages refused. Real gRPC,
in-process nodes on the embedded store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.unit.helpers import advance, settle
from tests.unit.test_worker_handler_ends import make_server, wait_job, working
from tests.unit.test_worker_handler_ends import worker as unary_worker
from timeshard.api import workers
from timeshard.api.workhub import WorkHub
from timeshard.clock import FakeClock, SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import JobState
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.security.auth import Authenticator, Role, add_token
from timeshard.security.channel import ClientSecurity
from timeshard.security.policy import ServerSecurity
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, ts_ms
from timeshard.worker import JobContext, results, startat, stream

OK, STALE, INVALID = 0, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT


class Stream:
    """A hand-driven worker stream: requests numbered as the protocol says."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call: Any = pb_grpc.WorkerServiceStub(channel).Work()  # type: ignore[call-arg]
        self.seq = 0
        self.jobs: list[pb.ClaimedJob] = []
        self.answers: dict[int, pb.WorkResponse] = {}

    async def send(self, **fields: Any) -> int:
        self.seq += 1
        await self.call.write(pb.WorkRequest(seq=self.seq, **fields))
        return self.seq

    async def hello(self, lease_ms: int = 10_000, **credits: int) -> None:
        hello = pb.WorkHello(worker_id="w1", lease=dur(lease_ms))
        await self.send(hello=hello, credits=_credits(credits))
        welcome = await self.call.read()
        assert welcome.seq == 1 and not welcome.jobs

    async def read(self) -> pb.WorkResponse:
        message = await asyncio.wait_for(self.call.read(), 30)
        assert message is not grpc.aio.EOF  # type: ignore[attr-defined]
        self.jobs += message.jobs
        if message.seq:
            self.answers[message.seq] = message
        return message  # type: ignore[no-any-return]

    async def until_jobs(self, n: int) -> list[pb.ClaimedJob]:
        while len(self.jobs) < n:
            await self.read()
        return self.jobs

    async def answer(self, seq: int) -> pb.WorkResponse:
        while seq not in self.answers:
            await self.read()
        return self.answers[seq]


def _credits(by_type: dict[str, int]) -> list[pb.WorkCredit]:
    return [pb.WorkCredit(type=t, credits=n) for t, n in by_type.items()]


@asynccontextmanager
async def serving(srv: Server | None = None) -> AsyncIterator[tuple[Server, grpc.aio.Channel]]:
    srv = srv or make_server()
    await srv.start()
    channel = grpc.aio.insecure_channel(srv.address)
    try:
        yield srv, channel
    finally:
        await channel.close()
        await srv.stop(0)


async def schedule(srv: Server, n: int, delay_ms: int = 0, job_type: str = "t") -> list[str]:
    now = srv.node.clock.now_ms()
    jobs = [
        (
            await srv.node.jobs.schedule(
                JobSpec(job_type=job_type, payload=b"", run_at=now + delay_ms)
            )
        )[0]
        for _ in range(n)
    ]
    return [j.job_id for j in jobs]


def worker(**kw: Any) -> Any:
    """A worker of the tests' kind on the stream (the SDK's default is the unary calls)."""
    return unary_worker(use_stream=True, **kw)


# -- pushes -------------------------------------------------------------------------------------


async def test_a_pushed_job_is_never_early() -> None:
    async with serving() as (srv, channel):
        now = srv.node.clock.now_ms()
        for i in range(12):
            await srv.node.jobs.schedule(
                JobSpec(job_type="t", payload=b"", run_at=now + 300 + 40 * i)
            )
        s = Stream(channel)
        await s.hello(t=100)
        for claimed in await s.until_jobs(12):
            arrived = time.time() * 1000
            run_at = ts_ms(claimed.job.run_at)
            assert ts_ms(claimed.job.started_at) >= run_at, claimed.job
            assert arrived >= run_at, (arrived, run_at)


async def test_no_more_jobs_are_pushed_than_the_credits_granted() -> None:
    async with serving() as (srv, channel):
        ids = await schedule(srv, 10)
        s = Stream(channel)
        await s.hello(t=3)
        assert len(await s.until_jobs(3)) == 3
        await wait_until(lambda: srv.node.ready.count() == 7, 10, "the other 7 ready")
        await settle(srv.node)
        states = [(await srv.node.jobs.get(i)).state for i in ids]
        assert states.count(JobState.RUNNING) == 3, states
        await s.send(credits=_credits({"t": 2}))
        assert len(await s.until_jobs(5)) == 5
        await wait_until(lambda: srv.node.ready.count() == 5, 10, "the other 5 ready")
        states = [(await srv.node.jobs.get(i)).state for i in ids]
        assert states.count(JobState.RUNNING) == 5, states
        assert len({c.job.job_id for c in s.jobs}) == 5


async def test_many_jobs_due_together_come_in_one_push() -> None:
    async with serving() as (srv, channel):
        await schedule(srv, 20, delay_ms=400)
        s = Stream(channel)
        await s.hello(t=50)
        first = await s.read()
        while not first.jobs:
            first = await s.read()
        assert len(first.jobs) > 1, "jobs due together were pushed one per message"


class HeldClaims(SqliteStore):
    """Claims wait for ``release`` while ``hold`` is set: a write that takes its time."""

    def __init__(self) -> None:
        super().__init__(":memory:", num_shards=2)
        self.hold = asyncio.Event()
        self.release = asyncio.Event()
        self.held = 0

    async def claim_jobs(self, claims: Any) -> Any:
        if self.hold.is_set():
            self.hold.clear()
            self.held += 1
            await self.release.wait()
        return await super().claim_jobs(claims)

    def server(self) -> Server:
        """A server of a node on this store."""
        node = Node(
            store=self,
            coordinator=LocalCoordinator(),
            clock=SystemClock(),
            config=NodeConfig(min_lease_s=0.5),
        )
        return Server(node, port=0)


async def test_a_job_due_while_a_claim_writes_is_pushed_without_waiting_for_it() -> None:
    store = HeldClaims()
    async with serving(store.server()) as (srv, channel):
        s = Stream(channel)
        await s.hello(t=10)
        store.hold.set()
        [first] = await schedule(srv, 1)
        await wait_until(lambda: store.held == 1, what="the first claim's write to start")
        # Request 2, read (its answer came) after the first claim took its time.
        beat = pb.HeartbeatRequest(job_id="not-a-job", fence=1, lease=dur(1000))
        await s.answer(await s.send(heartbeats=[beat]))
        assert not s.jobs
        [second] = await schedule(srv, 1)
        pushed = await s.read()
        assert [j.job.job_id for j in pushed.jobs] == [second], "not held behind the first"
        # The first claim, still unsent, read only request 1: no push may name a later one
        # before it (the worker keeps the send times of later requests only).
        assert pushed.after_seq == 1
        store.release.set()
        late = await s.read()
        assert [j.job.job_id for j in late.jobs] == [first]
        assert late.after_seq == 1


async def test_credits_a_claim_gives_back_while_another_waits_are_used_at_once() -> None:
    """Type ``a``'s one credit is held by a claim writing its job, so the claim that then
    waits for due jobs may take ``b`` only. The worker grants ``a`` another credit meanwhile
    (its slot freed); once the write ends, ``a`` has a credit the waiting claim may not use.
    The next ``a`` job must be pushed at once, not after the waiting claim's long wait (60 s):
    a worker with a busy and an idle type stalled so in CI."""
    store = HeldClaims()
    async with serving(store.server()) as (srv, channel):
        s = Stream(channel)
        await s.hello(a=1, b=1)
        store.hold.set()
        [first] = await schedule(srv, 1, job_type="a")
        await wait_until(lambda: store.held == 1, what="the first claim's write to start")
        # A credit for a while the first claim writes (the answer to the heartbeat shows the
        # node read the request).
        beat = pb.HeartbeatRequest(job_id="not-a-job", fence=1, lease=dur(1000))
        await s.answer(await s.send(credits=_credits({"a": 1}), heartbeats=[beat]))
        store.release.set()
        assert [j.job.job_id for j in await s.until_jobs(1)] == [first]
        [second] = await schedule(srv, 1, job_type="a")
        async with asyncio.timeout(10):
            pushed = await s.until_jobs(2)
        assert pushed[1].job.job_id == second


async def test_pushing_goes_on_after_each_claim_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every claim slot in use, the end of a claim must wake the pushing task again (it
    once woke before the claim's task was done, saw the slots full and slept for good with
    credits to use and jobs ready: on Cassandra at 400 jobs/s, within seconds)."""
    from timeshard.api import work

    monkeypatch.setattr(work, "PIPELINE", 1)
    async with serving() as (srv, channel):
        s = Stream(channel)
        await s.hello(t=10)
        for n in range(1, 4):
            await schedule(srv, 1)
            await s.until_jobs(n)


# -- heartbeats and results ---------------------------------------------------------------------


async def test_heartbeats_and_results_are_answered_per_item() -> None:
    async with serving() as (srv, channel):
        await schedule(srv, 2)
        s = Stream(channel)
        await s.hello(t=2)
        a, b = await s.until_jobs(2)
        seq = await s.send(
            heartbeats=[
                pb.HeartbeatRequest(job_id=a.job.job_id, fence=a.fence, lease=dur(5000)),
                pb.HeartbeatRequest(job_id=b.job.job_id, fence=b.fence + 7, lease=dur(5000)),
            ],
            results=[
                pb.FinishItem(job_id=a.job.job_id, fence=a.fence),
                pb.FinishItem(job_id=b.job.job_id, fence=b.fence - 1),
            ],
        )
        answer = await s.answer(seq)
        assert [h.job_id for h in answer.heartbeats] == [a.job.job_id, b.job.job_id]
        assert answer.heartbeats[0].code == OK and answer.heartbeats[0].lease.lease.seconds == 5
        assert answer.heartbeats[1].code == STALE.value[0], answer.heartbeats[1]
        assert "stale" in answer.heartbeats[1].message
        assert [r.job_id for r in answer.results] == [a.job.job_id, b.job.job_id]
        assert answer.results[0].code == OK
        assert answer.results[0].state == pb.JOB_STATE_SUCCEEDED
        assert answer.results[1].code == STALE.value[0], answer.results[1]
        assert (await srv.node.jobs.get(a.job.job_id)).state is JobState.SUCCEEDED
        job_b = await srv.node.jobs.get(b.job.job_id)
        assert job_b.state is JobState.RUNNING and job_b.fence == b.fence  # unchanged
        registry = srv.node.metrics.registry
        name = "timeshard_worker_stream_messages_total"
        assert registry.get_sample_value(name, {"direction": "in"}) == 2  # hello, this one
        assert (registry.get_sample_value(name, {"direction": "out"}) or 0) >= 3


async def test_results_of_several_streams_are_applied_in_one_group() -> None:
    async with serving() as (srv, channel):
        await schedule(srv, 4)
        streams = [Stream(channel), Stream(channel)]
        for s in streams:
            await s.hello(t=2)
        for s in streams:
            await s.until_jobs(2)
        calls: list[int] = []
        finish = srv.node.attempts.finish

        async def counting(items: Any, **kw: Any) -> Any:
            calls.append(len(items))
            return await finish(items, **kw)

        srv.node.attempts.finish = counting  # type: ignore[method-assign]
        seqs = [
            await s.send(
                results=[pb.FinishItem(job_id=c.job.job_id, fence=c.fence) for c in s.jobs]
            )
            for s in streams
        ]
        for s, seq in zip(streams, seqs, strict=True):
            assert all(r.code == OK for r in (await s.answer(seq)).results)
        assert sum(calls) == 4 and len(calls) <= 2, calls
        assert len(calls) < 4  # never one store call per result


# -- a broken stream ----------------------------------------------------------------------------


def fake_clock_server() -> tuple[Server, FakeClock]:
    clock = FakeClock(1_800_000_000_000)
    node = Node(
        store=SqliteStore(":memory:", num_shards=2),
        coordinator=LocalCoordinator(),
        clock=clock,
        config=NodeConfig(min_lease_s=0.5),
    )
    return Server(node, port=0), clock


@pytest.mark.parametrize("started", [True, False])
async def test_a_stream_that_breaks_mid_job_leaves_it_to_its_lease(started: bool) -> None:
    """The job runs again only after its lease is over, under a higher fence; the lease's end
    is a failed attempt if the worker had sent its start notice, else a delivery that did not
    start (invariant 9)."""
    srv, clock = fake_clock_server()
    async with serving(srv) as (srv, channel):
        await schedule(srv, 1)
        await advance(srv.node, clock, 0.5)
        s = Stream(channel)
        await s.hello(lease_ms=5_000, t=1)
        (first,) = await s.until_jobs(1)
        lease_until = ts_ms(first.lease_until)
        if started:
            notice = pb.HeartbeatRequest(job_id=first.job.job_id, fence=first.fence, started=True)
            await s.send(started=[notice])
            await wait_until(
                lambda: srv.node.starts.started(first.job.job_id, first.fence), what="the notice"
            )
        s.call.cancel()  # the worker's process died
        again = Stream(channel)
        await again.hello(lease_ms=5_000, t=1)
        await advance(srv.node, clock, 4.5)
        assert (await srv.node.jobs.get(first.job.job_id)).state is JobState.RUNNING
        assert not again.jobs
        await advance(srv.node, clock, 60, step=1)  # the lease, then the retry's backoff
        (second,) = await again.until_jobs(1)
        assert second.job.job_id == first.job.job_id
        assert second.fence > first.fence
        assert ts_ms(second.job.started_at) >= lease_until  # never while the first may run
        job = await srv.node.jobs.get(first.job.job_id)
        expected = "lease expired" if started else "not started"
        assert job.history[0].outcome == expected, job.history


# -- the SDK ------------------------------------------------------------------------------------


async def test_the_worker_falls_back_to_claims_on_a_node_without_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers.WorkerService, "Work", pb_grpc.WorkerServiceServicer.Work)
    srv = make_server()
    w = worker()

    @w.handler("t", timeout=30)
    async def handle(ctx: JobContext) -> None:
        pass

    async with working(w, [srv]):
        (job_id,) = await schedule(srv, 1)
        job = await wait_job(srv, await srv.node.jobs.get(job_id), lambda j: j.state.terminal)
        assert job.state is JobState.SUCCEEDED
        assert w._nodes is not None
        link = w._nodes.links[srv.address]
        assert not link.streaming and link._unary  # on Claim, not the stream


async def test_the_worker_takes_jobs_over_the_stream_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unary: list[str] = []
    for name in ("Claim", "Heartbeat", "Finish"):
        method = getattr(workers.WorkerService, name)

        def spy(method: Any = method, name: str = name) -> Any:
            async def called(self: Any, request: Any, context: Any) -> Any:
                unary.append(name)
                return await method(self, request, context)

            return called

        monkeypatch.setattr(workers.WorkerService, name, spy())
    srv = make_server()
    w = worker()

    @w.handler("t", timeout=30)
    async def handle(ctx: JobContext) -> None:
        pass

    async with working(w, [srv]):
        ids = await schedule(srv, 5)
        for job_id in ids:
            job = await wait_job(srv, await srv.node.jobs.get(job_id), lambda j: j.state.terminal)
            assert job.state is JobState.SUCCEEDED
        assert w._nodes is not None and w._nodes.links[srv.address].streaming
    assert unary == [], unary


async def test_a_cancel_of_a_running_job_reaches_its_handler_over_the_stream() -> None:
    srv = make_server()
    w = worker(lease_s=1.5, safety_margin_s=0.25)
    started, stopped = asyncio.Event(), asyncio.Event()

    @w.handler("t", timeout=60)
    async def handle(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async with working(w, [srv]) as run:
        (job_id,) = await schedule(srv, 1)
        await asyncio.wait_for(started.wait(), 20)
        await srv.node.jobs.cancel(job_id)
        await asyncio.wait_for(stopped.wait(), 20)
        await wait_until(lambda: any(k == "lost" for k, _, _ in run.events), 20, "lost")
        assert w._nodes is not None and w._nodes.links[srv.address].streaming
        assert (await srv.node.jobs.get(job_id)).state is JobState.CANCELLED


async def test_a_graceful_stop_gives_the_job_back_over_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: list[str] = []
    submit = WorkHub.submit

    def recording(self: WorkHub, group: Any) -> None:
        given.extend(i.job_id for i in group.results if getattr(i, "give_back", False))
        submit(self, group)

    monkeypatch.setattr(WorkHub, "submit", recording)
    srv = make_server()
    await srv.start()
    w = worker()
    started = asyncio.Event()

    @w.handler("t", timeout=60)
    async def handle(ctx: JobContext) -> None:
        started.set()
        await asyncio.Event().wait()

    (job_id,) = await schedule(srv, 1)
    task = asyncio.create_task(w.run([srv.address], discover_every_s=0))
    try:
        await asyncio.wait_for(started.wait(), 20)
        w.stop(0)
        await asyncio.wait_for(task, 30)
        assert given == [job_id]
        job = await srv.node.jobs.get(job_id)
        assert job.state is JobState.SCHEDULED and job.attempt == 0, job
        assert job.history[-1].outcome == "given back"
    finally:
        await srv.stop(0)


# -- bad messages -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "then", "says"),
    [
        (pb.WorkRequest(seq=1, credits=_credits({"t": 1})), None, "hello"),
        (
            pb.WorkRequest(seq=1, hello=pb.WorkHello(worker_id="w1"), credits=_credits({"": 1})),
            None,
            "credits[0].type",
        ),
        (
            pb.WorkRequest(seq=1, hello=pb.WorkHello(worker_id="w1")),
            pb.WorkRequest(seq=2, credits=_credits({"t": -1})),
            "credits[0].credits: must not be negative, got -1",
        ),
        (
            pb.WorkRequest(seq=1, hello=pb.WorkHello(worker_id="w1")),
            pb.WorkRequest(seq=5),
            "seq: must be 2",
        ),
        (pb.WorkRequest(seq=1, hello=pb.WorkHello(worker_id="")), None, "worker_id"),
    ],
)
async def test_a_bad_message_ends_the_stream_with_invalid_argument(
    first: pb.WorkRequest, then: pb.WorkRequest | None, says: str
) -> None:
    async with serving() as (_, channel):
        call: Any = pb_grpc.WorkerServiceStub(channel).Work()  # type: ignore[call-arg]
        await call.write(first)
        if then is not None:
            assert (await call.read()).seq == 1  # the welcome
            await call.write(then)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            while True:
                message = await asyncio.wait_for(call.read(), 10)
                assert message is not grpc.aio.EOF, "the stream ended without an error"  # type: ignore[attr-defined]
        assert raised.value.code() == INVALID
        assert says in (raised.value.details() or ""), raised.value.details()


# -- tokens -------------------------------------------------------------------------------------


async def test_the_stream_needs_a_worker_token_as_the_unary_calls_do(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    tokens = {role: add_token(path, f"{role.value}-1", [role.value]) for role in Role}
    node = Node(
        store=SqliteStore(":memory:", num_shards=2),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
    )
    srv = Server(node, port=0, security=ServerSecurity(auth=Authenticator(str(path))))
    await srv.start()
    try:
        for token, code in [
            ("", grpc.StatusCode.UNAUTHENTICATED),
            (tokens[Role.CLIENT], grpc.StatusCode.PERMISSION_DENIED),
            (tokens[Role.WORKER], None),
        ]:
            channel = ClientSecurity(token=token or None).aio_channel(srv.address)
            s = Stream(channel)
            if code is None:
                await s.hello(t=1)  # welcomed
            else:
                # The node refuses the stream when it opens, before any message: a read shows its
                # status. (A write racing that refusal fails with gRPC's own "Internal error from
                # Core", the refusal's status lost: a CI run saw it.)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async with asyncio.timeout(10):
                        await s.call.read()
                assert raised.value.code() == code, raised.value.details()
            await channel.close()
    finally:
        await srv.stop(0)


# -- shard ownership ----------------------------------------------------------------------------


async def test_jobs_of_a_shard_the_node_gave_up_are_not_pushed() -> None:
    """A shard moves away while a stream is open: its due job is not pushed by this node (its
    new owner pushes it); once the shard is back, it is."""
    srv, clock = fake_clock_server()
    async with serving(srv) as (srv, channel):
        node = srv.node
        (job_id,) = await schedule(srv, 1, delay_ms=2_000)
        shard = (await node.jobs.get(job_id)).shard
        s = Stream(channel)
        await s.hello(lease_ms=5_000, t=5)
        await node._shards_changed(frozenset(), frozenset({shard}))
        await advance(node, clock, 5)
        assert not s.jobs and not node.ready.holds("t", job_id)
        assert (await node.jobs.get(job_id)).state is JobState.SCHEDULED
        await node._shards_changed(frozenset({shard}), frozenset())
        await advance(node, clock, 2)
        (pushed,) = await s.until_jobs(1)
        assert pushed.job.job_id == job_id


# -- the lease deadline -------------------------------------------------------------------------


async def test_a_pushed_jobs_deadline_counts_from_the_request_the_node_had_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node took the claim ``held`` after reading request ``after_seq``: the worker's
    deadline runs from when it sent that request plus ``held``, never from when the push
    arrived (invariant 6); an idle stream's old request does not make the job look late."""
    monkeypatch.setattr(stream, "TICK_S", 3600.0)  # no idle request in between
    # Its start's grace (``worker.startat``) wide open: the worker's clock jumps 25 s here,
    # which would otherwise give the job back as a push that came too late to start.
    monkeypatch.setattr(startat, "START_GRACE_MS", 60_000)
    srv = make_server()
    clock = FakeClock(1_000)
    w = worker(lease_s=40.0, safety_margin_s=4.0, clock=clock)
    deadlines: list[float] = []
    release = asyncio.Event()

    @w.handler("t", timeout=60)
    async def handle(ctx: JobContext) -> None:
        # As it starts: the answer to its start notice extends the lease moments later.
        deadlines.append(ctx._lease.deadline)
        await release.wait()

    async with working(w, [srv]):
        await wait_until(lambda: w._nodes is not None and bool(w._nodes.links), 20, "running")
        assert w._nodes is not None
        link = w._nodes.links[srv.address]
        await wait_until(lambda: link.streaming, 20, "the stream open")
        # Its first credits may follow the hello in a request: wait until that one is sent
        # (stamped on the worker's clock before it moves), or the push may count from it.
        await wait_until(lambda: not link._has_out.is_set(), 20, "the first credits sent")
        hello_sent = link._sent[-1][1]  # the last request it sent
        clock.advance(25.0)  # the worker's clock moves on; it sends nothing meanwhile
        await schedule(srv, 1)
        (deadline,) = await wait_until(lambda: deadlines, 20, "the job pushed")
        # (the node's own clock is real: ``held`` is the real time it held the hello, small)
        assert hello_sent + 40.0 - 4.0 <= deadline <= hello_sent + 40.0 - 4.0 + 5.0
        release.set()  # (the drain would wait on the fake clock)
        await wait_until(lambda: not w._attempts.tasks, 20, "the job done")


async def test_the_credits_of_a_broken_stream_go_to_the_other_nodes() -> None:
    """Credits count as asked for across nodes; when one node's stream breaks, the slots they
    held are granted to the others at once, not after some job ends."""
    nodes = [make_server(), make_server()]
    w = worker()

    @w.handler("t", timeout=30, concurrency=4)
    async def handle(ctx: JobContext) -> None:
        pass

    async with working(w, nodes):
        await wait_until(lambda: w._nodes is not None and len(w._nodes.links) == 2, 20, "links")
        assert w._nodes is not None
        links = [w._nodes.links[s.address] for s in nodes]
        await wait_until(lambda: all(link.streaming for link in links), 20, "both streams")
        await wait_until(lambda: w._slots.asked("t") == 5, 20, "4 + 1 credits granted")
        rich = max(range(2), key=lambda i: links[i]._credits.get("t", 0))
        await nodes[rich].stop(0)
        other = links[1 - rich]
        await wait_until(lambda: other._credits.get("t", 0) == 4, 20, "the other node's credits")


async def test_results_ending_close_together_travel_in_one_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Results linger (``RESULT_LINGER_S``) for more to join their message: two handlers that
    end 50 ms apart under a 1 s linger send one result message with both, not two."""
    monkeypatch.setattr(results, "RESULT_LINGER_S", 1.0)
    srv = make_server()
    w = worker()
    release = {"a": asyncio.Event(), "b": asyncio.Event()}
    running: set[str] = set()

    @w.handler("t", timeout=30, concurrency=2)
    async def handle(ctx: JobContext) -> None:
        running.add(ctx.payload.decode())
        await release[ctx.payload.decode()].wait()

    async with working(w, [srv]):
        now = srv.node.clock.now_ms()
        ids = [
            (await srv.node.jobs.schedule(JobSpec(job_type="t", run_at=now, payload=p)))[0].job_id
            for p in (b"a", b"b")
        ]
        await wait_until(lambda: running == {"a", "b"}, 20, "both handlers running")
        registry = srv.node.metrics.registry
        before = registry.get_sample_value("timeshard_worker_messages_total", {"kind": "result"})
        release["a"].set()
        await asyncio.sleep(0.05)
        release["b"].set()
        for job_id in ids:
            job = await wait_job(srv, await srv.node.jobs.get(job_id), lambda j: j.state.terminal)
            assert job.state is JobState.SUCCEEDED
        after = registry.get_sample_value("timeshard_worker_messages_total", {"kind": "result"})
        assert (after or 0) - (before or 0) == 1


# -- start notices ------------------------------------------------------------------------------


def record_notices_and_results(
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[list[str], list[str]]]:
    """The job ids of the start notices and of the results of each request the nodes read
    that carried either, in order (filled as they come)."""
    from timeshard.api.work import WorkStream

    seen: list[tuple[list[str], list[str]]] = []
    take = WorkStream._take

    def recording(self: WorkStream, request: pb.WorkRequest) -> None:
        if request.started or request.results:
            seen.append(([n.job_id for n in request.started], [r.job_id for r in request.results]))
        take(self, request)

    monkeypatch.setattr(WorkStream, "_take", recording)
    return seen


@pytest.mark.parametrize("work_s", [0.0, 0.3], ids=["short", "long"])
async def test_a_start_notice_comes_no_later_than_the_jobs_result(
    work_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler starts without waiting for its start notice's write to complete; the notice
    still comes no later than the job's result (in an earlier request for a job that runs a
    while), and the attempt counts once."""
    seen = record_notices_and_results(monkeypatch)
    srv = make_server()
    await srv.start()
    w = worker()

    @w.handler("t", timeout=60, concurrency=4)  # (credits left at the node as it ends)
    async def handle(ctx: JobContext) -> None:
        await asyncio.sleep(work_s)

    (job_id,) = await schedule(srv, 1)
    task = asyncio.create_task(w.run([srv.address], discover_every_s=0))
    try:
        job = await wait_until(
            lambda: srv.node.jobs.get(job_id),
            30,
            "the job to succeed",
            until=lambda j: j.state is JobState.SUCCEEDED,
        )
        assert job.attempt == 1 and job.unstarted == 0, job
        noticed = next(n for n, (started, _) in enumerate(seen) if job_id in started)
        finished = next(n for n, (_, results) in enumerate(seen) if job_id in results)
        if work_s:
            assert noticed < finished, seen
        else:
            assert noticed <= finished, seen
    finally:
        w.stop(0)
        await asyncio.wait_for(task, 30)
        await srv.stop(0)
