"""A finished job's result is retried — on its node, then on the other nodes — until it is in or
the lease is over, and the lease is extended while the result is pending (once, a
completion refused with "job store unavailable" was dropped and the job ran again after its
lease). Real servers, the embedded store, the system clock; a store that fails on cue."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.base import Member
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import StoreUnavailable
from timeshard.model import Job, JobState, WriteResult
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.server import Server
from timeshard.store.base import Completion, JobClaim, RetryAt
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.worker import JobContext, Worker


class FlakyStore(SqliteStore):
    """Refuses results (and, if told, lease heartbeats or claims) as a store in an outage
    does."""

    results_down_until = 0.0
    heartbeats_down_until = 0.0
    claims_down_until = 0.0
    claims_refused = 0

    def _check(self, until: float) -> None:
        if time.monotonic() < until:
            raise StoreUnavailable("injected outage")

    async def complete_job(self, job_id: str, fence: int, now: int, **result: Any) -> WriteResult:
        self._check(self.results_down_until)
        return await super().complete_job(job_id, fence, now, **result)

    async def complete_jobs(
        self, items: Sequence[Completion], now: int, *, linger_s: float = 0.0
    ) -> list[WriteResult]:
        self._check(self.results_down_until)
        return await super().complete_jobs(items, now, linger_s=linger_s)

    async def fail_job(
        self, job_id: str, fence: int, now: int, error: str, retry_at: RetryAt, **more: Any
    ) -> WriteResult:
        self._check(self.results_down_until)
        return await super().fail_job(job_id, fence, now, error, retry_at, **more)

    async def heartbeat(
        self, job_id: str, fence: int, lease_until: int, **more: Any
    ) -> WriteResult:
        self._check(self.heartbeats_down_until)
        return await super().heartbeat(job_id, fence, lease_until, **more)

    async def claim_jobs(self, claims: Sequence[JobClaim]) -> list[WriteResult]:
        if time.monotonic() < self.claims_down_until:
            self.claims_refused += 1
            raise StoreUnavailable("injected outage")
        return await super().claim_jobs(claims)


class Cluster(LocalCoordinator):
    """Every node reports the same members; only an owner takes the shards."""

    members_list: list[Member] = []

    def __init__(self, owner: bool = True) -> None:
        super().__init__()
        self._owner = owner

    async def start(self, me: Member, num_shards: int, on_change: object) -> None:
        if self._owner:
            await super().start(me, num_shards, on_change)  # type: ignore[arg-type]
        else:
            self._me = me

    async def members(self) -> list[Member]:
        return list(self.members_list)


def server(path: Path, owner: bool = True) -> Server:
    node = Node(
        store=FlakyStore(path, num_shards=2),
        coordinator=Cluster(owner),
        clock=SystemClock(),
        config=NodeConfig(min_lease_s=0.5),
    )
    return Server(node, port=0)


def store_of(srv: Server) -> FlakyStore:
    store = srv.node.store
    assert isinstance(store, FlakyStore)
    return store


@asynccontextmanager
async def working(
    servers: list[Server], lease_s: float
) -> AsyncIterator[tuple[list[str], list[tuple[str, str]]]]:
    """A worker whose handler records each run and returns at once; its events."""
    for srv in servers:
        await srv.start()
    Cluster.members_list = [
        Member(node_id=str(i), address=s.address) for i, s in enumerate(servers)
    ]
    ran: list[str] = []
    events: list[tuple[str, str]] = []
    worker = Worker(
        worker_id="w",
        lease_s=lease_s,
        claim_wait_s=0.5,
        on_event=lambda kind, ctx, detail: events.append((kind, detail)),
    )

    @worker.handler("t")
    async def handle(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    stop = asyncio.Event()
    task = asyncio.create_task(worker.run([servers[0].address], stop, discover_every_s=0.2))
    try:
        yield ran, events
    finally:
        stop.set()
        await task
        for srv in servers:
            await srv.stop(0)


async def ended(job: Job, srv: Server, timeout: float) -> Job:
    """The job once it ended (succeeded, failed for good, ...)."""
    return await wait_until(
        lambda: srv.node.jobs.get(job.job_id),
        timeout,
        f"job {job.job_id} to end",
        until=lambda j: j.state.terminal,
        every=0.05,
    )


async def test_a_completion_refused_in_a_short_store_outage_is_retried_not_rerun(
    tmp_path: Path,
) -> None:
    srv = server(tmp_path / "db")
    async with working([srv], lease_s=4.0) as (ran, events):
        # The store is out for 1.5 s from the moment the job is due (well inside the lease
        # of 4 s, minus its margin): completions and heartbeats both fail meanwhile.
        store_of(srv).results_down_until = time.monotonic() + 1.5
        store_of(srv).heartbeats_down_until = time.monotonic() + 1.5
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        done = await ended(job, srv, timeout=40)  # generous: a busy 2-core box
        assert done.state is JobState.SUCCEEDED, (done, events)
        assert done.attempt == 1 and ran == [job.job_id]  # ran once
        # The worker hears the answer just after it is stored.
        await wait_until(lambda: ("succeeded", "") in events, 10, "the worker's event")


async def test_a_pending_result_keeps_its_lease_extended_past_the_lease(tmp_path: Path) -> None:
    srv = server(tmp_path / "db")
    # A 4 s lease, not a shorter one: on a busy 2-core box a loop stall of a second would cut
    # a lease of 1.5 s short and test the stall, not the pending result.
    async with working([srv], lease_s=4.0) as (ran, events):
        # Results are refused for twice the lease; heartbeats work: the lease is kept while the
        # result waits, so the job is neither released nor run again.
        store_of(srv).results_down_until = time.monotonic() + 8.0
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        done = await ended(job, srv, timeout=40)
        assert done.state is JobState.SUCCEEDED, (done, events)
        assert done.attempt == 1 and ran == [job.job_id]


async def test_a_result_goes_to_another_node_when_the_jobs_node_is_gone(tmp_path: Path) -> None:
    owner, other = server(tmp_path / "db"), server(tmp_path / "db", owner=False)
    async with working([owner, other], lease_s=4.0) as (ran, events):
        await asyncio.sleep(0.5)  # the worker discovers both nodes
        store_of(owner).results_down_until = time.monotonic() + 60  # its node never takes it
        job, _ = await owner.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await wait_until(lambda: ran, 10, "the job run")
        await owner.stop(0)  # and now the node is gone altogether
        done = await ended(job, other, timeout=40)
        assert done.state is JobState.SUCCEEDED, (done, events)
        assert done.attempt == 1 and ran == [job.job_id]


async def test_a_result_is_given_up_when_the_lease_ends_first(tmp_path: Path) -> None:
    srv = server(tmp_path / "db")
    async with working([srv], lease_s=1.5) as (_, events):
        store_of(srv).results_down_until = time.monotonic() + 60
        store_of(srv).heartbeats_down_until = time.monotonic() + 60
        await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        await wait_until(lambda: any(k == "unreported" for k, _ in events), 10, "unreported")
        kinds = [k for k, _ in events]
        assert "unreported" in kinds and "succeeded" not in kinds, events
        detail = next(d for k, d in events if k == "unreported")
        assert "injected outage" in detail and "lease expiry" in detail


async def test_claims_failing_in_a_store_outage_back_off_and_are_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker stream's claims, refused while the store is away, were tried again every
    tenth of a second each and logged each time (a hundred warnings a second on a node of the
    soak with faults); now they back off to one a second and a stream says so once, then once
    more when claims work again. The job due in the outage runs once it is over."""
    srv = server(tmp_path / "db")
    async with working([srv], lease_s=4.0) as (ran, events):
        await asyncio.sleep(0.5)  # the stream is open, its claim waiting
        store = store_of(srv)
        with caplog.at_level(logging.INFO, logger="timeshard.api.work"):
            store.claims_down_until = time.monotonic() + 3.0
            job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
            done = await ended(job, srv, timeout=40)
        assert done.state is JobState.SUCCEEDED, (done, events)
        assert ran == [job.job_id]
        failed = [r for r in caplog.records if "claim failed" in r.getMessage()]
        again = [r for r in caplog.records if "claims succeed again" in r.getMessage()]
        assert len(failed) == 1, [r.getMessage() for r in failed]
        assert len(again) == 1, [r.getMessage() for r in caplog.records]
        # Backing off: a tenth of a second doubled up to a second, for about three seconds
        # (the old fixed tenth of a second: thirty tries or more for each claim in flight).
        assert 1 <= store.claims_refused <= 4 * 8, store.claims_refused
