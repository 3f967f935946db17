"""The node's answer to a worker stream request that carried results only rides with the
stream's next push when jobs held ahead go out soon (``WorkStream._may_hold``): at a trickle the
two were a message each. Asserted on what the node writes, message by message: a held answer
goes with the push, never with an answer of heartbeats, and goes alone when no push is due or
the stream ends. Real node (embedded store, the system clock), the stream's writer driven by
hand through a recording context."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.unit.test_stream_starts_in import ahead_server, due_later
from tests.unit.test_worker_stream import serving
from timeshard.api import heldanswer
from timeshard.api.work import WorkStream, _Push
from timeshard.api.workers import finish_items
from timeshard.api.workhub import WorkHub
from timeshard.node.claims import Claimed
from timeshard.server import Server
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur


class Recording:
    """The stream's gRPC context as its writer sees it: what it writes, in order."""

    def __init__(self) -> None:
        self.written: list[pb.WorkResponse] = []

    async def write(self, message: pb.WorkResponse) -> None:
        self.written.append(message)

    def peer(self) -> str:
        return "test"


@asynccontextmanager
async def writer(
    srv: Server, hand_over_in_ms: int | None
) -> AsyncIterator[tuple[WorkStream, Recording, asyncio.Task[None]]]:
    """A stream of a worker that takes jobs ahead, its writer running; the node says its next
    hand-over of held jobs is ``hand_over_in_ms`` away (None: none held)."""
    node = srv.node
    node.next_hand_over = lambda: (  # type: ignore[method-assign]
        None if hand_over_in_ms is None else node.clock.now_ms() + hand_over_in_ms
    )
    context = Recording()
    stream = WorkStream(WorkHub(node, finish_items), context)  # type: ignore[arg-type]
    stream._worker, stream._lease_s, stream._starts_in = "w1", 10.0, True
    task = asyncio.create_task(stream._write_loop())
    try:
        yield stream, context, task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def answer(stream: WorkStream, message: pb.WorkResponse) -> None:
    """Queue ``message`` as the group commit does for a request it applied (owed first)."""
    stream._answers_due += 1
    stream.send(message)


def results_answer(seq: int, job_id: str = "j1") -> pb.WorkResponse:
    return pb.WorkResponse(seq=seq, results=[pb.FinishResult(job_id=job_id)])


async def push_of(srv: Server) -> _Push:
    job = await due_later(srv)
    return _Push(
        claimed=[Claimed(job=job, lease_ms=10_000)],
        took_at=srv.node.clock.monotonic(),
        response=pb.WorkResponse(after_seq=1, held=dur(0)),
    )


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def long_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A held answer waits a minute past the hand-over: what it rides with decides, not time."""
    monkeypatch.setattr(heldanswer, "HOLD_SLACK_MS", 60_000)


async def test_an_answer_to_results_rides_with_the_next_push(long_hold: None) -> None:
    async with serving(ahead_server()) as (srv, _), writer(srv, 20) as (stream, out, _):
        answer(stream, results_answer(2))
        await turns()
        assert out.written == [], "the answer went before the push it waits for"
        push = await push_of(srv)
        stream.send(push)
        (message,) = await wait_until(lambda: out.written, 10, "the push")
        assert message.seq == 2 and [r.job_id for r in message.results] == ["j1"]
        assert [c.job.job_id for c in message.jobs] == [push.claimed[0].job.job_id]
        assert message.after_seq == 1 and message.jobs[0].HasField("starts_in")


async def test_an_answer_goes_at_once_when_no_push_is_due() -> None:
    async with serving(ahead_server()) as (srv, _), writer(srv, None) as (stream, out, _):
        answer(stream, results_answer(2))
        (message,) = await wait_until(lambda: out.written, 10, "the answer")
        assert message.seq == 2 and not message.jobs


async def test_an_answer_to_heartbeats_never_waits(long_hold: None) -> None:
    async with serving(ahead_server()) as (srv, _), writer(srv, 20) as (stream, out, _):
        beat = pb.WorkResponse(seq=2, heartbeats=[pb.HeartbeatResult(job_id="j1")])
        beat.results.append(pb.FinishResult(job_id="j2"))
        answer(stream, beat)
        (message,) = await wait_until(lambda: out.written, 10, "the answer")
        assert message.seq == 2 and len(message.heartbeats) == 1


async def test_one_message_carries_one_answer(long_hold: None) -> None:
    """A second answer held while one waits: the first goes alone, the second with the push."""
    async with serving(ahead_server()) as (srv, _), writer(srv, 20) as (stream, out, _):
        answer(stream, results_answer(2, "j1"))
        answer(stream, results_answer(3, "j2"))
        (first,) = await wait_until(lambda: out.written, 10, "the first answer")
        assert first.seq == 2 and not first.jobs
        stream.send(await push_of(srv))
        await wait_until(lambda: len(out.written) == 2, 10, "the push")
        assert out.written[1].seq == 3 and len(out.written[1].jobs) == 1


async def test_a_held_answer_rides_with_a_revoke_too(long_hold: None) -> None:
    async with serving(ahead_server()) as (srv, _), writer(srv, 20) as (stream, out, _):
        answer(stream, results_answer(2))
        await turns()
        stream._revoke("j9", 4)
        (message,) = await wait_until(lambda: out.written, 10, "the revoke")
        assert message.seq == 2 and [r.job_id for r in message.revokes] == ["j9"]


async def test_a_held_answer_is_written_before_the_stream_ends(long_hold: None) -> None:
    async with serving(ahead_server()) as (srv, _), writer(srv, 20) as (stream, out, task):
        answer(stream, results_answer(2))
        await turns()
        assert out.written == []
        await asyncio.wait_for(stream._finish_writing(task), 10)
        assert [m.seq for m in out.written] == [2]
