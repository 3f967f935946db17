"""One node as the worker SDK sees it: the worker stream (``WorkerService.Work``) when the node
has it, the unary calls otherwise.

``NodeLink`` answers ``Heartbeat`` and ``Finish`` as a stub does, so the heartbeat loops and
the result retries (``heartbeats``, ``results``) use it unchanged: over the stream while it is
open, one request for every heartbeat and result queued in the same turn of the event loop;
over the unary calls while it is not (reconnecting, or a node that answered ``UNIMPLEMENTED``).

Credits: per job type, the node may push as many jobs as the credits it holds. They are granted
from the type's free slots (``Slots``) and count as asked for, like a claim in flight, so a
type's concurrency limit holds across every node the worker streams from. A pushed job's lease
runs from when the node took it, after it read the request numbered ``after_seq``: the worker's
deadline is that request's send time + lease - margin, never later than the lease's end. An
otherwise idle stream sends an empty request every ``TICK_S`` so that time stays recent.

Requests are few: what is queued in one turn of the event loop goes as one, and a result waits
for the start notice of a job pushed ahead that is due to start within ``RESULT_RIDE_S``.

The protocol is written down in docs/architecture.md ("The worker stream").
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from timeshard.clock import Clock, SystemClock
from timeshard.limits import MAX_REPLY_BYTES
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, dur_s, translate, ts
from timeshard.worker.slots import Slots

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub

log = logging.getLogger("timeshard.worker")

CREDIT_LINGER_S = 0.005
"""How long credits for a freed slot wait for that job's result (``RESULT_LINGER_S`` later) to
ride with, while the node still holds credits of the type (at once when it holds none); with a
start notice due within ``RESULT_RIDE_S``, they wait for it as the result does."""
RESULT_RIDE_S = 0.025
"""How long a result may wait, on the open stream, for the start notice of a job pushed ahead
whose start is due by then, to go out in one request with it (at a trickle: one request per job
instead of two). Never longer than a quarter of the safety margin; a result with no start due
that soon goes at once."""
RIDE_SLACK_S = 0.002
"""How long past that start the result waits for the notice (the handler's start is a timer
and a turn of the loop after its time)."""
TICK_S = 5.0
"""An idle stream sends an empty request this often (at most; less with a short lease)."""
STOP_WAIT_S = 5.0
"""How long ``stop_claiming`` waits for the node to confirm it pushes nothing more."""
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.1, 5.0


class StreamError(grpc.RpcError):
    """A heartbeat or result the stream could not carry, or the node refused, as the unary call
    would have raised it (``code()``, ``details()``), so callers treat both alike."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """What a link needs of its worker."""

    worker_id: str
    lease_s: float
    safety_margin_s: float
    clock: Clock
    slots: Slots
    concurrency: Callable[[str], int]
    start: Callable[[Any, pb.ClaimedJob, float, float], None]
    """Start a claimed job: ``start(link, claimed, sent, received)``."""
    claim_loop: Callable[[Any, asyncio.Event, str, int], Coroutine[Any, Any, None]]
    """The unary long polls of one type: ``claim_loop(link, stop, job_type, poll)``."""
    claim_polls: int = 1
    """How many ``claim_loop`` run per type and node (``poll`` 0, 1, ...)."""
    revoke: Callable[[str, int], bool] = lambda job_id, fence: False
    """The node revoked a pushed job: not started from now on; True if it had started."""


class NodeLink:
    """One node: its worker stream, or its unary claim loops after ``UNIMPLEMENTED``."""

    def __init__(
        self,
        host: Host,
        stub: WorkerStub,
        address: str,
        types: list[str],
        stop: asyncio.Event,
        *,
        use_stream: bool = True,
    ) -> None:
        self._host = host
        self._stub = stub
        self.address = address
        self._types = types
        self._credits_for = frozenset(types)
        self._stop = stop
        self._use_stream = use_stream
        self._call: Any = None
        self._open = False
        self._seq = 0
        self._sent: deque[tuple[int, float]] = deque()
        self._pending: dict[int, asyncio.Future[pb.WorkResponse]] = {}
        self._credits: dict[str, int] = {}
        self._out_credits: dict[str, int] = {}
        self._out_beats: list[pb.HeartbeatRequest] = []
        self._out_results: list[pb.FinishItem] = []
        self._out_started: list[pb.HeartbeatRequest] = []
        self._out_revoked: list[pb.WorkRevoke] = []
        self._soon_timer: asyncio.TimerHandle | None = None
        """Sends what waits for a request to ride with (``_soon``)."""
        self._starts: list[float] = []
        """When the jobs pushed ahead on this stream may start (a heap, this worker's
        monotonic clock): a result waits for the next one's notice (``RESULT_RIDE_S``)."""
        self._out_stop = False
        self._out_answer: asyncio.Future[pb.WorkResponse] | None = None
        self._has_out = asyncio.Event()
        self._stopped = asyncio.Event()
        self._claiming = True
        self._tasks: list[asyncio.Task[None]] = []
        self._unary: list[asyncio.Task[None]] = []
        self._notices: set[asyncio.Task[None]] = set()
        self.streaming = False
        """True once the node welcomed a stream (False: not yet, or it answered
        ``UNIMPLEMENTED`` and the link uses the unary calls)."""
        self._main = asyncio.create_task(self._run(), name=f"work-{address}")

    # -- as a stub ------------------------------------------------------------------------------

    def Claim(self, request: pb.ClaimRequest, timeout: float) -> Any:
        return self._stub.Claim(request, timeout=timeout)

    async def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        if not self._open:
            return await self._stub.Heartbeat(request, timeout=timeout)
        answer, n = self._queue_beat(request)
        result = (await self._answer(answer, timeout)).heartbeats[n]
        if result.code:
            raise StreamError(_CODES.get(result.code, grpc.StatusCode.UNKNOWN), result.message)
        return result.lease

    async def Finish(self, request: pb.FinishRequest, timeout: float) -> pb.FinishResponse:
        if not self._open:
            return await self._stub.Finish(request, timeout=timeout)
        first = len(self._out_results)
        self._out_results.extend(request.items)
        answer = self._answer_future(send=False)
        if any(item.give_back for item in request.items):
            self._has_out.set()  # (a job given back goes at once: another may take it)
        else:
            self._ride()
        response = await self._answer(answer, timeout)
        return pb.FinishResponse(results=response.results[first : first + len(request.items)])

    def notice_start(self, job_id: str, fence: int, started_at_ms: int) -> None:
        """The handler of ``job_id`` starts (invariant 9): on the open stream the notice goes
        out at once, with whatever else is queued; with the stream closed, as a heartbeat over
        the unary call (its failure is no matter: the job's heartbeats carry the notice
        again)."""
        notice = pb.HeartbeatRequest(
            job_id=job_id, fence=fence, started=True, started_at=ts(started_at_ms)
        )
        if self._open:
            self._out_started.append(notice)
            self._has_out.set()
            return
        notice.lease.CopyFrom(dur(round(self._host.lease_s * 1000)))

        async def send() -> None:
            with contextlib.suppress(grpc.RpcError):
                await self._stub.Heartbeat(notice, timeout=max(1.0, self._host.lease_s / 3))

        task = asyncio.create_task(send(), name=f"start-notice-{job_id}")
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    def _ride(self, linger_s: float = 0.0) -> None:
        """Send what is queued with the next start notice when one is due within
        ``RESULT_RIDE_S``; otherwise within ``linger_s`` (0: at once)."""
        now = self._host.clock.monotonic()
        starts = self._starts_after(now)
        wait = min(RESULT_RIDE_S, self._host.safety_margin_s / 4)
        if starts and starts[0] - now <= wait:
            self._soon(starts[0] - now + RIDE_SLACK_S)
        elif linger_s > 0:
            self._soon(linger_s)
        else:
            self._has_out.set()

    def _starts_after(self, now: float) -> list[float]:
        """The heap of start times of the jobs pushed ahead, less those past at ``now`` (none
        to wait for)."""
        starts = self._starts
        while starts and starts[0] <= now:
            heapq.heappop(starts)
        return starts

    def _soon(self, linger_s: float) -> None:
        """Send the next request within ``linger_s`` (real time: on another clock, at once),
        with whatever else is queued by then."""
        if type(self._host.clock) is not SystemClock:
            self._has_out.set()
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + linger_s
        if self._soon_timer is not None:
            if self._soon_timer.when() <= due:
                return
            self._soon_timer.cancel()
        self._soon_timer = loop.call_at(due, self._soon_due)

    def _soon_due(self) -> None:
        self._soon_timer = None
        self._has_out.set()

    def _leaving(self) -> None:
        """What waited for ``_soon`` goes now (with the request being written, or dropped)."""
        if self._soon_timer is not None:
            self._soon_timer.cancel()
            self._soon_timer = None

    def _queue_beat(self, request: pb.HeartbeatRequest) -> tuple[asyncio.Future[Any], int]:
        self._out_beats.append(request)
        return self._answer_future(), len(self._out_beats) - 1

    def _answer_future(self, send: bool = True) -> asyncio.Future[pb.WorkResponse]:
        """The answer to the next request (shared by everything queued for it); ``send``: that
        request goes at once."""
        if self._out_answer is None:
            self._out_answer = asyncio.get_running_loop().create_future()
        if send:
            self._has_out.set()
        return self._out_answer

    async def _answer(self, answer: asyncio.Future[Any], timeout: float) -> pb.WorkResponse:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(answer)
        except TimeoutError:
            raise StreamError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"{self.address}: no answer in {timeout:.1f}s"
            ) from None

    # -- the stream -----------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while self._use_stream and not self._stop.is_set():
            try:
                await self._stream()
                backoff = FIRST_BACKOFF_S
                if not self._claiming:
                    return
            except grpc.RpcError as exc:
                err = translate(exc)
                if err.code is grpc.StatusCode.UNIMPLEMENTED:
                    log.info("worker: %s has no worker stream; using Claim", self.address)
                    break
                if not self._claiming:
                    return
                log.warning("worker stream to %s: %s; again in %.1fs", self.address, err, backoff)
            except Exception:  # a bug of ours: logged, and the stream opened again
                log.exception("worker stream to %s failed; again in %.1fs", self.address, backoff)
            finally:
                self._closed()
            await self._host.clock.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
        if self._claiming and not self._stop.is_set():
            self._unary = [
                asyncio.create_task(
                    self._host.claim_loop(self, self._stop, t, poll),
                    name=f"claim-{self.address}-{t}-{poll}",
                )
                for t in self._types
                for poll in range(self._host.claim_polls)
            ]

    async def _stream(self) -> None:
        call = self._call = self._stub.Work()  # type: ignore[call-arg]  # (written to)
        hello = pb.WorkHello(
            worker_id=self._host.worker_id,
            lease=dur(round(self._host.lease_s * 1000)),
            max_reply_bytes=MAX_REPLY_BYTES,
            accepts_starts_in=True,
        )
        self._seq = 0
        self._sent.clear()  # (numbers start again on each stream)
        await self._write(call, pb.WorkRequest(hello=hello, credits=self._credits_due()))
        first = await call.read()  # the node's welcome (or UNIMPLEMENTED: an older node)
        if first is grpc.aio.EOF:  # type: ignore[attr-defined]
            raise StreamError(grpc.StatusCode.UNAVAILABLE, "the node ended the worker stream")
        self.streaming = self._open = True
        writer = asyncio.create_task(self._write_loop(call), name=f"work-out-{self.address}")
        self._tasks = [writer]
        self._host.slots.listen(self._freed)
        for t in self._types:
            self._freed(t)
        message = first
        while message is not grpc.aio.EOF:  # type: ignore[attr-defined]
            self._take(message)  # type: ignore[arg-type]
            message = await call.read()
        raise StreamError(grpc.StatusCode.UNAVAILABLE, "the node ended the worker stream")

    def _take(self, message: pb.WorkResponse) -> None:
        """A message from the node: jobs pushed, an answer, or the end of pushing."""
        if message.jobs:
            received = self._host.clock.monotonic()  # (before any of them: ``starts_in``)
            # The leases started ``held`` after the node read request ``after_seq``, which
            # was sent before it was read: a deadline never later than the lease's real end.
            sent = self._sent_at(message.after_seq) + dur_s(message.held)
            slots = self._host.slots
            types = set()
            starts = self._starts_after(received)
            for claimed in message.jobs:
                t = claimed.job.type
                types.add(t)
                if claimed.HasField("starts_in"):
                    heapq.heappush(starts, received + dur_s(claimed.starts_in))
                if self._credits.get(t, 0) > 0:
                    self._credits[t] -= 1
                    slots.asking(t, -1)
                self._host.start(self, claimed, sent, received)
            for t in types:  # (a job not started, its lease over on arrival, freed no slot)
                self._freed(t)
        for r in message.revokes:  # (answered at once: a cancel waits for it)
            started = self._host.revoke(r.job_id, r.fence)
            self._out_revoked.append(pb.WorkRevoke(job_id=r.job_id, fence=r.fence, started=started))
            self._has_out.set()
        if message.seq:
            answer = self._pending.pop(message.seq, None)
            if answer is not None and not answer.done():
                answer.set_result(message)
        if message.stopped:
            self._stopped.set()

    def _sent_at(self, seq: int) -> float:
        """When request ``seq`` was sent (the node's pushes name ever later requests)."""
        while len(self._sent) > 1 and self._sent[1][0] <= seq:
            self._sent.popleft()
        return self._sent[0][1]

    async def _write(self, call: Any, request: pb.WorkRequest) -> None:
        self._seq += 1
        request.seq = self._seq
        self._sent.append((self._seq, self._host.clock.monotonic()))
        await call.write(request)

    async def _write_loop(self, call: Any) -> None:
        """Everything queued since the last request goes out as the next one; an idle stream
        sends an empty one every ``TICK_S``."""
        tick = min(TICK_S, (self._host.lease_s - self._host.safety_margin_s) / 4)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await self._has_out.wait()
            self._has_out.clear()
            request = pb.WorkRequest(
                credits=[pb.WorkCredit(type=t, credits=n) for t, n in self._out_credits.items()],
                heartbeats=self._out_beats,
                results=self._out_results,
                started=self._out_started,
                stop=self._out_stop,
                revoked=self._out_revoked,
            )
            answer, self._out_answer = self._out_answer, None
            self._leaving()
            self._out_credits, self._out_beats, self._out_results = {}, [], []
            self._out_started, self._out_revoked = [], []
            self._out_stop = False
            if answer is not None:
                self._pending[self._seq + 1] = answer
            await self._write(call, request)

    def _credits_due(self) -> list[pb.WorkCredit]:
        """Credits for every type that has free slots (when the stream opens)."""
        out = []
        for t in self._types:
            n = self._to_grant(t)
            if n > 0:
                self._credited(t, n)
                out.append(pb.WorkCredit(type=t, credits=n))
        return out

    def _to_grant(self, t: str) -> int:
        """How many more credits of ``t`` to grant: the free slots nobody has asked for yet
        (at least one while any is free and this node holds none, so that no node waits for
        another's), in steps of a quarter of the type's slots, not one per finished job."""
        if not self._claiming:
            return 0
        slots = self._host.slots
        free = slots.free(t)
        if free <= 0:
            return 0
        want = free - slots.asked(t)
        if self._credits.get(t, 0) == 0:
            return max(1, want)
        return want if want >= max(1, self._host.concurrency(t) // 4) else 0

    def _credited(self, t: str, n: int) -> None:
        self._credits[t] = self._credits.get(t, 0) + n
        self._host.slots.asking(t, n)

    def _freed(self, t: str) -> None:
        """A slot of ``t`` may be free: grant what ``_to_grant`` says, with the next request."""
        if not self._open or t not in self._credits_for:
            return
        n = self._to_grant(t)
        if n > 0:
            idle = self._credits.get(t, 0) == 0  # (the node may push it nothing meanwhile)
            self._credited(t, n)
            self._out_credits[t] = self._out_credits.get(t, 0) + n
            if idle:
                self._has_out.set()
            else:  # rides with the result of the job that freed the slot
                self._ride(CREDIT_LINGER_S)

    def _closed(self) -> None:
        """The stream is over: its credits are no longer asked for, and what waits for an
        answer is told so (it is sent again, on this node's unary calls or another node)."""
        self._open = False
        self._host.slots.unlisten(self._freed)
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        for t, n in self._credits.items():
            self._host.slots.asking(t, -n)
            self._host.slots.nudge(t)  # the other nodes' links may grant them now
        self._credits.clear()
        broken = StreamError(grpc.StatusCode.UNAVAILABLE, f"worker stream to {self.address} ended")
        waiting = [*self._pending.values()]
        if self._out_answer is not None:
            waiting.append(self._out_answer)
        self._pending.clear()
        self._out_answer = None
        self._out_credits, self._out_beats, self._out_results = {}, [], []
        self._out_started = []  # (their heartbeats carry them again)
        self._starts = []
        self._out_revoked = []  # (the node's cancel waits no longer than the start's bound)
        self._leaving()
        for answer in waiting:
            if not answer.done():
                answer.set_exception(broken)
                answer.exception()  # (retrieved: its waiters may have given up)
        if self._call is not None:
            self._call.cancel()
            self._call = None

    # -- stopping -------------------------------------------------------------------------------

    async def stop_claiming(self) -> None:
        """No more jobs from this node: the stream says ``stop`` and waits (a bounded time) for
        the node to confirm; its heartbeats and results still go over it until ``close``."""
        self._claiming = False
        for task in self._unary:
            task.cancel()
        await asyncio.gather(*self._unary, return_exceptions=True)
        if self._open:
            self._out_stop = True
            self._has_out.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_WAIT_S):
                    await self._stopped.wait()
        elif not self._main.done():
            self._main.cancel()  # still connecting: nothing was claimed for it

    def leave(self) -> None:
        """The node left the cluster: no more jobs from it, at once (its stream ends; what its
        jobs still send goes over its unary calls)."""
        self._claiming = False
        for task in self._unary:
            task.cancel()
        self._main.cancel()

    async def close(self) -> None:
        """End the stream (after the drain: nothing of it is awaited any more)."""
        self._claiming = False
        call = self._call
        if call is not None and self._open:
            with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
                await call.done_writing()
        self._main.cancel()
        for task in [*self._unary, *self._tasks]:
            task.cancel()
        await asyncio.gather(self._main, *self._unary, *self._tasks, return_exceptions=True)
