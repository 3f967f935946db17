"""The Python worker SDK.

    from timeshard.worker import Worker, PermanentError

    worker = Worker()

    @worker.handler("email.send", timeout=30, concurrency=8)
    async def send(ctx):            # or a plain def: it runs in a thread
        await mailer.send(ctx.json(), idempotency_key=ctx.idempotency_key)

    asyncio.run(worker.run(["127.0.0.1:50051"]))

The worker claims over gRPC (long poll), heartbeats each job's lease (``heartbeats``), and
cancels a handler whose lease it could not extend before ``lease - safety_margin`` on its own
monotonic clock (invariant 6), so a paused or partitioned worker stops before another may start
the job. ``ctx.cancelled`` reads that clock when asked, so a process paused past its lease sees
it the moment it resumes; call ``ctx.check()`` (or ``await ctx.checkpoint()``) before each step
with an effect, and it raises ``LeaseLost`` instead. A handler that raises ``PermanentError``
sends its job straight to the dead-letter queue; any other exception is retried with backoff.

A result is retried, on the job's node and then the others, until it is in or the lease is over
(``results``), the lease extended meanwhile; nothing is sent once the lease is over.

``worker.stop(drain_s)`` (what ``timeshard worker`` does on SIGTERM/SIGINT) stops claiming, lets
the running handlers finish for at most ``drain_s`` (a second ``stop()`` ends that at once), then
stops the others and gives their jobs back, so they run elsewhere at once and the unfinished
attempt does not count against ``max_attempts``. A handler that does not stop (a thread inside a
blocking call) is not given back: its job is left to its lease expiry, a failed attempt.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import json
import logging
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from timeshard.clock import Clock, SystemClock
from timeshard.limits import MAX_CLAIM_TYPES, MAX_REPLY_BYTES, truncate_error
from timeshard.model import validate_job_type, validate_worker_id
from timeshard.security.channel import ClientSecurity, TlsArg
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, dur_s, translate, ts_ms
from timeshard.worker.heartbeats import DeferredHeartbeats, Heartbeats
from timeshard.worker.lease import Lease, LeaseLost
from timeshard.worker.results import Results

log = logging.getLogger("timeshard.worker")  # the SDK logs as one component

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub


class PermanentError(Exception):
    """Raise from a handler when retrying can not help (bad input): the job goes to the DLQ."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobContext:
    job_id: str
    job_type: str
    payload: bytes
    attempt: int
    max_attempts: int
    fence: int
    """Pass to external systems that must reject stale writers (invariant 6)."""
    idempotency_key: str
    run_at: int
    started_at_ms: int
    worker_id: str
    _lease: Lease = field(default_factory=Lease, repr=False)

    def json(self) -> Any:
        return json.loads(self.payload or b"null")

    @property
    def cancelled(self) -> bool:
        """True once this job is no longer the handler's to work on — its lease not extended in
        time, lost to another worker, the job cancelled, or the type's timeout passed: stop and
        do not write. Read from the monotonic clock when asked, so a process paused past its
        lease sees it the moment it resumes."""
        return self._lease.over

    def check(self) -> None:
        """Raise ``LeaseLost`` if ``cancelled``: call it before each step that has an effect."""
        if self._lease.over:
            raise LeaseLost(f"job {self.job_id}: {self._lease.why()}")

    async def checkpoint(self) -> None:
        """``check()``, after letting the event loop run (the heartbeat loop among the rest)."""
        await asyncio.sleep(0)
        self.check()

    @property
    def lateness_ms(self) -> int:
        return self.started_at_ms - self.run_at


