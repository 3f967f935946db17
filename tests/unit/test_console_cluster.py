"""The console shows the whole cluster whichever node it is opened on: live numbers summed over
the nodes' own (``PeerService.Live``, no store read), the workers connected to every node, the
jobs backing off for a retry, the audit of every node's actions from the store, and "run now"
on a schedule counted by its overlap policy."""

from __future__ import annotations

import argparse
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from starlette.applications import Starlette

from tests.unit.helpers import START_MS, FixedCoordinator, embedded_server
from tests.unit.test_console import NoStore, csrf_of
from timeshard.api.live import live_from_pb, live_to_pb
from timeshard.api.peers import PeerChannels
from timeshard.cli.nodeoptions import secret_file
from timeshard.clock import FakeClock
from timeshard.coordinator.base import Member
from timeshard.errors import FailedPrecondition, InvalidArgument
from timeshard.model import Job, JobState, OverlapPolicy, Schedule
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.node.dispatcher import DispatchConfig
from timeshard.node.trigger import run_now
from timeshard.observe.retrying import RetryWaits
from timeshard.security.auth import Authenticator, Role, required_role
from timeshard.security.channel import ClientSecurity
from timeshard.store.base import JobClaim
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.console.access import session_secret
from timeshard.views.console.app import ConsoleSettings, build
from timeshard.views.console.audit import AuditEntry, AuditLog
from timeshard.views.console.live import Sampler
from timeshard.views.nodelive import AskLive, NodeLive, node_live
from timeshard.wire import dur

MEMBERS = [Member(node_id="a", address="a:1"), Member(node_id="b", address="b:1")]


class Cluster(FixedCoordinator):
    """Owns its shards for ever; the cluster's members are ``a`` and ``b``."""

    async def members(self) -> list[Member]:
        return list(MEMBERS)


@asynccontextmanager
async def two_nodes(tmp: Path) -> AsyncIterator[tuple[Node, Node, FakeClock]]:
    """Nodes ``a`` (every shard) and ``b`` (none) on one SQLite file and one fake clock."""
    clock = FakeClock(START_MS)
    config = NodeConfig(dispatch=DispatchConfig(lookahead_s=5, refresh_s=1, reread_s=5))
    a = Node(
        store=SqliteStore(tmp / "c.db", num_shards=4),
        coordinator=Cluster(range(4)),
        clock=clock,
        config=config,
        node_id="a",
    )
    b = Node(
        store=SqliteStore(tmp / "c.db", num_shards=4),
        coordinator=Cluster(()),
        clock=clock,
        config=config,
        node_id="b",
        rng=random.Random(3),  # a retry's jitter: later than now (a test below needs it)
    )
    await a.start()
    await b.start()
    try:
        yield a, b, clock
    finally:
        await b.stop()
        await a.stop()


def asker(nodes: dict[str, Node], failing: set[str] | None = None) -> Callable[[], AskLive]:
    """``PeerService.Live`` in process, through its protobuf message both ways."""

    async def ask(member: Member) -> NodeLive:
        if member.node_id in (failing or set()):
            raise ConnectionError(f"{member.node_id} is away")
        return live_from_pb(live_to_pb(node_live(nodes[member.node_id])))

    return lambda: ask


def job(job_type: str, n: int = 0) -> Job:
    return Job(
        job_id=f"j{n}", shard=0, job_type=job_type, payload=b"", run_at=START_MS, created_at=0
    )


