"""Getting a finished job's result to the cluster, for the worker SDK.

A result is retried until it is in or the job's lease is over: a completion refused during a
short store outage (``UNAVAILABLE``) once was dropped, and the job ran again after its lease.
Any node accepts a result and writes it conditional on the job's fence, so it is tried on the
node the job came from, then on each other known node in turn, with backoff. Retrying is safe:
a result that did land before is refused the next time (stale fence) and changes nothing.
Nothing is sent once the lease is over: the job is left to its lease expiry (invariant 6).

Results for one node travel in batches: while one ``Finish`` call is in flight the next ones
gather, so a busy worker makes few round trips; the first waits ``RESULT_LINGER_S`` for others
to join it, so that at a trickle results travel a few per message rather than one each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc

from timeshard.batching import GroupCommit
from timeshard.clock import Clock, SystemClock
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import translate
from timeshard.worker.lease import Lease

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub

RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}
)
"""Not applied, or not known to be: worth sending again (to this node or another)."""
_RETRYABLE_VALUES = frozenset(code.value[0] for code in RETRYABLE)
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
CALL_TIMEOUT_S = 10.0


class LeaseOver(Exception):
    """The lease ended before the result could be sent; it was not sent."""


RESULT_LINGER_S = 0.003
"""How long a result with no batch in flight waits for more to join it: a few ms added to the
time a job's end is recorded (never to its start)."""
RESULTS_PER_CALL = 500
"""Results of one Finish call at most (the API takes ``limits.MAX_BATCH``)."""

_Pending = tuple[pb.FinishItem, Lease, "asyncio.Future[pb.FinishResult]"]


def _fail(pending: _Pending, exc: BaseException) -> None:
    if not pending[2].done():
        pending[2].set_exception(exc)


class _Sender:
    """Sends the results for each node in batches: one Finish call in flight per node, the
    results that come meanwhile in the next one (``GroupCommit``)."""

    def __init__(self, linger_s: float) -> None:
        self._stubs: dict[int, WorkerStub] = {}
        self._groups: GroupCommit[int, _Pending] = GroupCommit(
            self._finish, max_items=RESULTS_PER_CALL, fail=_fail, name="finish", linger_s=linger_s
        )

    async def send(self, stub: WorkerStub, item: pb.FinishItem, lease: Lease) -> pb.FinishResult:
        """The node's answer for ``item``; ``grpc.RpcError`` if the call failed, ``LeaseOver``
        if the lease ended while the item waited for its batch."""
        fut: asyncio.Future[pb.FinishResult] = asyncio.get_running_loop().create_future()
        self._stubs[id(stub)] = stub
        self._groups.submit(id(stub), (item, lease, fut))
        return await fut

    async def _finish(self, key: int, batch: list[_Pending]) -> None:
        for _, lease, fut in batch:  # checked as it leaves, not only as it was queued
            if not lease.held() and not fut.done():
                fut.set_exception(LeaseOver(lease.why()))
        batch = [entry for entry in batch if not entry[2].done()]
        if not batch:
            return
        request = pb.FinishRequest(items=[item for item, _, _ in batch])
        try:
            response = await self._stubs[key].Finish(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            for pending in batch:
                _fail(pending, exc)
            return
        for (_, _, fut), result in zip(batch, response.results, strict=True):
            if not fut.done():
                fut.set_result(result)


class Results:
    """Delivers results; ``nodes()`` gives the stubs of the other nodes known now."""

    def __init__(self, clock: Clock, nodes: Callable[[], Sequence[WorkerStub]]) -> None:
        self._clock = clock
        self._nodes = nodes
        # (the linger is real time: on another clock, a fake one in tests, results go at once)
        self._sender = _Sender(RESULT_LINGER_S if type(clock) is SystemClock else 0.0)

    def targets(self, origin: WorkerStub) -> list[WorkerStub]:
        """Where a job's result or heartbeat goes: its own node first, then the others."""
        return [origin, *(s for s in self._nodes() if s is not origin)]

    async def deliver(
        self, item: pb.FinishItem, origin: WorkerStub, lease: Lease
    ) -> tuple[pb.FinishResult | None, str]:
        """The node's answer, or None and why it was given up: a refusal that retrying can not
        change, or the lease ending first."""
        backoff, attempt, last = FIRST_BACKOFF_S, 0, ""
        while lease.held():
            targets = self.targets(origin)
            stub = targets[attempt % len(targets)]
            attempt += 1
            try:
                result = await self._sender.send(stub, item, lease)
            except LeaseOver:
                break
            except grpc.RpcError as exc:
                err = translate(exc)
                if err.code not in RETRYABLE:
                    return None, err.message
                last = err.message
            else:
                if result.code not in _RETRYABLE_VALUES:
                    return result, ""
                last = result.message
            await self._clock.sleep(max(0.0, min(backoff, lease.remaining())))
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        return None, f"{last}; not sent: {lease.why()}" if last else f"not sent: {lease.why()}"
