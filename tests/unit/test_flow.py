"""Flow control of a job type: a rate (jobs started per second, cluster-wide, with a burst)
and a pause. Held jobs stay ready, in order, and never pin their shard's cursor; a resume
releases them at the type's rate; a node's share of the rate follows the shards it owns, and
a takeover never releases a second burst. All on the fake clock: counts per window of the
clock, not timings."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.unit.helpers import START_MS, advance, make_node, settle
from timeshard.clock import FakeClock
from timeshard.coordinator.base import Coordinator, Member, ShardsChanged
from timeshard.errors import InvalidArgument
from timeshard.node import JobSpec, Node, NodeConfig, TypePolicy
from timeshard.node.dispatcher import DispatchConfig
from timeshard.node.flow import FlowChange, TypeFlow, default_burst
from timeshard.sharding import minute_of
from timeshard.store.sqlite import SqliteStore

STEP_S = 0.02


@asynccontextmanager
async def running(shards: int) -> AsyncIterator[tuple[Node, FakeClock]]:
    node, clock = make_node(shards=shards)
    await node.start()
    try:
        yield node, clock
    finally:
        await node.stop()


async def schedule(node: Node, n: int, job_type: str = "mail", at: int = START_MS) -> list[str]:
    ids = []
    for _ in range(n):
        job, _ = await node.jobs.schedule(JobSpec(job_type=job_type, payload=b"", run_at=at))
        ids.append(job.job_id)
    return ids


async def claim_all(node: Node, job_type: str = "mail") -> list[str]:
    got = await node.claims.claim(worker="w", types=[job_type], limit=1000, wait_s=0, lease_s=600)
    return [c.job.job_id for c in got]


async def run_claims(
    nodes: Iterable[Node], clock: FakeClock, seconds: float, job_type: str = "mail"
) -> list[tuple[float, str]]:
    """Claim as fast as each node lets us for ``seconds`` of the fake clock; every claim
    (the clock's seconds since START_MS, the node)."""
    nodes = list(nodes)
    out: list[tuple[float, str]] = []
    steps = round(seconds / STEP_S)
    for _ in range(steps):
        for node in nodes:
            for _job in await claim_all(node, job_type):
                out.append(((clock.now_ms() - START_MS) / 1000, node.node_id))
        clock.advance(STEP_S)
        await settle(nodes[0])
    return out


def per_window(times: Iterable[float], start: float, end: float, window: float) -> list[int]:
    """Counts over every window of ``window`` seconds in [start, end), sliding by 0.1 s."""
    ts = sorted(times)
    counts = []
    t = start
    while t + window <= end + 1e-9:
        counts.append(sum(1 for x in ts if t <= x < t + window))
        t += 0.1
    return counts


async def test_a_rate_holds_over_every_10_s_window_and_is_reached_under_overload() -> None:
    async with running(shards=4) as (node, clock):
        await node.type_policies.set_flows([FlowChange(job_type="mail", rate=20)])
        await schedule(node, 800)
        await advance(node, clock, 0.1)
        claims = await run_claims([node], clock, 30)
    counts = per_window((t for t, _ in claims), 1.0, 30.0, 10.0)
    assert max(counts) <= 20 * 10 + default_burst(20), counts
    assert min(counts) >= 20 * 10 * 0.9, counts  # the rate is reached, not just respected
    assert len(claims) <= 20 * 30 + default_burst(20)


async def test_a_paused_type_keeps_its_jobs_ready_in_order_and_does_not_pin_the_cursor() -> None:
    async with running(shards=1) as (node, clock):
        await node.type_policies.set_flows([FlowChange(job_type="mail", paused=True)])
        first = await schedule(node, 3, at=START_MS + 1000)
        later = await schedule(node, 2, at=START_MS + 2000)
        other = await schedule(node, 1, job_type="sms", at=START_MS + 1000)
        await advance(node, clock, 3)
        assert await claim_all(node) == []
        assert node.claims.held("mail") == "paused"
        assert await claim_all(node, "sms") == other  # another type is not held
        await advance(node, clock, 150, step=5)  # minutes pass while paused
        cursor = (await node.store.get_shard(0)).cursor
        assert cursor > minute_of(START_MS + 2000) + 1, (
            "held jobs must not pin their shard's cursor"
        )
        assert await claim_all(node) == []
        for job_id in first + later:
            assert (await node.jobs.get(job_id)).state.value == "scheduled"
        await node.type_policies.set_flows([FlowChange(job_type="mail", paused=False)])
        assert node.claims.held("mail") == ""
        got = await claim_all(node)
        assert got[:3] == first[:3] or sorted(got[:3]) == sorted(first), got
        assert set(got) == set(first + later)
        assert got.index(later[0]) > max(got.index(j) for j in first), "oldest first"


async def test_resume_releases_at_the_rate_never_a_stampede() -> None:
    async with running(shards=2) as (node, clock):
        await node.type_policies.set_flows(
            [FlowChange(job_type="mail", rate=10, burst=5, paused=True)]
        )
        await schedule(node, 300)
        await advance(node, clock, 120, step=5)  # a long pause: the bucket may fill, no more
        assert await claim_all(node) == []
        await node.type_policies.set_flows([FlowChange(job_type="mail", paused=False)])
        claims = await run_claims([node], clock, 12)
    assert sum(1 for t, _ in claims if t < 120.001) <= 5, "at most the burst at once"
    counts = per_window((t for t, _ in claims), 120.0, 132.0, 10.0)
    assert max(counts) <= 10 * 10 + 5, counts
    assert min(counts) >= 90, counts


async def test_a_limit_removed_or_raised_wakes_a_waiting_claim() -> None:
    async with running(shards=1) as (node, clock):
        await node.type_policies.set_flows([FlowChange(job_type="mail", paused=True)])
        await schedule(node, 2)
        await advance(node, clock, 1)
        waiting = node.claims.claim(worker="w", types=["mail"], limit=5, wait_s=30, lease_s=60)
        task = asyncio.ensure_future(waiting)
        await settle(node)
        assert not task.done()
        await node.type_policies.set_flows([FlowChange(job_type="mail", paused=False)])
        got = await asyncio.wait_for(task, 5)
        assert len(got) == 2


class Movable(Coordinator):
    """A coordinator whose shards a test gives and takes."""

    def __init__(self, shards: Iterable[int]) -> None:
        self._owned = frozenset(shards)
        self._on_change: ShardsChanged | None = None

    async def start(self, me: Member, num_shards: int, on_change: ShardsChanged) -> None:
        self._on_change = on_change
        await on_change(self._owned, frozenset())

    async def move(self, gained: Iterable[int], lost: Iterable[int]) -> None:
        assert self._on_change is not None
        g, lo = frozenset(gained), frozenset(lost)
        self._owned = (self._owned | g) - lo
        await self._on_change(g, lo)

    async def stop(self) -> None:
        pass

    def owned(self) -> frozenset[int]:
        return self._owned

    async def members(self) -> list[Member]:
        return []

    async def owners(self) -> dict[int, str]:
        return {}


@asynccontextmanager
async def two_nodes(db: Path, clock: FakeClock) -> AsyncIterator[tuple[Node, Node]]:
    config = NodeConfig(dispatch=DispatchConfig(lookahead_s=5, refresh_s=1, reread_s=5))
    nodes = [
        Node(
            store=SqliteStore(db, num_shards=4),
            coordinator=Movable(shards),
            clock=clock,
            config=NodeConfig(dispatch=config.dispatch),
            node_id=name,
        )
        for name, shards in (("a", (0, 1)), ("b", (2, 3)))
    ]
    for n in nodes:
        await n.start()
    try:
        yield nodes[0], nodes[1]
    finally:
        for n in nodes:
            await n.stop()


async def test_two_nodes_share_one_rate_and_a_takeover_releases_no_second_burst(
    tmp_path: Path,
) -> None:
    clock = FakeClock(START_MS)
    async with two_nodes(tmp_path / "db", clock) as (a, b):
        await a.type_policies.set_flows([FlowChange(job_type="mail", rate=20, burst=40)])
        await b.type_policies.load()  # what its refresh does within seconds
        await schedule(a, 1500)
        await advance(a, clock, 20, step=1)  # idle, both buckets fill: 20 tokens each
        shared = await run_claims([a, b], clock, 20)
        nodes = Counter(n for _, n in shared)
        assert nodes["a"] > 100 and nodes["b"] > 100, nodes  # each node starts its share
        counts = per_window((t for t, _ in shared), 20.0, 40.0, 10.0)
        assert max(counts) <= 20 * 10 + 40, counts
        assert min(counts) >= 20 * 10 * 0.9, counts
        await advance(a, clock, 10, step=1)  # idle again: both buckets full once more
        assert a.flow.room("mail", a.claims.share()) == 20
        spent_by_b = len(await claim_all(b))  # b spends its burst, then loses its shards
        assert spent_by_b == 20
        await b.coordinator.move((), (2, 3))  # type: ignore[attr-defined]
        await a.coordinator.move((2, 3), ())  # type: ignore[attr-defined]
        rooms = [n.flow.room("mail", n.claims.share()) or 0 for n in (a, b)]
        assert spent_by_b + sum(rooms) <= 40, f"b spent {spent_by_b}, then tokens: {rooms}"
        await advance(a, clock, 0.5)
        after = await run_claims([a, b], clock, 10)
    at = 50.5
    assert all(n == "a" for _, n in after)
    first_s = spent_by_b + sum(1 for t, _ in after if t < at + 1)  # over [50, 51.5) s
    assert first_s <= 40 + 20 * 1.5, f"{first_s} in the first second after the takeover: a 2x burst"
    assert len(after) <= 20 * 10 + 40, len(after)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rate": -1.0}, "rate"),
        ({"rate": float("nan")}, "rate"),
        ({"rate": 2e6}, "rate"),
        ({"rate": 5.0, "burst": -3}, "burst"),
        ({"burst": 10}, "burst"),
        ({}, "flow"),
    ],
)
def test_bad_flow_input_is_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        FlowChange(job_type="mail", **change)  # type: ignore[arg-type]
    assert err.value.field == field


def test_a_burst_without_a_rate_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="burst"):
        TypeFlow(burst=3)


async def test_a_rate_and_a_concurrency_limit_both_hold() -> None:
    node, clock = make_node(shards=1, types={"mail": TypePolicy(concurrency=2)})
    await node.start()
    try:
        await node.type_policies.set_flows([FlowChange(job_type="mail", rate=100, burst=100)])
        await schedule(node, 10)
        assert await claim_all(node) == []  # the bucket starts empty
        await advance(node, clock, 2)
        assert len(await claim_all(node)) == 2, "the concurrency limit, though tokens remain"
        assert (node.flow.room("mail", 1.0) or 0) >= 90, "only the jobs started spent tokens"
    finally:
        await node.stop()