async def test_the_live_numbers_are_every_nodes_summed_without_a_store_read(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path) as (a, b, clock):
        await a.jobs.schedule(JobSpec(job_type="mail", payload=b"", run_at=START_MS + 3_600_000))
        for n in range(2):
            await b.jobs.schedule(
                JobSpec(job_type="mail", payload=b"", run_at=START_MS + 3_600_000 + n)
            )
        sampler = Sampler(a, asker({"a": a, "b": b}))
        stores = a.store, b.store
        a.store = NoStore(stores[0])  # type: ignore[assignment]
        b.store = NoStore(stores[1])  # type: ignore[assignment]
        try:
            await sampler.ask_peers()
            first = sampler.sample()
            for _ in range(5):
                b.metrics.claimed(job("mail"), START_MS)  # five claims on b in the next second
            a.metrics.claimed(job("mail"), START_MS)
            b.metrics.started("mail", 0.004)  # schedule-to-start: 4 ms on b, 2 s on a
            a.metrics.started("mail", 2.0)
            b.metrics.retry_waits.retrying("j9", "mail", clock.now_ms() + 30_000)
            clock.advance(1.0)
            await sampler.ask_peers()
            second = sampler.sample()
        finally:
            a.store, b.store = stores
        (mail,) = [t for t in second.types if t.job_type == "mail"]
        assert mail.totals["scheduled"] == 3  # one scheduled on a, two on b
        assert mail.fire_rate == pytest.approx(6.0)  # claims of both nodes in that second
        assert mail.start_p99_ms >= 1900 and mail.start_p50_ms <= 5
        assert mail.retrying == 1
        assert [(n.node_id, n.owned, n.here, n.error) for n in second.nodes] == [
            ("a", 4, True, ""),
            ("b", 0, False, ""),
        ]
        assert second.owned == 4 and not second.note
        assert first.types[0].fire_rate == 0.0  # no rate before two answers of a node
        html = sampler_html(a, sampler)
        assert 'id="live-nodes"' in html and 'data-node="b"' in html


def sampler_html(node: Node, sampler: Sampler) -> str:
    _mount, parts = build(node, ConsoleSettings())
    try:
        template = parts.templates.get_template("_live.html")
        return template.render(sample=sampler.latest, series=sampler.series, prefix="/console")
    finally:
        parts.stop()


async def test_a_node_that_does_not_answer_is_shown_and_the_others_still_summed(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path) as (a, b, _clock):
        await b.jobs.schedule(JobSpec(job_type="mail", payload=b"", run_at=START_MS + 60_000))
        sampler = Sampler(a, asker({"a": a, "b": b}, failing={"b"}))
        await sampler.ask_peers()
        sample = sampler.sample()
        assert [(n.node_id, n.error) for n in sample.nodes] == [("a", ""), ("b", "b is away")]
        assert all(t.totals.get("scheduled", 0) == 0 for t in sample.types)

        quiet = Sampler(a, lambda: None)  # no way to call the peers (no TIMESHARD_PEER_TOKEN)
        await quiet.ask_peers()
        assert "TIMESHARD_PEER_TOKEN" in quiet.sample().note


def test_retries_are_counted_until_their_time_and_not_after() -> None:
    clock = FakeClock(START_MS)
    waits = RetryWaits(clock, max_remembered=3)
    waits.retrying("j1", "mail", START_MS + 1000)
    waits.retrying("j2", "mail", START_MS + 5000)
    waits.retrying("j3", "sms", START_MS + 5000)
    waits.retrying("j1", "mail", START_MS + 9000)  # failed again: its later retry counts
    assert waits.counts() == {"mail": 2, "sms": 1}
    waits.left("j3")  # cancelled
    clock.advance(6.0)
    assert waits.counts() == {"mail": 1}  # j2's retry is due now: it waits or runs
    for n in range(4, 9):
        waits.retrying(f"j{n}", "bulk", START_MS + 60_000 + n)
    assert sum(waits.counts().values()) == 3  # at most 3 remembered: the soonest forgotten


async def test_a_failed_attempt_is_counted_retrying_on_the_node_that_wrote_it(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path) as (a, b, clock):
        created, _ = await a.jobs.schedule(JobSpec(job_type="mail", payload=b"", run_at=START_MS))
        (out,) = await a.store.claim_jobs(
            [
                JobClaim(
                    job_id=created.job_id,
                    expect_fence=created.fence,
                    worker="w1",
                    now=clock.now_ms(),
                    lease_until=clock.now_ms() + 30_000,
                )
            ]
        )
        assert out.applied and out.job is not None
        failed = await b.attempts.fail(created.job_id, out.job.fence, "boom", permanent=False)
        assert failed.state is JobState.SCHEDULED and failed.run_at > clock.now_ms()
        assert b.metrics.retry_waits.counts() == {"mail": 1}
        assert a.metrics.retry_waits.counts() == {}
        clock.advance((failed.run_at - clock.now_ms()) / 1000)
        assert b.metrics.retry_waits.counts() == {}  # due again: waiting or running, not retrying


