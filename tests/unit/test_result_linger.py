"""A store may hold completions a while to share a write (``Store.complete_jobs``'s
``linger_s``): the node lets it, 50 ms, or half the claims-ahead window when claims ahead are
on (a shard's claims ahead go out about that often: a result rides the next one's Paxos round),
at most 250 ms; never for a job under a concurrency limit, whose end lets the next job of its
type start (held, each of a type limited to 1 would start that much later)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.unit.helpers import START_MS, advance, running
from timeshard.model import WriteResult
from timeshard.node import FinishItem, JobSpec, TypePolicy
from timeshard.store.base import Completion, Store
from timeshard.testing.waits import wait_until


@pytest.mark.parametrize(("claim_ahead_ms", "linger_s"), [(0, 0.05), (400, 0.2), (1000, 0.25)])
async def test_a_completion_may_linger_unless_a_concurrency_limit_waits_for_it(
    claim_ahead_ms: int, linger_s: float
) -> None:
    types = {"limited": TypePolicy(concurrency=1), "counted": TypePolicy(max_attempts=2)}
    async with running(types=types, claim_ahead_ms=claim_ahead_ms) as (node, clock):
        asked: list[tuple[list[str], float]] = []
        store: Store = node.store
        original = store.complete_jobs

        async def complete_jobs(
            items: Sequence[Completion], now: int, *, linger_s: float = 0.0
        ) -> list[WriteResult]:
            asked.append(([c.job_id for c in items], linger_s))
            return await original(items, now, linger_s=linger_s)

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
            ([jobs["limited"].job_id], 0.0),  # the next "limited" job waits for this one
            ([jobs["counted"].job_id], linger_s),
            ([jobs["free"].job_id], linger_s),
        ]
