"""The early lane of the ready queues (``ReadyQueues.push_early``): jobs claimed ahead and not
due yet go only to claims whose worker starts them on its own clock, wake only such a claim,
are taken within a claim's caps, and leave the lane when they come due, are cancelled or their
shard goes."""

from __future__ import annotations

import asyncio

from timeshard.node.ready import ReadyItem, ReadyQueues


def item(job_id: str, shard: int = 0, job_type: str = "t") -> ReadyItem:
    return ReadyItem(
        job_id=job_id, job_type=job_type, shard=shard, fence=1, run_at=1000, claimed=True
    )


async def test_only_a_claim_that_takes_early_jobs_sees_or_is_woken_by_them() -> None:
    q = ReadyQueues()
    plain = q.waiter(["t"])
    early = q.waiter(["t"], early=True)
    q.push_early(item("a"))
    await asyncio.sleep(0)
    assert early.done() and not plain.done()
    assert q.take(["t"], 10) == [] and not q.has_any(["t"])
    assert [i.job_id for i in q.take_early(["t"], 10)] == ["a"]


async def test_early_jobs_are_taken_in_order_within_the_caps() -> None:
    q = ReadyQueues()
    for job_id in ("a", "b", "c"):
        q.push_early(item(job_id))
    q.push_early(item("x", job_type="u"))
    assert [i.job_id for i in q.take_early(["t", "u"], 10, {"t": 2})] == ["a", "b", "x"]
    assert [i.job_id for i in q.take_early(["t", "u"], 1)] == ["c"]


async def test_an_early_job_leaves_the_lane_when_due_removed_or_its_shard_goes() -> None:
    q = ReadyQueues()
    q.push_early(item("a"))
    q.push_early(item("b"))
    q.push_early(item("c", shard=1))
    due = q.due_early("a", "t")
    assert due is not None and due.job_id == "a"
    assert q.due_early("a", "t") is None  # (taken or gone: the dispatcher skips it)
    removed = q.remove("b")
    assert removed is not None and removed.job_id == "b"
    q.drop_shard(1)
    assert q.take_early(["t"], 10) == []


async def test_the_jobs_of_one_hand_over_wake_one_claim_which_takes_them_all() -> None:
    """Shards hand their held jobs over on one tick but a little apart: with a gather, the
    jobs put in the lane meanwhile wake one claim, not one each, so they go in one push."""
    q = ReadyQueues(gather_early_s=0.05)
    first, second = q.waiter(["t"], early=True), q.waiter(["t"], early=True)
    q.push_early(item("a", shard=0))
    q.push_early(item("b", shard=1))
    async with asyncio.timeout(10):
        await first
    assert not second.done(), "a job of the same hand-over woke a claim of its own"
    assert [i.job_id for i in q.take_early(["t"], 10)] == ["a", "b"]
