"""A cancel through a node that does not dispatch the job's shard (``timeshard.node.revokes``):
written there, then revoked through the owner, and answered with the owner's answer (dropped
from its hold, or the worker's answer to the revoke); only with no answer from the owner does
it wait out the latest start of a push made at the claim. The owner acts only on a lease the
store shows ended. Two nodes on one SQLite file and the fake clock, the owner asked in-process;
the gRPC end (``PeerService.Revoke``) on a real server. And the owner's wait for a start
notice: a push written meanwhile is revoked then."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from tests.unit.helpers import START_MS, FixedCoordinator, advance, embedded_server, settle
from tests.unit.test_claim_ahead import DUE, schedule, waiting_claim
from timeshard.api.peers import PeerChannels
from timeshard.clock import FakeClock
from timeshard.coordinator.base import Member
from timeshard.limits import START_GRACE_MS
from timeshard.model import Job, JobState
from timeshard.node import Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.node.starts import StartNotices
from timeshard.security.auth import Role, required_role
from timeshard.security.channel import ClientSecurity
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc

OWNER = Member(node_id="a", address="a:1")


class OwnedByA(FixedCoordinator):
    """Owns no shard; node ``a`` dispatches every one."""

    def __init__(self) -> None:
        super().__init__(())
        self.forgotten: list[str] = []

    def peer_for(self, shard: int) -> Member | None:
        return OWNER

    def forget_peer(self, node_id: str) -> None:
        self.forgotten.append(node_id)


@asynccontextmanager
async def owner_and_other(
    tmp_path: Path, *, reachable: bool = True
) -> AsyncIterator[tuple[Node, Node, FakeClock, list[tuple[str, int]]]]:
    """Node ``a`` owns every shard and claims ahead (300 ms); node ``b`` owns none and asks
    ``a`` about the leases it cancels (in-process), or fails to (``reachable`` False). Yields
    ``(a, b, clock, asked)``: ``asked`` the leases ``b`` asked about."""
    clock = FakeClock(START_MS)
    db = tmp_path / "shared.db"
    dispatch = DispatchConfig(claim_ahead_ms=300, lookahead_s=5, refresh_s=1, reread_s=5)
    a = Node(
        store=SqliteStore(db, num_shards=4),
        coordinator=FixedCoordinator(range(4)),
        clock=clock,
        config=NodeConfig(dispatch=dispatch),
        node_id="a",
    )
    b = Node(
        store=SqliteStore(db, num_shards=4),
        coordinator=OwnedByA(),
        clock=clock,
        config=NodeConfig(dispatch=dispatch),
        node_id="b",
    )
    asked: list[tuple[str, int]] = []

    async def ask(
        peer: Member, job_id: str, fence: int, wait_s: float, timeout_s: float
    ) -> bool | None:
        assert peer == OWNER and timeout_s > wait_s
        asked.append((job_id, fence))
        if not reachable:
            raise ConnectionError("a is down")
        return await a.revokes.answer(job_id, fence, wait_s)

    b.revokes.use(ask)
    await a.start()
    await b.start()
    try:
        yield a, b, clock, asked
    finally:
        await b.stop()
        await a.stop()


async def held_job(a: Node, clock: FakeClock) -> tuple[Job, asyncio.Task]:  # type: ignore[type-arg]
    """A job due at ``DUE``, claimed ahead by ``a`` and held (a claim waits for it)."""
    (job_id,) = await schedule(a, 1)
    claim = waiting_claim(a)
    await advance(a, clock, 1.9, step=0.1)  # 100 ms before due: claimed ahead by now
    job = await wait_until(
        lambda: a.jobs.get(job_id), 10, "held", until=lambda j: j.state is JobState.RUNNING
    )
    assert job.lease_owner == a.ahead.holder
    return job, claim


def revokes_asked(node: Node) -> dict[str, int]:
    """The revokes ``node`` asked of other owners, by outcome, as its metrics count them
    (``timeshard_revokes_asked_total``); the same as its own ``revokes.counts``."""
    metric = node.metrics.revokes_asked
    out = {
        s.labels["outcome"]: int(s.value)
        for m in metric.collect()
        for s in m.samples
        if s.name.endswith("_total") and s.value
    }
    assert out == dict(node.revokes.counts), (out, node.revokes.counts)
    return out


async def test_a_cancel_through_another_node_drops_the_job_its_owner_holds(
    tmp_path: Path,
) -> None:
    async with owner_and_other(tmp_path) as (a, b, clock, asked):
        job, claim = await held_job(a, clock)
        # The fake clock stands still: an answer now is the owner's, not the bound's (which
        # would come at the due time plus the start's grace).
        out = await asyncio.wait_for(b.jobs.cancel(job.job_id, wait_s=30), 10)
        assert out.state is JobState.CANCELLED and not out.start_noticed
        assert asked == [(job.job_id, job.fence)]
        assert revokes_asked(b) == {"not_started": 1}
        await advance(a, clock, 1.0, step=0.1)
        await settle(a)
        assert not claim.done(), "the owner handed out a job cancelled through another node"
        assert a.ready.count() == 0
        claim.cancel()


async def test_a_reschedule_through_another_node_drops_the_job_its_owner_holds(
    tmp_path: Path,
) -> None:
    """As a cancel: written there, the owner drops the job from its hold, and the job is
    handed out at its new time, not its old one."""
    async with owner_and_other(tmp_path) as (a, b, clock, asked):
        job, claim = await held_job(a, clock)
        later = DUE + 5000
        out = await asyncio.wait_for(b.jobs.reschedule(job.job_id, later, wait_s=30), 10)
        assert (out.state, out.run_at, out.attempt) == (JobState.SCHEDULED, later, 0)
        assert not out.start_noticed and asked == [(job.job_id, job.fence)]
        assert revokes_asked(b) == {"not_started": 1}
        await advance(a, clock, 1.0, step=0.1)
        await settle(a)
        assert not claim.done(), "the owner handed out at its old time a job moved elsewhere"
        await advance(a, clock, (later - clock.now_ms()) / 1000 + 1.5, step=0.1)
        await wait_until(claim.done, 10, "the job at its new time")
        assert [c.job.job_id for c in claim.result()] == [job.job_id]
        assert clock.now_ms() >= later


@pytest.mark.parametrize("started", [False, True])
async def test_a_cancel_through_another_node_is_answered_with_the_workers_revoke(
    tmp_path: Path, started: bool
) -> None:
    async with owner_and_other(tmp_path) as (a, b, clock, asked):
        (job_id,) = await schedule(a, 1)
        claim = asyncio.create_task(
            a.claims.claim(worker="w", types=["t"], limit=1, wait_s=60, lease_s=30, early=True)
        )
        await advance(a, clock, 1.9, step=0.1)
        await wait_until(claim.done, 10, "the held job handed to a worker that starts it later")
        (c,) = claim.result()
        assert clock.now_ms() < DUE
        revoked: list[tuple[str, int]] = []
        # As the worker stream does when it pushes a job with starts_in (``api.work``).
        a.starts.pushed(job_id, c.job.fence, DUE + START_GRACE_MS, lambda *r: revoked.append(r))
        cancel = asyncio.create_task(b.jobs.cancel(job_id, wait_s=30))
        await wait_until(lambda: revoked, 10, "the owner's revoke on the worker's stream")
        assert revoked == [(job_id, c.job.fence)] and asked == revoked
        await settle(a)
        assert not cancel.done(), "answered before the worker answered the revoke"
        a.starts.answered(job_id, c.job.fence, started)
        out = await asyncio.wait_for(cancel, 10)
        assert out.state is JobState.CANCELLED and out.start_noticed is started
        assert revokes_asked(b) == {"started" if started else "not_started": 1}


async def test_with_the_owner_unreachable_the_cancel_waits_out_the_latest_start(
    tmp_path: Path,
) -> None:
    async with owner_and_other(tmp_path, reachable=False) as (a, b, clock, asked):
        job, claim = await held_job(a, clock)
        claim.cancel()  # (the worker went away: nothing takes the job at its due time)
        cancel = asyncio.create_task(b.jobs.cancel(job.job_id, wait_s=30))
        await wait_until(lambda: asked, 10, "the ask")
        await advance(b, clock, (DUE + START_GRACE_MS - clock.now_ms()) / 1000 - 0.1, 0.1)
        assert not cancel.done(), "answered while a worker could still start it"
        await advance(b, clock, 1.0, step=0.1)
        await wait_until(cancel.done, 10, "the cancel's answer")
        assert not cancel.result().start_noticed
        assert revokes_asked(b) == {"failed": 1}
        assert b.coordinator.forgotten == ["a"]  # type: ignore[attr-defined]


async def test_the_owner_acts_only_on_a_lease_the_store_shows_ended(tmp_path: Path) -> None:
    async with owner_and_other(tmp_path) as (a, _, clock, _asked):
        job, claim = await held_job(a, clock)
        assert await a.revokes.answer(job.job_id, job.fence, 0.0) is None  # not cancelled
        assert await a.revokes.answer("no-such-job", 1, 0.0) is None
        await advance(a, clock, 0.2, step=0.05)
        await wait_until(claim.done, 10, "the held job handed out at its due time")
        assert [c.job.job_id for c in claim.result()] == [job.job_id]


async def test_a_lease_the_owner_did_not_claim_gets_no_answer(tmp_path: Path) -> None:
    """A failover since the claim: the owner asked never had that lease, so the cancel waits
    out its latest start as before."""
    async with owner_and_other(tmp_path) as (a, b, clock, asked):
        job, claim = await held_job(a, clock)
        claim.cancel()
        a.dispatchers[job.shard].forget(job.job_id)  # (as if another node had claimed it)
        cancel = asyncio.create_task(b.jobs.cancel(job.job_id, wait_s=30))
        await wait_until(lambda: asked, 10, "the ask")
        await settle(b)
        assert not cancel.done()
        await advance(b, clock, (DUE + START_GRACE_MS - clock.now_ms()) / 1000 + 1.0, 0.1)
        await wait_until(cancel.done, 10, "the cancel's answer")
        assert revokes_asked(b) == {"unknown": 1}


async def test_the_revoke_rpc_answers_and_refuses_bad_input() -> None:
    assert required_role("/timeshard.v1.PeerService/Revoke") is Role.WORKER
    async with embedded_server() as server:
        channels = PeerChannels("n0", ClientSecurity())
        try:
            ask = channels.revoker()
            me = Member(node_id=server.node.node_id, address=server.address)
            assert await ask(me, "no-such-job", 3, 0.0, 5.0) is None  # it can not say
        finally:
            await channels.close()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = pb_grpc.PeerServiceStub(ch)
            for bad, field in [
                (pb.RevokeRequest(job_id="a b", fence=1), "job_id"),
                (pb.RevokeRequest(job_id="j", fence=0), "fence"),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Revoke(bad, timeout=5)
                assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert field in (err.value.details() or "")


async def test_a_push_written_while_a_cancel_waits_for_its_notice_is_revoked() -> None:
    """A claim hands a held job out (delivered) and writes its push with ``starts_in`` after
    that (``WorkStream._start_in_by``): a cancel that began waiting for the start notice in
    between revokes the push as it is registered, and answers with the worker's word, not
    with "no notice came"."""
    clock = FakeClock(START_MS)
    starts = StartNotices(clock, lambda job_type, seconds: None)
    job = Job(job_id="j1", shard=0, job_type="t", run_at=DUE, created_at=START_MS, fence=4)
    starts.delivered(job.with_(state=JobState.RUNNING))
    answer = asyncio.create_task(starts.started_by("j1", 4, timeout_s=30))
    await asyncio.sleep(0)  # (waiting for the notice now)
    revoked: list[tuple[str, int]] = []
    starts.pushed("j1", 4, DUE + START_GRACE_MS, lambda *r: revoked.append(r))
    await wait_until(lambda: revoked, 5, "the revoke of the push written meanwhile")
    assert revoked == [("j1", 4)] and not answer.done()
    starts.answered("j1", 4, started=False)
    assert await asyncio.wait_for(answer, 5) is False
