"""The worker stream (``WorkerService.Work``): one bidirectional stream per worker per node.

The worker opens it with a hello and grants credits per job type (its free slots); the node
pushes claimed jobs as they come due, never more of a type than the credits it holds, each push
one claim batch through the node's claim path (``Claims.claim``: fence, epoch, conditional
writes, concurrency limits, never early). Heartbeats and results come on the same stream, many
per request; those of every stream arriving while one batch is applied are applied together in
the next (``api.workhub``), and each request gets one answer with a result per item.
The protocol, message by message, is in docs/architecture.md ("The worker stream").

Per stream there is the reading coroutine (the RPC's own), one pushing task with up to
``PIPELINE`` claims in flight, and one writing task: none per job. Jobs claimed for a stream
that breaks before they were written to it are covered by their lease exactly as the jobs of a
lost ``Claim`` reply: they run again after it.

At a trickle a message is most of what a job costs the node (about half a millisecond of CPU
each, docs/benchmarks.md), so the writing task lets an answer to results only wait for the
stream's next push of jobs held ahead, due on the hand-over tick, and ride with it
(``heldanswer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from timeshard.api.claimfailures import ClaimFailures
from timeshard.api.heldanswer import HeldAnswer
from timeshard.api.replies import claim_cap
from timeshard.api.workhub import StreamRequest, WorkHub
from timeshard.clock import now_us
from timeshard.errors import InvalidArgument, TimeshardError, status_of
from timeshard.limits import (
    MAX_BATCH,
    MAX_CLAIM_JOBS,
    MAX_CLAIM_TYPES,
    START_GRACE_MS,
    check_count,
)
from timeshard.model import NOT_STARTED, validate_job_id, validate_job_type, validate_worker_id
from timeshard.node import Beat
from timeshard.node.claims import Claimed
from timeshard.node.ready import ReadyItem
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import claimed_to_pb, dur, dur_s, dur_us, started_at_of, ts_ms

log = logging.getLogger(__name__)
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from the stubs)
Ctx = grpc.aio.ServicerContext[Any, Any]

MAX_CREDITS = 100_000
"""Credits one stream may hold for one type at once."""
MAX_UNSENT = 256
"""Answers and pushes waiting to be written before the stream stops reading requests (a worker
that sends but does not read is slowed down, not buffered without bound)."""
WAIT_S = 60.0
"""How long one claim of the pushing task waits before it looks again."""
PIPELINE = 4
"""Claims in flight for one stream at once: one waiting for due jobs, the others writing."""


@dataclass(slots=True)
class _Push:
    """Jobs claimed for a stream, not yet written: their message is made when it is written
    (``WorkStream._in_time``)."""

    claimed: Sequence[Claimed]
    took_at: float
    """The node's monotonic clock just before the claim's write: the leases start after it."""
    response: pb.WorkResponse


class WorkStream:
    """One worker's stream to this node (see the module docstring)."""

    def __init__(self, hub: WorkHub, context: Ctx) -> None:
        self._hub = hub
        self._node = hub.node
        self._context = context
        self._worker = ""
        self._lease_s = 0.0
        self._push_cap = 1
        self._starts_in = False
        """The worker starts a pushed job on its own clock: pushes ahead with ``starts_in``."""
        self._seq = 0
        """The last request read."""
        self._read_at = 0.0
        """When it was read (the node's monotonic clock): a push's ``held`` counts from it."""
        self._behind_until = 0.0
        """While the node's monotonic clock is before this, or pushes wait unwritten, the
        stream is behind: nothing more is claimed for it (back-pressure, invariant 9)."""
        self._counted_behind = False
        self._giving_back: set[asyncio.Task[None]] = set()
        self._held: dict[str, int] = {}
        """Credits per type held by the claims in flight (``_push_one``)."""
        self._stamps: dict[object, tuple[int, float]] = {}
        """Per claim in flight that took its jobs: the last request read before it did, and
        when it was read."""
        self._credits: dict[str, int] = {}
        self._changed = False
        self._stopping = False
        self._credit_event = asyncio.Event()
        self._unsent: deque[pb.WorkResponse | _Push] = deque()
        self._hold = HeldAnswer(hub.node)
        """An answer to results only, written with the next push."""
        self._has_unsent = asyncio.Event()
        self._drained = asyncio.Event()
        self._waiting = False
        self._waiting_caps: dict[str, int] = {}
        """The credits per type the claim waiting for due jobs (``_waiting``) may use."""
        self._answers_due = 0
        """Requests with heartbeats or results not answered yet."""
        self._claim_failures = ClaimFailures(self._node.clock, log)

    # -- reading (the RPC's coroutine) --------------------------------------------------------

    async def run(self) -> None:
        first = await self._context.read()
        if first is EOF:
            return
        tasks: list[asyncio.Task[None]] = []
        try:
            self._hello(first)
            self._take(first)
            self._unsent.append(pb.WorkResponse(seq=first.seq))  # the welcome: it has the stream
            peer = self._context.peer()
            tasks.append(asyncio.create_task(self._write_loop(), name=f"work-write-{peer}"))
            tasks.append(asyncio.create_task(self._push_loop(), name=f"work-push-{peer}"))
            while True:
                if len(self._unsent) > MAX_UNSENT:
                    self._drained.clear()
                    await self._drained.wait()
                request = await self._context.read()
                if request is EOF:
                    await self._finish_writing(tasks[0])
                    return
                self._take(request)
        except TimeshardError as exc:
            await self._context.abort(status_of(exc), exc.message)
        except ValueError as exc:  # a value object refused its input
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            self._node.workers.stream_closed(self)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._counted_behind:
                self._counted_behind = False
                self._node.metrics.stream_behind(-1)

    async def _finish_writing(self, writer: asyncio.Task[None]) -> None:
        """The worker is done sending: answer what it sent, then end the stream."""
        self._stopping = True
        self._node.wake_claims()
        self._credit_event.set()
        self._has_unsent.set()  # a held answer goes now
        while self._unsent or self._answers_due or self._hold.answer is not None:
            if writer.done():
                return
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self._drained.wait()

    def _hello(self, request: pb.WorkRequest) -> None:
        if not request.HasField("hello"):
            raise InvalidArgument("hello", "the first request of a stream must carry the hello")
        if request.heartbeats or request.results:
            raise InvalidArgument("hello", "the hello carries no heartbeats or results")
        hello = request.hello
        self._worker = validate_worker_id(hello.worker_id)
        if hello.lease.seconds < 0 or hello.lease.nanos < 0:
            raise InvalidArgument("hello.lease", "must not be negative")
        # Refuses a bad lease now, not at the first job:
        self._node.config.lease_ms(dur_s(hello.lease))
        self._lease_s = dur_s(hello.lease)
        if hello.max_reply_bytes < 0:
            raise InvalidArgument("hello.max_reply_bytes", "must not be negative (0: 4 MiB)")
        self._push_cap = min(MAX_CLAIM_JOBS, claim_cap(hello.max_reply_bytes))
        self._starts_in = hello.accepts_starts_in

    def _take(self, request: pb.WorkRequest) -> None:
        """Apply one request: its credits now; its heartbeats and results to the group commit."""
        self._hub.read.inc()
        if request.seq != self._seq + 1:
            raise InvalidArgument(
                "seq", f"must be {self._seq + 1} (one more than the last one), got {request.seq}"
            )
        if self._seq and request.HasField("hello"):
            raise InvalidArgument("hello", "only the first request of a stream carries the hello")
        self._seq = request.seq
        self._read_at = self._node.clock.monotonic()
        self._grant(request.credits)
        self._node.polled.asked(self._credits)  # (those it is busy with too)
        self._node.workers.stream_heard(self, self._worker, self._credits)
        now_ms = self._node.clock.now_ms()
        if request.started:
            check_count("started", len(request.started), MAX_BATCH)
            self._node.attempts.notice_starts(_notices(request.started, now_ms))
        check_count("revoked", len(request.revoked), MAX_BATCH)
        for r in request.revoked:
            self._node.starts.answered(r.job_id, r.fence, r.started)
        if any(r.give_back and r.not_started for r in request.results):
            self._fell_behind()  # the worker got a push too late to start it
        check_count("heartbeats", len(request.heartbeats), MAX_BATCH)
        check_count("results", len(request.results), MAX_BATCH)
        if request.results:
            self._hub.node.metrics.result_message(len(request.results))
        if request.heartbeats or request.results:
            self._answers_due += 1
            self._hub.submit(
                StreamRequest(
                    answer=self.send,
                    seq=request.seq,
                    heartbeats=[_beat(n, h, now_ms) for n, h in enumerate(request.heartbeats)],
                    results=self._hub.finish_items(request.results, "results"),
                    asked=request.results,
                )
            )
        if request.stop and not self._stopping:
            self._stopping = True
            self._credits.clear()
            self._wake()

    def _grant(self, credits: Sequence[pb.WorkCredit]) -> None:
        for n, c in enumerate(credits):
            try:
                validate_job_type(c.type)
            except InvalidArgument as exc:
                raise InvalidArgument(f"credits[{n}].type", exc.problem) from None
            if c.credits < 0:
                raise InvalidArgument(
                    f"credits[{n}].credits", f"must not be negative, got {c.credits}"
                )
            if self._stopping:
                continue  # a stopped stream pushes nothing more
            held = self._credits.get(c.type, 0)
            if held + c.credits > MAX_CREDITS:
                raise InvalidArgument(
                    f"credits[{n}].credits",
                    f"{c.type!r} would hold {held + c.credits} credits; at most {MAX_CREDITS}",
                )
            if c.type not in self._credits and len(self._credits) >= MAX_CLAIM_TYPES:
                raise InvalidArgument(
                    f"credits[{n}].type", f"at most {MAX_CLAIM_TYPES} job types per stream"
                )
            if c.credits:
                self._credits[c.type] = held + c.credits
                self._credit_event.set()  # the pushing task may start a claim with them
        self._wake_if_uncovered()

    def _wake_if_uncovered(self) -> None:
        """Cut the waiting claim short if a type has free credits (not held by a claim) that it
        may not use: a type that got credits while it had none free, or whose credits a claim
        still writing gave back. Waiting on, it would leave that type's due jobs unpushed for
        up to ``WAIT_S`` (a worker with two types stalled so: the busy type's credits were all
        held by a claim writing its jobs when the waiting claim started, for the idle type
        alone). A type the waiting claim may use already takes its jobs as they come due."""
        if not self._waiting:
            return
        caps = self._waiting_caps
        for t, c in self._credits.items():
            if not caps.get(t) and c > self._held.get(t, 0):
                self._wake()
                return

    def _wake(self) -> None:
        """The pushing task must look at the credits again: a type got credits the waiting
        claim may not use, or the worker stopped."""
        self._changed = True
        self._credit_event.set()
        if self._waiting:
            self._node.wake_claims()

    # -- pushing ------------------------------------------------------------------------------

    async def _push_loop(self) -> None:
        """Claims for this stream, up to ``PIPELINE`` at once: one waits for due jobs while
        the others write theirs, so a job coming due while a claim's write takes its time
        (a Paxos round on Cassandra) is claimed at once, not after that write. Each claim
        holds the credits it may use (``_held``); once it has taken its jobs it keeps only
        as many as it took, and the next claim may start with the rest."""
        claims: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping:
                if self._behind():
                    await self._catch_up()
                    continue
                caps = {
                    t: free
                    for t, c in self._credits.items()
                    if (free := c - self._held.get(t, 0)) > 0
                }
                if not caps or self._waiting or len(claims) >= PIPELINE:
                    self._credit_event.clear()
                    await self._credit_event.wait()
                    continue
                self._changed = False
                self._waiting = True
                self._waiting_caps = caps
                for t, n in caps.items():
                    self._held[t] = self._held.get(t, 0) + n
                task = asyncio.create_task(self._push_one(caps), name="work-claim")
                claims.add(task)
                task.add_done_callback(lambda done: self._claim_ended(claims, done))
            if claims:  # a waiting claim gives up; those writing push what they claimed
                await asyncio.gather(*claims, return_exceptions=True)
        finally:
            for task in claims:
                task.cancel()
        self.send(pb.WorkResponse(stopped=True))

    def _claim_ended(self, claims: set[asyncio.Task[None]], done: asyncio.Task[None]) -> None:
        """A claim's task is over: out of the set, and the pushing task looks again (it may
        have seen the set full just before, when the claim had set the event but was not
        done yet: without this it slept with credits to use and jobs ready)."""
        claims.discard(done)
        self._credit_event.set()

    async def _push_one(self, caps: dict[str, int]) -> None:
        """One claim of at most ``caps`` jobs per type (credits held for it), then its push.
        ``caps`` is lowered in place to what the claim took once it took it."""
        me = object()
        took_at = 0.0

        def before_write(items: Sequence[ReadyItem]) -> None:
            nonlocal took_at
            took_at = self._node.clock.monotonic()  # the leases start after this
            self._took(me, caps, items)

        claimed: list[Claimed] = []
        failed = True
        self._node.polled.asked(caps)  # an idle worker's claims go on: it is still asking
        try:
            claimed = await self._node.claims.claim(
                worker=self._worker,
                types=list(caps),
                limit=min(sum(caps.values()), self._push_cap),
                wait_s=WAIT_S,
                lease_s=self._lease_s,
                caps=caps,
                give_up=self._give_up,
                before_write=before_write,
                early=self._starts_in,
            )
            failed = False
        except TimeshardError as exc:  # the store is away: the claim is tried again
            await asyncio.sleep(self._claim_failures.failed(self._worker, exc.message))
        except Exception:  # not ours to end the stream for: tried again, loudly
            log.exception("worker stream of %s: claim failed", self._worker)
            await asyncio.sleep(1.0)
        finally:
            after_seq, read_at = self._claim_over(me, caps, claimed)
        if not failed and self._claim_failures.count:
            self._claim_failures.succeeded(self._worker)
        for c in claimed:
            t = c.job.job_type
            if t in self._credits:  # (not after a stop, which dropped them all)
                self._credits[t] -= 1
        # The credits this claim held and did not spend are free again: the claim waiting now
        # may not cover their type.
        self._wake_if_uncovered()
        if not claimed:
            return
        if self._starts_in:  # revocable at once: a revoke is written after the push
            self._start_in_by(claimed)
        self._hub.node.metrics.claim_message()  # a push: the stream's message of claimed jobs
        held_ms = max(0, int((took_at - read_at) * 1000)) if after_seq else 0
        self.send(
            _Push(
                claimed=claimed,
                took_at=took_at,
                response=pb.WorkResponse(after_seq=after_seq, held=dur(held_ms)),
            )
        )

    def _took(self, me: object, caps: dict[str, int], items: Sequence[ReadyItem]) -> None:
        """Claim ``me`` is about to write ``items``: it notes the last request read, keeps the
        credits of only as many jobs per type as it took (``caps`` lowered in place), and the
        next claim may wait for the next jobs."""
        self._stamps.setdefault(me, (self._seq, self._read_at))
        taken: dict[str, int] = {}
        for item in items:
            taken[item.job_type] = taken.get(item.job_type, 0) + 1
        for t in caps:
            keep = min(caps[t], taken.get(t, 0))
            self._held[t] -= caps[t] - keep
            caps[t] = keep
        self._waiting = False
        self._credit_event.set()  # the next claim may wait for the next jobs now

    def _claim_over(
        self, me: object, caps: dict[str, int], claimed: Sequence[Claimed]
    ) -> tuple[int, float]:
        """Claim ``me`` ended (``claimed`` what it took): its credits are no longer held.
        Returns the request its push names and when it was read."""
        for t, n in caps.items():
            self._held[t] -= n
        if self._waiting and not claimed and self._waiting_caps is caps:
            self._waiting = False  # gave up, or failed, before taking anything
        self._credit_event.set()
        # A push names the earliest request read before any claim still unsent took its
        # time: claims end in any order, and the worker counts on pushes that never name
        # an earlier request than the one before (an earlier one only makes its deadline
        # earlier, never later than the lease's real end).
        after_seq, read_at = min(self._stamps.values(), default=(0, 0.0))
        self._stamps.pop(me, None)
        return after_seq, read_at

    def _give_up(self) -> bool:
        return self._changed or self._stopping

    # -- writing ------------------------------------------------------------------------------

    def send(self, response: pb.WorkResponse | _Push) -> None:
        """Queue ``response`` for the writing task (never awaited by its producer: a worker
        that stops reading holds up its own stream only)."""
        if isinstance(response, pb.WorkResponse) and response.seq:
            self._answers_due -= 1
        self._unsent.append(response)
        self._has_unsent.set()

    async def _write_loop(self) -> None:
        while True:
            if not self._unsent:
                if self._hold.answer is not None:
                    await self._wait_for_push()
                    if not self._unsent:  # none came in time: the answer goes alone
                        await self._write(self._hold.release())
                    continue
                self._drained.set()
                self._has_unsent.clear()
                await self._has_unsent.wait()
                continue
            out = self._unsent.popleft()
            if isinstance(out, _Push):
                response = self._in_time(out)
                if response is None:
                    continue
                out = response
            if self._hold.may_hold(out, starts_in=self._starts_in, stopping=self._stopping):
                if self._hold.answer is not None:  # (a message carries one answer)
                    await self._write(self._hold.release())
                self._hold.answer = out
                continue
            if self._hold.answer is not None and not out.seq:
                answer = self._hold.release()
                out.seq = answer.seq  # (it answers results only: no heartbeats)
                out.results.extend(answer.results)
            await self._write(out)

    async def _write(self, out: pb.WorkResponse) -> None:
        await self._context.write(out)
        self._hub.written.inc()

    async def _wait_for_push(self) -> None:
        """Until something is queued to write (the push the held answer rides with), the
        hold is over, or the stream stops."""
        self._has_unsent.clear()
        left = self._hold.left_s()
        if self._unsent or self._stopping or left <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await self._has_unsent.wait()

    # -- back-pressure (invariant 9: waiting never spends an attempt) --------------------------

    def _in_time(self, push: _Push) -> pb.WorkResponse | None:
        """The push's message, or None when its jobs would reach the worker with less than
        half their lease left: a node never writes a push already too late. Those jobs are
        given back, not started (uncounted), their credits are the stream's again, and the
        stream is behind."""
        lease_ms = push.claimed[0].lease_ms
        spent_ms = (self._node.clock.monotonic() - push.took_at) * 1000
        if spent_ms <= lease_ms / 2:
            # To a worker that bounds its start from the push's base: the base moves to now
            # (``held`` grows by the time spent here), each lease shrinks by as much, so the
            # worker's deadline stays where it was and its start's grace counts from now.
            lag = int(spent_ms) if self._starts_in and push.response.after_seq else 0
            if lag:
                push.response.held.CopyFrom(dur(round(dur_s(push.response.held) * 1000) + lag))
            jobs = (claimed_to_pb(c.job, c.lease_ms - lag) for c in push.claimed)
            push.response.jobs.extend(jobs)
            if self._starts_in:
                self._start_in(push.response.jobs)
            return push.response
        reason = (
            f"{NOT_STARTED}: the node's push to worker {self._worker} was behind "
            f"({spent_ms / 1000:.3f}s of its {lease_ms / 1000:g}s lease over before it was "
            "written)"
        )
        for c in push.claimed:
            t = c.job.job_type
            if t in self._credits:
                self._credits[t] += 1
        self._credit_event.set()
        task = asyncio.create_task(self._give_back(push.claimed, reason), name="work-give-back")
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)
        self._fell_behind()
        return None

    def _start_in(self, jobs: Sequence[pb.ClaimedJob]) -> None:
        """Each job's ``starts_in``, from this node's clock as the push is written (transit only
        makes the start later), to the microsecond (a whole millisecond's cut would make the
        start later by half one on average), and the latest its worker may start it (for a
        cancel)."""
        now = now_us(self._node.clock)
        for c in jobs:
            run_at = ts_ms(c.job.run_at)
            starts_in = max(0, run_at * 1000 - now)
            c.starts_in.CopyFrom(dur_us(starts_in))
            c.starts_in.SetInParent()  # (present even when 0: due now)
            start_by = max(run_at, -(-now // 1000)) + START_GRACE_MS
            self._node.starts.pushed(c.job.job_id, c.fence, start_by, self._revoke)

    def _start_in_by(self, claimed: Sequence[Claimed]) -> None:
        """The latest the jobs could start until their push is written (``_start_in``): within
        half a lease of the claim, or given back unstarted."""
        now = self._node.clock.now_ms()
        for c in claimed:
            written_by = now + c.lease_ms // 2
            start_by = max(written_by, c.job.run_at) + START_GRACE_MS
            self._node.starts.pushed(c.job.job_id, c.job.fence, start_by, self._revoke)

    def _revoke(self, job_id: str, fence: int) -> None:
        """Ask the worker not to start a job pushed to it (it answers in ``revoked``)."""
        self.send(pb.WorkResponse(revokes=[pb.WorkRevoke(job_id=job_id, fence=fence)]))

    async def _give_back(self, claimed: Sequence[Claimed], reason: str) -> None:
        """Jobs this node claimed and did not push, back to ``scheduled`` at once (a job whose
        give-back fails here is released by its owner when its lease ends, uncounted too)."""
        for c in claimed:
            try:
                await self._node.attempts.give_back(
                    c.job.job_id, c.job.fence, reason, not_started=True
                )
            except TimeshardError as exc:
                log.info("job %s: not given back (%s); its lease ends it", c.job.job_id, exc)

    def _fell_behind(self) -> None:
        """A push reached, or would reach, the worker too late: claim nothing for this stream
        for half a lease (at most a second) and until its pushes are written."""
        now = self._node.clock.monotonic()
        self._behind_until = max(self._behind_until, now + min(self._lease_s / 2 or 1.0, 1.0))
        if not self._counted_behind:
            self._counted_behind = True
            self._node.metrics.stream_behind(+1)
            log.info("worker stream of %s: pushes behind; claims paused", self._worker)

    def _behind(self) -> bool:
        if not self._counted_behind:
            return False
        if self._node.clock.monotonic() < self._behind_until or any(
            isinstance(u, _Push) for u in self._unsent
        ):
            return True
        self._counted_behind = False
        self._node.metrics.stream_behind(-1)
        log.info("worker stream of %s: pushes caught up; claims resume", self._worker)
        return False

    async def _catch_up(self) -> None:
        """Wait (bounded steps) for the stream to catch up, or to stop."""
        left = self._behind_until - self._node.clock.monotonic()
        self._credit_event.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(max(left, 0.01), 0.1)):
                await self._credit_event.wait()


def _beat(n: int, h: pb.HeartbeatRequest, now_ms: int) -> Beat | TimeshardError:
    try:
        validate_job_id(h.job_id)
        if h.lease.seconds < 0 or h.lease.nanos < 0:
            raise InvalidArgument("lease", "must not be negative")
    except InvalidArgument as exc:
        return InvalidArgument(f"heartbeats[{n}].{exc.field}", exc.problem)
    return Beat(h.job_id, h.fence, dur_s(h.lease), started_at_of(h, now_ms))


def _notices(started: Sequence[pb.HeartbeatRequest], now_ms: int) -> list[Beat]:
    """A request's start notices (invariant 9); a malformed one ends the stream."""
    out = []
    for n, h in enumerate(started):
        try:
            validate_job_id(h.job_id)
        except InvalidArgument as exc:
            raise InvalidArgument(f"started[{n}].{exc.field}", exc.problem) from None
        started_at = ts_ms(h.started_at) if h.HasField("started_at") else now_ms
        out.append(Beat(h.job_id, h.fence, 0.0, max(1, started_at)))
    return out
