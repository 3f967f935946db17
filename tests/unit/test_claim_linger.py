"""A claim that finds fewer jobs than it may take waits up to CLAIM_LINGER_MS for jobs coming
due meanwhile (never early), and answers at once when none is that close. (The linger is made
200 ms here, so the timing of a busy shared machine decides nothing: a loop turn late by more
than the linger would make the claim answer at once.)"""

from __future__ import annotations

import time

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import JobSpec, Node
from timeshard.node import claims as claims_module
from timeshard.store.sqlite import SqliteStore

LINGER_MS = 200


@pytest.fixture(autouse=True)
def long_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims_module, "CLAIM_LINGER_MS", LINGER_MS)


async def claims_of(gap_ms: int) -> tuple[list[list[str]], list[str], list[int]]:
    """Two jobs due ``gap_ms`` apart; claims of up to 10 until both are out. Returns the ids of
    each claim, the ids in due order, and each claimed job's start minus its due time (ms)."""
    node = Node(
        store=SqliteStore(":memory:", num_shards=2),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
    )
    await node.start()
    try:
        first = node.clock.now_ms() + 400
        a, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=first))
        b, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=first + gap_ms))
        batches: list[list[str]] = []
        late: list[int] = []
        deadline = time.monotonic() + 10
        while sum(map(len, batches)) < 2 and time.monotonic() < deadline:
            got = await node.claims.claim(worker="w", types=["t"], limit=10, wait_s=2, lease_s=30)
            batches.append([c.job.job_id for c in got])
            late += [c.job.started_at - c.job.run_at for c in got]
        return batches, [a.job_id, b.job_id], late
    finally:
        await node.stop()


async def test_jobs_due_within_the_linger_go_out_in_one_claim() -> None:
    batches, ids, late = await claims_of(gap_ms=LINGER_MS // 2)
    assert batches == [ids]
    assert min(late) >= 0, "claimed before it was due"


async def test_a_claim_does_not_wait_for_a_job_due_later_than_the_linger() -> None:
    batches, ids, late = await claims_of(gap_ms=LINGER_MS + 60)
    assert batches == [[ids[0]], [ids[1]]]
    assert min(late) >= 0
    assert late[0] < LINGER_MS, "the first claim waited for the second job"
