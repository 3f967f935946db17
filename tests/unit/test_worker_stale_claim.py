"""Found by the chaos suite (tools/chaos.py): a claim the server took while the worker was
stopped (SIGSTOP) with its long poll in flight reaches the worker only when it resumes, after
the lease is over and another worker has the job. The SDK takes the reply's arrival as a
provisional lease base and starts the handler at once, extending alongside: a handler that acts
at once passes ``ctx.check()`` and reaches its effect with a stale fence (seen in chaos runs:
fence 3 reached the effect 2.7 s after its lease ended and after fence 4 had applied it; and two
runs active at once for 6 ms). Invariant 6 wants no step without a lease; with a long poll the
worker can not know how old the claim is until a heartbeat answers.

Fixed: the SDK counts a claim's lease from when it sent the claim (the server took it later),
and a long poll waits at most half the lease.
"""

from __future__ import annotations

import asyncio

from tests.unit.test_worker_lease import LEASE_S, MARGIN_S, FakeStub, claimed
from timeshard.clock import FakeClock
from timeshard.worker import JobContext, Worker


async def test_a_claim_taken_while_the_worker_was_stopped_never_reaches_an_effect() -> None:
    clock = FakeClock()
    w = Worker(worker_id="w", lease_s=LEASE_S, safety_margin_s=MARGIN_S, clock=clock)
    effects: list[int] = []

    @w.handler("t", timeout=100)
    async def act_at_once(ctx: JobContext) -> None:
        ctx.check()
        effects.append(ctx.fence)

    stub = FakeStub(clock, heartbeat="stale")  # the lease is long over: another worker has it
    clock.advance(20)
    # The claim was sent 10 s ago; the server took it at once, then the worker was stopped for
    # 10 s (3 s lease): the reply arrives now.
    w._attempts.start(stub, claimed(), sent=clock.monotonic() - 10)  # type: ignore[arg-type]
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.gather(*w._attempts.tasks, return_exceptions=True)
    assert effects == [], "the handler acted on a claim whose lease was already over"


async def test_a_claim_whose_lease_is_over_on_arrival_never_runs_its_handler() -> None:
    """Still seen after the fix above (soak with 92 faults, seed 1): 70 handlers started on
    claims whose lease had ended before the reply arrived, 6 of them while another worker ran
    the same job (e.g. 072c9d1f...: fence 1 started on worker3 0.46 s into fence 2's run on
    worker1, and stopped at its first check 2 ms later). The SDK knows such a claim is dead when
    it arrives (``sent + lease - margin`` is past): it should drop it, not call the handler,
    whose code before its first check runs without a lease."""
    clock = FakeClock()
    w = Worker(worker_id="w", lease_s=LEASE_S, safety_margin_s=MARGIN_S, clock=clock)
    called: list[int] = []

    @w.handler("t", timeout=100)
    async def handler(ctx: JobContext) -> None:
        called.append(ctx.fence)  # anything a handler does before its first check

    clock.advance(20)
    w._attempts.start(FakeStub(clock), claimed(), sent=clock.monotonic() - 10)  # type: ignore[arg-type]
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.gather(*w._attempts.tasks, return_exceptions=True)
    assert called == [], "the handler ran for a claim whose lease was over when it arrived"