async def test_the_workers_page_lists_the_workers_of_every_node(tmp_path: Path) -> None:
    async with two_nodes(tmp_path) as (a, b, _clock):
        b.workers.stream_heard(object(), "w-stream", {"mail": 4})
        a.workers.claimed("w-poll", ["sms"], 2)
        mount, parts = build(a, ConsoleSettings(peers=asker({"a": a, "b": b})))
        transport = httpx.ASGITransport(app=Starlette(routes=[mount]))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            page = await client.get("/console/workers")
        parts.stop()
        assert page.status_code == 200
        rows = {
            w: row
            for w, row in (
                (w, page.text.split(f'data-worker="{w}"')[1].split("</tr>")[0])
                for w in ("w-stream", "w-poll")
            )
        }
        assert "<td>b</td>" in rows["w-stream"] and "mail (4)" in rows["w-stream"]
        assert "stream since" in rows["w-stream"]
        assert "<td>a</td>" in rows["w-poll"] and "sms (2)" in rows["w-poll"]
        assert "claims since" in rows["w-poll"]


async def test_workers_connect_by_stream_and_claim_and_peers_ask_for_them_over_grpc() -> None:
    async with embedded_server("n1") as server:
        node = server.node
        async with grpc.aio.insecure_channel(server.address) as channel:
            workers = pb_grpc.WorkerServiceStub(channel)
            await workers.Claim(
                pb.ClaimRequest(worker_id="w-poll", types=["sms"], max_jobs=3, wait=dur(0))
            )
            call = workers.Work()
            await call.write(
                pb.WorkRequest(
                    seq=1,
                    hello=pb.WorkHello(worker_id="w-stream", lease=dur(30_000)),
                    credits=[pb.WorkCredit(type="mail", credits=5)],
                )
            )
            await call.read()  # the welcome
            seen = {w.worker_id: w for w in node.workers.rows()}
            assert seen["w-stream"].stream and seen["w-stream"].credits == {"mail": 5}
            assert not seen["w-poll"].stream and seen["w-poll"].credits == {"sms": 3}

            peers = PeerChannels("n0", ClientSecurity())
            try:
                live = await peers.live_asker()(Member(node_id="n1", address=server.address))
            finally:
                await peers.close()
            assert live.node_id == "n1"
            assert sorted(w.worker_id for w in live.workers) == ["w-poll", "w-stream"]

            await call.done_writing()
            await wait_until(
                lambda: all(not w.stream for w in node.workers.rows()), what="stream gone"
            )
    assert required_role("/timeshard.v1.PeerService/Live") is Role.WORKER
    assert required_role("/timeshard.v1.AdminService/ListAudit") is Role.ADMIN


async def test_the_audit_is_the_clusters_from_the_store(tmp_path: Path) -> None:
    async with two_nodes(tmp_path) as (a, b, clock):
        on_a = AuditLog(a.store, a.clock, tmp_path / "a.jsonl")
        on_b = AuditLog(b.store, b.clock)
        for log, node, n in ((on_a, "a", 1), (on_b, "b", 2)):
            await log.append(
                AuditEntry(
                    at_ms=clock.now_ms() + n,
                    who="ann",
                    role="operator",
                    action="cancel",
                    target=f"job-{node}",
                    count=1,
                    node=node,
                )
            )
        assert [e.node for e in await on_a.read()] == ["b", "a"]  # newest first, both nodes
        assert [e.node for e in await on_b.read(1)] == ["b"]
        assert (tmp_path / "a.jsonl").read_text().count('"node":"a"') == 1  # the extra sink
        later = FakeClock(clock.now_ms() + 91 * 86_400_000)  # past the 90 days kept
        assert await AuditLog(a.store, later).read() == []


def occurrence_schedule(overlap: OverlapPolicy, max_concurrent: int = 1) -> Schedule:
    return Schedule(
        schedule_id="nightly",
        shard=0,
        cron="0 3 * * *",
        timezone="UTC",
        job_type="report",
        overlap=overlap,
        max_concurrent=max_concurrent,
        next_fire=0,
        created_at=0,
    )


async def trigger(node: Node) -> Any:
    return await run_now(node.store, node.clock, node.schedules, node.jobs, "nightly")