Handler = Callable[[JobContext], Any]
EventHook = Callable[[str, JobContext, str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class HandlerSpec:
    job_type: str
    fn: Handler
    timeout_s: float
    concurrency: int
    is_async: bool


SHUT_DOWN = "worker shut down"
"""Why a job was given back: the reason stored with its attempt."""
STOP_GRACE_S = 2.0
"""After the drain, how long the handlers still running get to stop before their jobs are
given back (or, if they do not stop, left to their lease)."""


@dataclass(kw_only=True, slots=True)
class _InFlight:
    """A job this worker runs, as the drain needs it."""

    ctx: JobContext
    stub: WorkerStub
    task: asyncio.Task[None]
    is_async: bool
    handler: asyncio.Task[Any] | None = None


class _HandlerThreads(ThreadPoolExecutor):
    """The handlers' threads, knowing how many calls have not ended (a thread interrupted at
    the drain may not end at once: inside a blocking C call it ends when the call returns).
    A call has ended when its future is done, which the pool sets as the handler returns."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="job")
        self._calls: set[Future[Any]] = set()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        call = super().submit(fn, *args, **kwargs)
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        return call

    @property
    def active(self) -> int:
        return sum(1 for call in list(self._calls) if not call.done())


class Worker:
    def __init__(
        self,
        *,
        worker_id: str | None = None,
        lease_s: float = 30.0,
        safety_margin_s: float | None = None,
        claim_wait_s: float = 20.0,
        clock: Clock | None = None,
        on_event: EventHook | None = None,
        tls: TlsArg = None,
        token: str | None = None,
    ) -> None:
        self.worker_id = validate_worker_id(
            worker_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        )
        self.lease_s = lease_s
        self.safety_margin_s = safety_margin_s if safety_margin_s is not None else lease_s / 6
        if not 0 < self.safety_margin_s < lease_s:
            raise ValueError("need 0 < safety_margin_s < lease_s")
        self.claim_wait_s = claim_wait_s
        self._clock = clock or SystemClock()
        self._on_event = on_event
        self.tls = tls
        """TLS: a directory of PEM files or a ``ClientTls``; None: ``TIMESHARD_TLS_DIR``, read
        when the worker starts running."""
        self.token = token
        """The role token; None: ``TIMESHARD_TOKEN``, read when the worker starts running."""
        self.handlers: dict[str, HandlerSpec] = {}
        self._running: dict[str, int] = {}
        self._capacity = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._threads: ThreadPoolExecutor | None = None
        self._nodes: _Nodes | None = None
        self._results = Results(self._clock, self._other_nodes)
        self.drain_s = 30.0
        """On ``stop``, how long running handlers may take to finish before their jobs are
        given back."""
        self.abandoned = 0
        """Handlers that had not stopped when ``run`` returned (their threads may still run;
        their jobs are left to their lease expiry)."""
        self._inflight: dict[str, _InFlight] = {}
        self._stop_event: asyncio.Event | None = None
        self._stop_asked = False
        self._drain_over = asyncio.Event()

    # -- building -------------------------------------------------------------------------

    def handler(
        self, job_type: str, *, timeout: float = 300.0, concurrency: int = 1
    ) -> Callable[[Handler], Handler]:
        """Register ``fn(ctx)`` (async or sync) for ``job_type``; checked now, not at run time."""
        validate_job_type(job_type)
        if timeout <= 0 or concurrency < 1:
            raise ValueError(f"{job_type}: need timeout > 0 and concurrency >= 1")
        if job_type in self.handlers:
            raise ValueError(f"{job_type}: a handler is already registered")
        if len(self.handlers) >= MAX_CLAIM_TYPES:
            raise ValueError(f"at most {MAX_CLAIM_TYPES} job types per worker (one claim)")

        def register(fn: Handler) -> Handler:
            params = [
                p
                for p in inspect.signature(fn).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            if len(params) != 1:
                raise TypeError(f"handler {fn.__name__} for {job_type} must take one argument: ctx")
            self.handlers[job_type] = HandlerSpec(
                job_type=job_type,
                fn=fn,
                timeout_s=timeout,
                concurrency=concurrency,
                is_async=inspect.iscoroutinefunction(fn),
            )
            return fn

        return register

    # -- running --------------------------------------------------------------------------

    async def run(
        self,
        servers: Sequence[str],
        stop: asyncio.Event | None = None,
        *,
        discover_every_s: float = 5.0,
    ) -> None:
        """Claim and run jobs from every node until ``stop`` is set or ``stop()`` is called,
        then drain (see ``stop``). ``servers`` are seeds: the worker asks them for the
        cluster's members (AdminService.ClusterInfo) every ``discover_every_s`` and claims from
        each live node, so it keeps working as nodes join and leave (0 turns discovery off)."""
        if not self.handlers:
            raise ValueError("register at least one handler before running the worker")
        stop = self._stop_event = stop or asyncio.Event()
        if self._stop_asked:
            stop.set()
        threads = sum(s.concurrency for s in self.handlers.values() if not s.is_async)
        threads_pool = self._threads = _HandlerThreads(max(1, threads))
        nodes = self._nodes = _Nodes(self, stop, ClientSecurity.resolve(self.tls, self.token))
        for address in servers:
            nodes.add(address)
        discovery = (
            asyncio.create_task(nodes.discover(list(servers), discover_every_s), name="discover")
            if discover_every_s > 0
            else None
        )
        try:
            await stop.wait()
        finally:
            if discovery is not None:
                discovery.cancel()
            await nodes.stop_claiming()
            await self._drain(threads_pool)
            await nodes.close()
            threads_pool.shutdown(wait=False, cancel_futures=True)

    def _free(self) -> dict[str, int]:
        """Types worth a claim now, with their free slots: a type claims again once a
        quarter of its slots (or all, when idle) are free, so a busy worker asks for jobs in
        batches rather than one round trip per finished job."""
        out = {}
        for t, s in self.handlers.items():
            running = self._running.get(t, 0)
            free = s.concurrency - running
            if free > 0 and (running == 0 or free >= max(1, s.concurrency // 4)):
                out[t] = free
        return out

    def _poll_wait_s(self) -> float:
        """A long poll waits at most half of what a lease leaves after its margin, so a claim
        taken at the end of the wait still has a lease counted from when it was sent."""
        return min(self.claim_wait_s, (self.lease_s - self.safety_margin_s) / 2)

    async def _claim_loop(self, stub: WorkerStub, stop: asyncio.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            free = self._free()
            if not free:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            req = pb.ClaimRequest(
                worker_id=self.worker_id,
                types=sorted(free),
                max_jobs=min(free.values()),
                max_reply_bytes=MAX_REPLY_BYTES,  # our channels accept that much
                wait=dur(round(self._poll_wait_s() * 1000)),
                lease=dur(round(self.lease_s * 1000)),
            )
            sent = self._clock.monotonic()
            try:
                resp = await stub.Claim(req, timeout=self._poll_wait_s() + 10)
            except grpc.RpcError as exc:
                log.warning("claim failed: %s; retrying in %.1fs", translate(exc), backoff)
                await self._clock.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            backoff = 0.1
            for claimed in resp.jobs:
                self._start(stub, claimed, sent)

    def _start(self, stub: WorkerStub, claimed: pb.ClaimedJob, sent: float) -> None:
        job = claimed.job
        if self._clock.monotonic() >= sent + dur_s(claimed.lease) - self.safety_margin_s:
            # The lease was over before the reply was even read (this process was stopped):
            # the job is someone else's now; its handler must not take a single step.
            log.warning("job %s: claim arrived after its lease; not started", job.job_id)
            self._capacity.set()
            return
        self._running[job.type] = self._running.get(job.type, 0) + 1
        ctx = JobContext(
            job_id=job.job_id,
            job_type=job.type,
            payload=job.payload,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            fence=claimed.fence,
            idempotency_key=claimed.idempotency_key,
            run_at=ts_ms(job.run_at),
            started_at_ms=ts_ms(job.started_at),
            worker_id=self.worker_id,
        )
        # The lease started when the server took the claim, at some point after ``sent``: a
        # safe base whatever happened since, even a reply that sat in the socket while this
        # process was stopped (its arrival is not: a handler then acted on a lease long over,
        # found by the chaos suite). A long poll waits at most half the lease, so a claim that
        # waited still has time; it sends a heartbeat at once to get the rest.
        received = self._clock.monotonic()
        waited = received - sent > self.safety_margin_s / 2
        deadline = sent + dur_s(claimed.lease) - self.safety_margin_s
        task = asyncio.create_task(
            self._execute(stub, ctx, deadline, heartbeat_now=waited), name=f"job-{job.job_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._track(ctx, stub, task)

    def _emit(self, kind: str, ctx: JobContext, detail: str = "") -> None:
        if self._on_event is not None:
            self._on_event(kind, ctx, detail)

    async def _execute(
        self, stub: WorkerStub, ctx: JobContext, deadline: float, heartbeat_now: bool = False
    ) -> None:
        spec = self.handlers[ctx.job_type]
        ctx._lease.begin(self._clock, deadline)
        self._emit("started", ctx)
        handler = asyncio.create_task(self._invoke(spec, ctx), name=f"handler-{ctx.job_id}")
        self._track_handler(ctx, handler)  # for the drain (``stop``)
        heartbeats = self._start_heartbeats(stub, ctx, handler, heartbeat_now)
        freed = False

        def free_slot() -> None:
            nonlocal freed
            if not freed:
                freed = True
                self._running[ctx.job_type] -= 1
                self._capacity.set()

        try:
            outcome = await self._outcome(spec, ctx, handler)
            # The handler is done: its slot takes the next job while the result travels (in a
            # batch with others); the heartbeat loop extends the lease until the result is in.
            free_slot()
            if outcome is not None:
                await self._report(stub, ctx, *outcome)
        finally:
            heartbeats.cancel()
            free_slot()

    async def _outcome(
        self, spec: HandlerSpec, ctx: JobContext, handler: asyncio.Task[Any]
    ) -> tuple[str, str] | None:
        """("complete", "") / ("retry", error) / ("permanent", error), or None when the lease
        was lost (nothing to report: the job is someone else's now)."""
        try:
            async with asyncio.timeout(spec.timeout_s):
                await asyncio.shield(handler)
            return ("complete", "")
        except TimeoutError:
            ctx._lease.stop(f"timed out after {spec.timeout_s:g}s")
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
            return ("retry", f"timed out after {spec.timeout_s:g}s")
        except (asyncio.CancelledError, LeaseLost):
            if ctx.cancelled:
                self._emit("lost", ctx, f"{ctx._lease.why()}; handler stopped")
                return None
            raise
        except PermanentError as exc:
            return ("permanent", f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            return ("retry", f"{type(exc).__name__}: {exc}")

    async def _invoke(self, spec: HandlerSpec, ctx: JobContext) -> Any:
        if spec.is_async:
            return await spec.fn(ctx)
        loop = asyncio.get_running_loop()
        ident: list[int] = []

        def call() -> Any:
            ident.append(threading.get_ident())
            return spec.fn(ctx)

        assert self._threads is not None
        fut = loop.run_in_executor(self._threads, call)
        try:
            return await fut
        except asyncio.CancelledError:
            if ident:  # interrupt the thread at its next bytecode (not inside a C call)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(ident[0]), ctypes.py_object(LeaseLost)
                )
            raise

    def _start_heartbeats(
        self, stub: WorkerStub, ctx: JobContext, handler: asyncio.Task[Any], heartbeat_now: bool
    ) -> asyncio.Task[None] | DeferredHeartbeats:
        """The job's heartbeat loop (``heartbeats``), with this worker's lease settings."""
        heartbeats = Heartbeats(
            clock=self._clock,
            results=self._results,
            job_id=ctx.job_id,
            fence=ctx.fence,
            lease=ctx._lease,
            lease_s=self.lease_s,
            safety_margin_s=self.safety_margin_s,
        )
        return heartbeats.start(stub, handler, heartbeat_now)

    async def _report(self, stub: WorkerStub, ctx: JobContext, kind: str, error: str) -> None:
        """Send the result, retried until it is in or the lease is over (``Results``); once the
        lease is over nothing is sent, and the job is left to its lease expiry."""
        item = pb.FinishItem(
            job_id=ctx.job_id,
            fence=ctx.fence,
            failed=kind != "complete",
            error=truncate_error(error),  # the server would; a long one could not be sent
            permanent=kind == "permanent",
        )
        result, why = await self._results.deliver(item, stub, ctx._lease)
        if result is None:
            self._emit("unreported", ctx, f"{why}; the job is left to its lease expiry")
        elif result.code == 0:
            self._emit("succeeded" if kind == "complete" else "failed", ctx, error)
        else:
            self._emit("rejected", ctx, result.message)

    # -- stopping (the drain; apart from running a job) ------------------------------------

    def stop(self, drain_s: float | None = None) -> None:
        """Stop gracefully; ``run`` returns when done. The first call stops claiming and lets
        running handlers finish for at most ``drain_s`` (default ``self.drain_s``); a second call
        ends that wait at once. Then each handler still running is stopped (cancelled, or its
        thread interrupted) and, once it has stopped, its job is given back: scheduled again
        now, to run elsewhere, the attempt not counted against ``max_attempts``. A handler that
        does not stop within ``STOP_GRACE_S`` is not given back (it may still act): its job is
        left to its lease expiry, which counts as a failed attempt."""
        if self._stop_asked:
            self._drain_over.set()
            return
        self._stop_asked = True
        if drain_s is not None:
            self.drain_s = drain_s
        if self._stop_event is not None:
            self._stop_event.set()

    @property
    def stopping(self) -> bool:
        """``stop()`` was called (the drain is under way or done)."""
        return self._stop_asked

    def _track(self, ctx: JobContext, stub: WorkerStub, task: asyncio.Task[None]) -> None:
        spec = self.handlers[ctx.job_type]
        self._inflight[ctx.job_id] = _InFlight(
            ctx=ctx, stub=stub, task=task, is_async=spec.is_async
        )
        task.add_done_callback(lambda _: self._inflight.pop(ctx.job_id, None))

    def _track_handler(self, ctx: JobContext, handler: asyncio.Task[Any]) -> None:
        tracked = self._inflight.get(ctx.job_id)
        if tracked is not None:
            tracked.handler = handler

    async def _drain(self, threads: _HandlerThreads) -> None:
        if self._tasks:
            log.info(
                "worker %s: stopping; waiting up to %.0f s for %d running jobs",
                self.worker_id,
                self.drain_s,
                len(self._tasks),
            )
            await self._until(lambda: not self._tasks, self.drain_s, self._drain_over)
        left = [f for f in self._inflight.values() if not f.task.done()]
        if not left:
            return
        for f in left:
            f.ctx._lease.stop(SHUT_DOWN)
            if f.handler is not None:
                f.handler.cancel()

        def stopped() -> bool:
            return all(f.task.done() for f in left) and threads.active == 0

        await self._until(stopped, STOP_GRACE_S)
        await asyncio.gather(*(self._give_back(f, threads) for f in left))

    async def _give_back(self, f: _InFlight, threads: _HandlerThreads) -> None:
        ended = f.task.done() and f.handler is not None and f.handler.done()
        if not ended or (not f.is_async and threads.active > 0):
            self.abandoned += 1
            log.warning("job %s: its handler did not stop; left to its lease expiry", f.ctx.job_id)
            self._emit("abandoned", f.ctx, "the handler did not stop; left to its lease")
            return
        if f.handler is not None and not f.handler.cancelled():
            return  # it finished on its own meanwhile: its result was reported
        item = pb.FinishItem(
            job_id=f.ctx.job_id, fence=f.ctx.fence, failed=True, error=SHUT_DOWN, give_back=True
        )
        result, why = await self._results.deliver(item, f.stub, f.ctx._lease)
        if result is not None and result.code == 0:
            self._emit("given back", f.ctx, SHUT_DOWN)
        else:
            self._emit("unreported", f.ctx, why or (result.message if result else ""))

    async def _until(
        self, done: Callable[[], bool], timeout_s: float, cut: asyncio.Event | None = None
    ) -> None:
        """Wait until ``done()``, ``timeout_s`` have passed (this worker's clock) or ``cut``
        is set."""
        deadline = self._clock.monotonic() + timeout_s
        while not done() and self._clock.monotonic() < deadline:
            if cut is not None and cut.is_set():
                return
            await self._clock.sleep(min(0.05, max(0.0, deadline - self._clock.monotonic())))

    def _other_nodes(self) -> list[WorkerStub]:
        return list(self._nodes.stubs.values()) if self._nodes is not None else []


class _Nodes:
    """The nodes a worker claims from: one channel and one claim loop each."""

    def __init__(self, worker: Worker, stop: asyncio.Event, security: ClientSecurity) -> None:
        self._worker = worker
        self._stop = stop
        self._security = security
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.loops: dict[str, asyncio.Task[None]] = {}
        self.stubs: dict[str, WorkerStub] = {}
        """The live nodes' WorkerService: where results and heartbeats may go."""

    def add(self, address: str) -> None:
        if address in self.loops:
            return
        channel = self._channel(address)
        stub = self.stubs[address] = pb_grpc.WorkerServiceStub(channel)
        self.loops[address] = asyncio.create_task(
            self._worker._claim_loop(stub, self._stop), name=f"claim-{address}"
        )

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = self._security.aio_channel(
                address, options=[("grpc.max_receive_message_length", MAX_REPLY_BYTES)]
            )
        return self.channels[address]

    def drop(self, address: str) -> None:
        """Stop claiming from a node that left; its channel stays open for the heartbeats
        and reports of jobs it handed out."""
        loop = self.loops.pop(address, None)
        self.stubs.pop(address, None)
        if loop is not None:
            loop.cancel()

    async def discover(self, seeds: list[str], every_s: float) -> None:
        while True:
            members = await self._members(seeds)
            if members:
                for address in members - set(self.loops):
                    log.info("worker: node %s joined; claiming from it", address)
                    self.add(address)
                for address in set(self.loops) - members:
                    log.info("worker: node %s left; no longer claiming from it", address)
                    self.drop(address)
            await self._worker._clock.sleep(every_s)

    async def _members(self, seeds: list[str]) -> set[str]:
        """Live nodes' addresses, from the first node that answers."""
        for address in [*self.loops, *seeds]:
            channel = self._channel(address)
            try:
                info = await pb_grpc.AdminServiceStub(channel).ClusterInfo(
                    pb.ClusterInfoRequest(), timeout=5
                )
            except grpc.RpcError:
                continue
            return {n.address for n in info.nodes if n.address}
        return set()

    async def stop_claiming(self) -> None:
        loops = list(self.loops.values())
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self.loops.clear()

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close(None)
