"""A store may hold completions a few tens of milliseconds to share a write (Cassandra's
``RESULT_LINGER_S``): the node lets it, except for a job under a concurrency limit, whose end
lets the next job of its type start (held, each of a type limited to 1 would start 50 ms later)."""

from __future__ import annotations

from collections.abc import Sequence

from tests.unit.helpers import START_MS, advance, running
from timeshard.model import WriteResult
from timeshard.node import FinishItem, JobSpec, TypePolicy
from timeshard.store.base import Completion, Store
from timeshard.testing.waits import wait_until


async def test_a_completion_may_linger_unless_a_concurrency_limit_waits_for_it() -> None:
    types = {"limited": TypePolicy(concurrency=1), "counted": TypePolicy(max_attempts=2)}
    async with running(types=types) as (node, clock):
        asked: list[tuple[list[str], bool]] = []
        store: Store = node.store
        original = store.complete_jobs

        async def complete_jobs(
            items: Sequence[Completion], now: int, *, linger: bool = False
        ) -> list[WriteResult]:
            asked.append(([c.job_id for c in items], linger))
            return await original(items, now, linger=linger)

        store.complete_jobs = complete_jobs  # type: ignore[method-assign]
        jobs = {
            t: (await node.jobs.schedule(JobSpec(job_type=t, payload=b"", run_at=START_MS)))[0]
            for t in ("limited", "counted", "free")
        }
        await advance(node, clock, 1)
        await wait_until(lambda: node.ready.count() == 3, what="three jobs ready")
        for t, job in jobs.items():
            [c] = await node.claims.claim(worker="w", types=[t], limit=1, wait_s=0, lease_s=60)
            [done] = await node.attempts.finish([FinishItem(job_id=job.job_id, fence=c.job.fence)])
            assert not isinstance(done, Exception)
        assert asked == [
            ([jobs["limited"].job_id], False),  # the next "limited" job waits for this one
            ([jobs["counted"].job_id], True),
            ([jobs["free"].job_id], True),
        ]