@pytest.mark.parametrize(
    ("overlap", "max_concurrent", "second"),
    [
        (OverlapPolicy.SKIP, 1, "overlap policy is skip"),
        (OverlapPolicy.ALLOW, 2, None),
        (OverlapPolicy.QUEUE, 1, "queued"),
    ],
)
async def test_run_now_is_counted_by_the_schedules_overlap_policy(
    tmp_path: Path, overlap: OverlapPolicy, max_concurrent: int, second: str | None
) -> None:
    async with two_nodes(tmp_path) as (a, _b, clock):
        await a.schedules.create(occurrence_schedule(overlap, max_concurrent))
        first = await trigger(a)
        stored = await a.schedules.get("nightly")
        assert first.job_id in stored.active  # a fire now counts it as a run
        assert (await a.jobs.get(first.job_id)).state is JobState.SCHEDULED
        clock.advance(0.001)
        if second is None:  # allow=2: a second run, then no third
            again = await trigger(a)
            assert (await a.schedules.get("nightly")).active == (first.job_id, again.job_id)
            clock.advance(0.001)
            with pytest.raises(FailedPrecondition, match="max_concurrent \\(2\\)"):
                await trigger(a)
        elif second == "queued":
            queued = await trigger(a)
            assert queued.queued and (await a.schedules.get("nightly")).queued_at > 0
            with pytest.raises(FailedPrecondition, match="one run waits already"):
                await trigger(a)
        else:
            with pytest.raises(FailedPrecondition, match=second):
                await trigger(a)
        await a.jobs.cancel(first.job_id)  # the first run over: room for another
        clock.advance(0.001)
        if second != "queued":
            assert (await trigger(a)).job_id


async def test_the_consoles_run_now_says_why_it_is_refused(tmp_path: Path) -> None:
    async with two_nodes(tmp_path) as (a, _b, _clock):
        await a.schedules.create(occurrence_schedule(OverlapPolicy.SKIP))
        mount, parts = build(a, ConsoleSettings())
        transport = httpx.ASGITransport(app=Starlette(routes=[mount]))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            page = await client.get("/console/schedules/nightly")
            url = "/console/schedules/nightly/trigger"
            ok = await client.post(url, data={"csrf": csrf_of(page.text)})
            refused = await client.post(url, data={"csrf": csrf_of(page.text)})
            audit = [e.action for e in await parts.audit.read()]
        parts.stop()
        assert ok.status_code == 303
        assert refused.status_code == 409
        assert "its overlap policy is skip: run now would overlap it" in refused.text
        assert audit == ["schedule-trigger"]  # the refused one changed nothing


async def test_a_session_survives_a_restart_with_the_secret_file(tmp_path: Path) -> None:
    key_file = tmp_path / "data" / "console-secret"
    secret = session_secret(key_file, create=True)
    assert key_file.stat().st_mode & 0o077 == 0  # readable by its owner only
    assert session_secret(key_file, create=True) == secret  # the same key at each start
    auth = Authenticator()
    token = auth.add_ephemeral("ann", [Role.VIEWER])
    async with two_nodes(tmp_path) as (a, _b, _clock):

        async def signed_in(cookies: httpx.Cookies | None, key: str) -> httpx.Response:
            mount, parts = build(a, ConsoleSettings(auth=auth, secret=key))
            transport = httpx.ASGITransport(app=Starlette(routes=[mount]))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://c", cookies=cookies
            ) as client:
                if cookies is None:
                    form = await client.get("/console/login")
                    await client.post(
                        "/console/login",
                        data={"token": token, "csrf": csrf_of(form.text), "next": "/console/"},
                    )
                page = await client.get("/console/types")
                page.extensions["cookies"] = client.cookies
            parts.stop()
            return page

        first = await signed_in(None, secret)
        assert first.status_code == 200
        again = await signed_in(first.extensions["cookies"], secret)  # "restarted": same key
        assert again.status_code == 200 and "ann · viewer" in again.text
        other = await signed_in(first.extensions["cookies"], "x" * 40)  # a new key per start
        assert other.status_code == 303 and "/console/login" in other.headers["location"]
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(InvalidArgument, match="holds 3 characters: give at least 32"):
        session_secret(short, create=False)
    assert secret_file("") == ""  # no flag: argparse passes its default through the type too
    assert secret_file(str(key_file)) == secret
    with pytest.raises(argparse.ArgumentTypeError, match="holds 3 characters"):
        secret_file(str(short))
