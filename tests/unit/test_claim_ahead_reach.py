"""Fewer, larger claims ahead at a trickle (``node.ahead.take_ahead``, ``reach_ms``): a claim
ahead is made once the first job not claimed is due within half the window, takes every job
due within the window and, while it has fewer than ``AHEAD_BATCH``, the jobs due within the
reach whose rows lie in a partition it writes anyway. A burst is not kept waiting, nothing is
taken past the reach, and a job claimed early is still handed over no earlier than a window
before it is due, and to a worker that does not start on its own clock only at its due time."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import pytest

from tests.unit.helpers import START_MS, advance, running, settle
from tests.unit.test_claim_ahead import spy_claims, waiting_claim
from timeshard.model import BucketEntry, JobState
from timeshard.node import JobSpec
from timeshard.node.ahead import AHEAD_BATCH, REACH_MAX_MS, hand_over_at, reach_ms, take_ahead
from timeshard.sharding import minute_of, shard_of

NOW = START_MS + 10_000
WINDOW = 400
REACH = 1600


def heap_of(dues: Iterable[int], home: int | None = None) -> list[BucketEntry]:
    heap = [
        BucketEntry(shard=0, minute=minute_of(d), due_at=d, job_id=f"j{n}", home=home)
        for n, d in enumerate(dues)
    ]
    heapq.heapify(heap)
    return heap


def take(heap: list[BucketEntry], now: int = NOW) -> list[int]:
    return [e.due_at - now for e in take_ahead(heap, now, WINDOW, REACH, lambda e: True)]


def test_a_trickle_is_claimed_in_one_batch_as_far_as_the_reach() -> None:
    heap = heap_of(NOW + d for d in (150, 400, 700, 1000, 1300, 1600, 1700))
    assert take(heap) == [150, 400, 700, 1000, 1300, 1600]
    assert [e.due_at - NOW for e in heap] == [1700]  # past the reach: a later claim


def test_nothing_is_claimed_until_the_first_is_due_within_half_the_window() -> None:
    heap = heap_of(NOW + d for d in (201, 300, 900))
    assert take(heap) == []
    assert len(heap) == 3
    assert take(heap, NOW + 1) == [200, 299, 899]


def test_a_burst_is_not_kept_waiting_and_not_stretched() -> None:
    """Jobs due within the window are all taken at once, however many; the reach adds none
    once the batch is full."""
    burst = [NOW + 100 + n // 10 for n in range(3 * AHEAD_BATCH)]  # within 5 ms
    heap = heap_of([*burst, NOW + WINDOW + 1, NOW + 900])
    assert len(take(heap)) == 3 * AHEAD_BATCH
    assert sorted(e.due_at - NOW for e in heap) == [WINDOW + 1, 900]


def test_the_stretch_stops_at_the_batch_size() -> None:
    within = [NOW + 100 + n for n in range(AHEAD_BATCH - 2)]
    beyond = [NOW + WINDOW + 10 * (n + 1) for n in range(5)]
    heap = heap_of([*within, *beyond])
    taken = take(heap)
    assert len(taken) == AHEAD_BATCH
    assert taken[-2:] == [WINDOW + 10, WINDOW + 20]
    assert len(heap) == 3


def test_the_stretch_takes_no_partition_the_claim_does_not_write_anyway() -> None:
    """Past the window only jobs whose rows lie in a partition already taken: a job of the
    next minute would cost a Paxos round of its own."""
    minute_end = (minute_of(NOW) + 1) * 60_000
    now = minute_end - 300
    heap = heap_of([now + 100, now + 250, minute_end + 200, minute_end + 500])
    got = [e.due_at - now for e in take_ahead(heap, now, WINDOW, REACH, lambda e: True)]
    assert got == [100, 250]  # (minute_end + 200 is past the window and in another minute)
    assert [e.due_at - now for e in sorted(heap)] == [500, 800]


def test_within_the_window_every_partition_is_taken() -> None:
    minute_end = (minute_of(NOW) + 1) * 60_000
    now = minute_end - 100
    heap = heap_of([now + 50, minute_end + 100])
    got = [e.due_at - now for e in take_ahead(heap, now, WINDOW, REACH, lambda e: True)]
    assert got == [50, 200]


def test_jobs_due_now_and_entries_no_longer_pending_are_not_claimed_ahead() -> None:
    heap = heap_of(NOW + d for d in (0, 100, 200))
    gone = {NOW + 100}
    got = take_ahead(heap, NOW, WINDOW, REACH, lambda e: e.due_at not in gone)
    assert [e.due_at - NOW for e in got] == []  # the first is due now: decided now, not here
    heapq.heappop(heap)
    got = take_ahead(heap, NOW, WINDOW, REACH, lambda e: e.due_at not in gone)
    assert [e.due_at - NOW for e in got] == [200]  # (the one not pending is dropped)
    assert heap == []


@pytest.mark.parametrize(
    ("window", "lookahead_s", "lease_ms", "reach"),
    [
        (0, 5.0, 30_000, 0),  # off
        (100, 5.0, 30_000, 400),  # four windows
        (400, 5.0, 30_000, 1600),
        (1000, 5.0, 30_000, REACH_MAX_MS),  # at most 2 s
        (400, 2.0, 30_000, 999),  # less than the lookahead less a refresh
        (400, 5.0, 2_000, 1000),  # at most half the lease
        (3000, 5.0, 30_000, 3000),  # never less than the window
    ],
)
def test_the_reach(window: int, lookahead_s: float, lease_ms: int, reach: int) -> None:
    assert reach_ms(window, lookahead_s, 1.0, lease_ms) == reach


def same_shard_ids(n: int, shards: int = 4) -> list[str]:
    ids = (f"trickle-{k}" for k in range(10_000))
    return [i for i in ids if shard_of(i, shards) == 0][:n]


async def test_a_trickle_goes_in_one_claim_and_each_job_out_no_earlier_than_the_rules() -> None:
    """Five jobs of one shard due 250 ms apart, window 300 ms (reach 1200 ms): one claim
    ahead takes them all; the early lane gets each no sooner than a window before it is due,
    and a claim that does not start on the worker's clock gets each at its due time."""
    due = START_MS + 2000
    async with running(claim_ahead_ms=300) as (node, clock):
        assert node.ahead.reach_ms == 1200
        calls = spy_claims(node)
        ids = same_shard_ids(5)
        run_at = {i: due + 250 * n for n, i in enumerate(ids)}
        for i in ids:
            await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=run_at[i], job_id=i))
        claim = waiting_claim(node)
        got: dict[str, int] = {}
        await advance(node, clock, 1.8, step=0.1)
        while clock.now_ms() < due + 1100:
            await advance(node, clock, 0.05, step=0.05)
            await settle(node)
            now = clock.now_ms()
            for lane in node.ready._early.values():
                assert all(item.run_at - 300 <= now for item in lane.values()), "in the lane early"
            if claim.done():
                for c in claim.result():
                    got[c.job.job_id] = now
                    assert now >= c.job.run_at, "handed over before its due time"
                claim = waiting_claim(node)
        claim.cancel()
        assert [len(cs) for _, cs in calls] == [5], "the trickle was not one claim ahead"
        ((at, claims),) = calls
        assert at >= due - 150 and at < due
        assert all(c.ahead_ms == 1200 for c in claims)
        assert sorted(got) == sorted(ids)
        for i in ids:
            job = await node.jobs.get(i)
            assert job.state is JobState.RUNNING and job.started_at == run_at[i]
            assert job.lease_until == run_at[i] + node.config.lease_ms(0)


@pytest.mark.parametrize("window", [400, 300, 100, 8, 1])
def test_a_held_job_goes_to_the_early_lane_on_the_tick_never_earlier_than_a_window(
    window: int,
) -> None:
    """The hand-over is put off to the node's tick, so the held jobs of every shard going out
    about then share a push: never earlier than a window before the job is due, never more
    than a tick (an eighth of the window, at most 50 ms) later."""
    tick = min(50, window // 8)
    for run_at in range(NOW, NOW + 200):
        at = hand_over_at(run_at, window)
        assert run_at - window <= at < run_at - window + max(tick, 1)
        if tick > 1:
            assert at % tick == 0
    assert hand_over_at(NOW + 1001, 400) == hand_over_at(NOW + 1050, 400) == NOW + 650
