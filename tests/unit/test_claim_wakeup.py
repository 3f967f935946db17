"""After a store outage one node's claims slept through their whole long
poll while jobs were ready. A claim checked the ready queues, then registered for a change one
loop turn later; a push in between was lost. These tests push exactly in that gap.

A ready job wakes one waiting claim of its type, not all of them (with W worker streams a job
woke W claims); a claim woken that takes nothing passes the wake on."""

from __future__ import annotations

import asyncio

from tests.unit.helpers import advance, running
from timeshard.node.ready import ReadyItem
from timeshard.testing.waits import wait_until


async def turns(n: int = 10) -> None:
    """Let the tasks started so far run up to their next wait."""
    for _ in range(n):
        await asyncio.sleep(0)


def item(job_id: str) -> ReadyItem:
    return ReadyItem(job_id=job_id, job_type="t", shard=0, fence=0, run_at=0)


async def test_a_push_right_after_the_check_wakes_the_waiting_claim() -> None:
    async with running() as (node, _):
        waiting = asyncio.create_task(node.claims._wait_ready(["t"], {}, timeout=30))
        asyncio.get_running_loop().call_soon(node.ready.push, item("j1"))
        await wait_until(waiting.done, timeout=2, what="the waiting claim to wake")


async def test_room_freed_under_a_concurrency_limit_wakes_the_waiting_claim() -> None:
    async with running() as (node, clock):
        node.ready.push(item("j2"))  # ready, but say the type has no room: it waits for room
        waiting = asyncio.create_task(node.claims._wait_ready(["t"], {}, timeout=30))
        # Waiting for room looks again after at most a second (of the node's clock): short
        # of that, it must still wait, not spin.
        await advance(node, clock, 0.9)
        assert not waiting.done(), "a claim with nothing it may take must wait, not spin"
        node.ready.wake()
        await wait_until(waiting.done, timeout=2, what="the waiting claim to wake")


async def test_one_ready_job_wakes_one_waiting_claim_not_all() -> None:
    async with running() as (node, _):
        waits = [
            asyncio.create_task(node.claims._wait_ready(["t"], {}, timeout=30)) for _ in range(3)
        ]
        other = asyncio.create_task(node.claims._wait_ready(["u"], {}, timeout=30))
        await turns()
        node.ready.push(item("j3"))
        await wait_until(lambda: any(w.done() for w in waits), timeout=2, what="one claim woken")
        await turns()
        assert sum(w.done() for w in waits) == 1 and not other.done()
        node.ready.push(item("j4"))
        await wait_until(lambda: sum(w.done() for w in waits) == 2, timeout=2, what="a second")
        for w in [*waits, other]:
            w.cancel()


async def test_a_claim_woken_that_gives_up_passes_the_job_to_another() -> None:
    """Two streams' claims wait for ``t``; the one a ready job wakes gives up (its stream's
    credits changed): the job must not sit until the other's long poll ends."""
    async with running() as (node, _):
        quitting = [False]
        first = asyncio.create_task(
            node.claims.claim(
                worker="a", types=["t"], limit=1, wait_s=30, lease_s=30, give_up=lambda: quitting[0]
            )
        )
        await turns()  # (the first waits first: a ready job wakes it first)
        second = asyncio.create_task(
            node.claims.claim(worker="b", types=["t"], limit=1, wait_s=30, lease_s=30)
        )
        await turns()
        quitting[0] = True
        node.ready.push(item("j5"))
        await wait_until(first.done, timeout=2, what="the first claim to give up")
        assert first.result() == []
        await wait_until(
            lambda: node.ready.count() == 0, timeout=2, what="the other claim to take the job"
        )
        second.cancel()
