"""Priorities within a type: higher first among the due jobs of a type, oldest first within a
level, and aging: a job of priority p goes before every job of priority q due more than
(q - p) * aging after it, so under a steady load of higher-priority jobs a low one waits at
most MAX_PRIORITY * aging longer than they do: it is never starved."""

from __future__ import annotations

import pytest

from tests.unit.helpers import START_MS, advance, running
from timeshard.errors import InvalidArgument
from timeshard.limits import DEFAULT_PRIORITY_AGING_MS, MAX_PRIORITY
from timeshard.node import JobSpec
from timeshard.node.ready import ReadyItem, ReadyQueues
from timeshard.testing.waits import wait_until


def item(job_id: str, run_at: int, priority: int = 0, shard: int = 0) -> ReadyItem:
    return ReadyItem(
        job_id=job_id, job_type="t", shard=shard, fence=0, run_at=run_at, priority=priority
    )


def ids(items: list[ReadyItem]) -> list[str]:
    return [i.job_id for i in items]


def test_higher_priority_first_then_oldest_first() -> None:
    q = ReadyQueues(aging_ms=1000)
    q.push(item("low-old", 0, 0))
    q.push(item("high-new", 500, 9))
    q.push(item("mid", 400, 5))
    q.push(item("high-old", 100, 9))
    assert ids(q.take(["t"], 10)) == ["high-old", "high-new", "mid", "low-old"]


def test_aging_lets_a_waiting_job_pass_newer_higher_ones() -> None:
    """p=0 due at 0 against p=9 jobs: it goes after those due up to 9 * aging after it, and
    before those due later."""
    aging = 1000
    q = ReadyQueues(aging_ms=aging)
    q.push(item("old-low", 0, 0))
    for t in (8_000, 9_000, 9_001, 12_000):
        q.push(item(f"high@{t}", t, 9))
    assert ids(q.take(["t"], 10)) == [
        "high@8000",
        "old-low",
        "high@9000",
        "high@9001",
        "high@12000",
    ]


def test_a_job_taken_and_given_back_keeps_its_place() -> None:
    q = ReadyQueues(aging_ms=1000)
    for n in range(4):
        q.push(item(f"j{n}", n))
    taken = q.take(["t"], 2)
    q.push_front(taken)
    assert ids(q.take(["t"], 4)) == ["j0", "j1", "j2", "j3"]


def test_equal_ranks_are_taken_a_shard_at_a_time() -> None:
    """A burst due at one instant: one claim spans the shards rather than emptying one."""
    q = ReadyQueues()
    for shard in range(4):
        for n in range(3):
            q.push(item(f"s{shard}-{n}", 0, shard=shard))
    first = q.take(["t"], 4)
    assert sorted(i.shard for i in first) == [0, 1, 2, 3]
    assert len(q.take(["t"], 100)) == 8


@pytest.mark.parametrize("aging_ms", [DEFAULT_PRIORITY_AGING_MS, 1000])
def test_a_low_job_is_never_starved_by_a_steady_higher_load(aging_ms: int) -> None:
    """Every 100 ms two priority-9 jobs come due and one job is taken: the queue of high jobs
    grows for ever. A priority-0 job due at 0 is still taken once the high jobs due before
    0 + 9 * aging are gone, i.e. within its bound (plus the backlog ahead of it)."""
    q = ReadyQueues(aging_ms=aging_ms)
    q.push(item("low", 0, 0))
    bound = MAX_PRIORITY * aging_ms
    taken_at = None
    for step in range(1, 10 * bound // 100):
        now = step * 100
        q.push(item(f"h{step}a", now, 9))
        q.push(item(f"h{step}b", now, 9))
        if ids(q.take(["t"], 1)) == ["low"]:
            taken_at = now
            break
    assert taken_at is not None, "starved"
    # Ahead of it: the high jobs due within the bound (2 per 100 ms), one taken per 100 ms.
    assert taken_at <= 2 * bound + 100


def test_without_aging_a_low_job_would_wait_for_ever() -> None:
    """The same load with an aging step longer than the run: the low job is not taken (what
    the test above would see without aging)."""
    q = ReadyQueues(aging_ms=10**9)
    q.push(item("low", 0, 0))
    for step in range(1, 2000):
        q.push(item(f"h{step}a", step * 100, 9))
        q.push(item(f"h{step}b", step * 100, 9))
        assert ids(q.take(["t"], 1)) != ["low"]


async def test_the_node_hands_out_higher_priority_jobs_first_and_refuses_bad_ones() -> None:
    async with running() as (node, clock):
        low = [
            (
                await node.jobs.schedule(
                    JobSpec(job_type="p", payload=b"", run_at=START_MS, priority=0)
                )
            )[0]
            for _ in range(5)
        ]
        high = [
            (
                await node.jobs.schedule(
                    JobSpec(job_type="p", payload=b"", run_at=START_MS + 10, priority=7)
                )
            )[0]
            for _ in range(5)
        ]
        assert {j.priority for j in high} == {7}
        assert (await node.jobs.get(high[0].job_id)).priority == 7
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == 10, what="all ready")
        got = await node.claims.claim(worker="w", types=["p"], limit=5, wait_s=0, lease_s=30)
        assert {c.job.job_id for c in got} == {j.job_id for j in high}
        rest = await node.claims.claim(worker="w", types=["p"], limit=5, wait_s=0, lease_s=30)
        assert {c.job.job_id for c in rest} == {j.job_id for j in low}
        for bad in (-1, MAX_PRIORITY + 1):
            with pytest.raises(InvalidArgument) as refused:
                await node.jobs.schedule(
                    JobSpec(job_type="p", payload=b"", run_at=START_MS, priority=bad)
                )
            assert refused.value.field == "priority" and "0-9" in str(refused.value)


async def test_wait_is_measured_by_priority() -> None:
    from prometheus_client import generate_latest

    from timeshard.views.metrics import node_registry

    async with running() as (node, clock):
        await node.jobs.schedule(JobSpec(job_type="p", payload=b"", run_at=START_MS, priority=3))
        await advance(node, clock, 2)
        await wait_until(lambda: node.ready.count() == 1, what="ready")
        assert (
            len(await node.claims.claim(worker="w", types=["p"], limit=1, wait_s=0, lease_s=30))
            == 1
        )
        text = generate_latest(node_registry(node)).decode()
        assert 'timeshard_claim_wait_seconds_count{priority="3"} 1.0' in text


def test_removed_jobs_are_never_handed_out_and_the_rest_keep_their_order() -> None:
    q = ReadyQueues(aging_ms=1000)
    for n in range(300):
        q.push(item(f"j{n:03}", n, priority=n % 3, shard=n % 2))
    for n in range(0, 300, 3):  # many removals: the shards' heaps are rebuilt on the way
        assert q.remove(f"j{n:03}") is not None
    q.push(item("j000", 0))  # a removed job queued again, as new
    assert q.count() == 201
    got = ids(q.take(["t"], 1000))
    assert len(got) == len(set(got)) == 201
    ranks = {i: (n - (n % 3) * 1000) for n in range(300) if (i := f"j{n:03}") in got}
    ranks["j000"] = 0
    assert got == sorted(got, key=lambda i: (ranks[i], i))
    assert q.count() == 0 and q.take(["t"], 10) == []


def test_the_server_flag_sets_the_aging() -> None:
    from timeshard.cli.main import build_parser
    from timeshard.cli.serve import _check_node_options, _node

    args = build_parser().parse_args(["server", "--priority-aging", "2"])
    _check_node_options(args)
    node = _node(args, "sqlite://:memory:", "local")
    assert node.ready.aging_ms == 2000
