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

This module is the ``Worker``: its public API and the wiring of its parts. What a handler is
given (``JobContext``, ``PermanentError``) is in ``context``; the nodes it takes jobs from
(discovery, channels, links) in ``nodes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import logging
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from timeshard.client import AsyncClient, Client, Retry, ScheduleSpec
from timeshard.clock import Clock, SystemClock
from timeshard.errors import InvalidArgument, Unavailable
from timeshard.limits import MAX_CLAIM_TYPES, MAX_REPLY_BYTES, truncate_error
from timeshard.model import NOT_STARTED, validate_job_type, validate_worker_id
from timeshard.security.channel import ClientSecurity, TlsArg, server_from_env
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, dur_s, schedule_from_pb, translate, ts, ts_ms
from timeshard.worker.context import EventHook, Handler, HandlerSpec, JobContext, PermanentError
from timeshard.worker.heartbeats import DeferredHeartbeats, Heartbeats
from timeshard.worker.lease import LeaseLost
from timeshard.worker.nodes import Link, Nodes
from timeshard.worker.results import Results
from timeshard.worker.returns import ResultError, encode_result, traceback_of
from timeshard.worker.slots import Run, Slots
from timeshard.worker.stream import Host, NodeLink
from timeshard.worker.tasks import Task, WorkerClients, cron_spec, declare, task_handler

__all__ = ["EventHook", "JobContext", "PermanentError", "Worker"]
"""The names imported from here before ``context`` was split out still are."""

log = logging.getLogger("timeshard.worker")  # the SDK logs as one component

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub


class _Ended(NamedTuple):
    """How a handler ended, as reported: ``complete``, ``retry`` or ``permanent``."""

    kind: str
    error: str = ""
    traceback: str = ""
    result: bytes = b""
    result_encoding: str = ""


def _failed(kind: str, exc: BaseException, error: str | None = None) -> _Ended:
    """A failed end with the exception's traceback (of what the handler raised itself, for
    the exits ``_Raised`` stands for)."""
    raised = exc.__cause__ if isinstance(exc, _Raised) and exc.__cause__ else exc
    return _Ended(kind, error or _describe(exc), traceback_of(raised))


NOTICE_WAIT_S = 0.05
"""How long a handler's first step waits for its start notice to be handed to the transport
(then it goes on: its heartbeats carry the notice again)."""
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
    started: bool = False
    """Its handler started (its start notice went out): a give-back at the drain then says
    it was stopped, not that it never started."""


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
        use_stream: bool = True,
        claim_polls: int = 2,
        server: str | None = None,
        schedules: Sequence[ScheduleSpec] = (),
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
        self.use_stream = use_stream
        """Take jobs over each node's worker stream (``WorkerService.Work``; the default),
        falling back to the unary calls on a node without it; False: the unary calls only."""
        if claim_polls < 1:
            raise ValueError("claim_polls must be at least 1")
        self.claim_polls = claim_polls
        """Unary long polls in flight per job type and node, each asking for its share of the
        free slots: while one claim is written, the next one already waits, so a job coming
        due meanwhile is claimed at once rather than after that write (on Cassandra one claim
        is a Paxos round per partition, and the jobs due during it waited for its end)."""
        self.handlers: dict[str, HandlerSpec] = {}
        self.server = server
        """Where ``Task.schedule`` sends jobs: None is ``TIMESHARD_SERVER`` until ``run`` is
        given its servers."""
        self.tasks: dict[str, Task[Any]] = {}
        self.schedules: list[ScheduleSpec] = []
        """Cron schedules declared in code, created or updated by id when the worker starts."""
        for spec in schedules:
            self.declare(spec)
        self._clients = WorkerClients(self)
        self.declared = False
        """True once a running worker has set its type policies and schedules (it claims
        only then)."""
        self._slots = Slots(lambda job_type: self.handlers[job_type].concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._threads: ThreadPoolExecutor | None = None
        self._nodes: Nodes | None = None
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

    def task(
        self,
        job_type: str,
        *,
        retry: Retry | None = None,
        timeout: float = 300.0,
        concurrency: int = 1,
        cluster_concurrency: int = 0,
    ) -> Callable[[Callable[..., Any]], Task[Any]]:
        """Register a task: ``fn(payload)`` or ``fn(payload, ctx: JobContext)``, async or not,
        whose payload parameter's type (a dataclass, a TypedDict...) every payload is checked
        against (``timeshard.worker.tasks``). Returns the ``Task``: ``task.schedule(...)``.

        ``timeout`` and ``concurrency`` hold in this worker; ``retry`` and
        ``cluster_concurrency`` (running at once across the cluster, 0: no limit) are the
        type's policy, set on the cluster when the worker starts."""
        if cluster_concurrency < 0:
            raise InvalidArgument("cluster_concurrency", "must be at least 1 (0: no limit)")

        def register(fn: Callable[..., Any]) -> Task[Any]:
            handler, payload_type = task_handler(job_type, fn, JobContext, PermanentError)
            self.handler(job_type, timeout=timeout, concurrency=concurrency)(handler)
            task: Task[Any] = Task(
                self,
                job_type,
                fn,
                payload_type,
                retry=retry,
                timeout_s=timeout,
                concurrency=concurrency,
                cluster_concurrency=cluster_concurrency,
            )
            self.tasks[job_type] = task
            return task

        return register

    def cron(
        self,
        cron: str,
        *,
        id: str,
        tz: str = "UTC",
        job_type: str | None = None,
        payload: Any = None,
        retry: Retry | None = None,
        timeout: float = 300.0,
        concurrency: int = 1,
        **options: Any,
    ) -> Callable[[Callable[..., Any] | Task[Any]], Task[Any]]:
        """Declare a cron schedule in code, created (or updated, by ``id``) when the worker
        starts: on a function, it is also registered as the task ``job_type`` (default
        ``cron.<id>``); on a ``Task``, its runs are that task's jobs. ``options``: those of
        ``ScheduleSpec`` (misfire, overlap, max_concurrent, jitter, dst_gap, dst_fold...)."""

        def register(target: Callable[..., Any] | Task[Any]) -> Task[Any]:
            if isinstance(target, Task):
                task_type, payload_type = target.job_type, target.payload_type
            else:
                task_type = job_type or f"cron.{id}"
                _, payload_type = task_handler(task_type, target, JobContext, PermanentError)
            spec = cron_spec(
                cron,
                schedule_id=id,
                job_type=task_type,
                tz=tz,
                payload_type=payload_type,
                payload=payload,
                options=options,
            )
            self._check_declared(spec)  # before registering anything
            task = (
                target
                if isinstance(target, Task)
                else self.task(task_type, retry=retry, timeout=timeout, concurrency=concurrency)(
                    target
                )
            )
            self.declare(spec)
            return task

        return register

    def declare(self, spec: ScheduleSpec) -> None:
        """Add a schedule to create or update when the worker starts; an id declared twice
        is refused."""
        self._check_declared(spec)
        self.schedules.append(spec)

    def _check_declared(self, spec: ScheduleSpec) -> None:
        if not spec.schedule_id:
            raise InvalidArgument("schedule_id", "a schedule declared in code needs an id")
        if any(s.schedule_id == spec.schedule_id for s in self.schedules):
            raise InvalidArgument(
                "schedule_id", f"{spec.schedule_id!r} is declared twice in this worker"
            )
        schedule_from_pb(spec.message(), spec.schedule_id)  # checked here, not at start

    def client(self) -> Client:
        """A client to this worker's server (``server``, else ``TIMESHARD_SERVER``), with its
        TLS and token; made once."""
        return self._clients.sync()

    def async_client(self) -> AsyncClient:
        """As ``client``, for asyncio code (one per event loop)."""
        return self._clients.aio()

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
        if self.server is None and servers:
            self.server = servers[0]
        self.declared = False
        await self._declare(servers, stop)
        self.declared = True
        threads = sum(s.concurrency for s in self.handlers.values() if not s.is_async)
        threads_pool = self._threads = _HandlerThreads(max(1, threads))
        security = ClientSecurity.resolve(self.tls, self.token)
        nodes = self._nodes = Nodes(security, self._clock, self._linker(stop))
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
            self._stop_asked = False  # it may run again
            self.declared = False
            self._drain_over = asyncio.Event()

    def _linker(self, stop: asyncio.Event) -> Link:
        """How a node's link is made (``Nodes.add``): this worker's settings and job types,
        how it claims and how it starts a claimed job; it claims until ``stop`` is set."""
        host = Host(
            worker_id=self.worker_id,
            lease_s=self.lease_s,
            safety_margin_s=self.safety_margin_s,
            clock=self._clock,
            slots=self._slots,
            concurrency=lambda t: self.handlers[t].concurrency,
            start=self._start,
            claim_loop=self._claim_loop,
            claim_polls=self.claim_polls,
        )

        def link(stub: WorkerStub, address: str) -> NodeLink:
            return NodeLink(
                host, stub, address, list(self.handlers), stop, use_stream=self.use_stream
            )

        return link

    async def _declare(self, servers: Sequence[str], stop: asyncio.Event) -> None:
        """Set the tasks' type policies and create or update the schedules declared in code,
        before claiming. A node that does not answer is retried (the worker waits for its
        cluster, as its claims do); a clash (an id taken by another type's schedule) stops
        the worker with that error."""
        if not self.schedules and not any(t.has_policy for t in self.tasks.values()):
            return
        backoff = 0.1
        while not stop.is_set():
            for address in servers or [self.server or server_from_env()]:
                client = AsyncClient(address, tls=self.tls, token=self.token, retries=0)
                try:
                    done = await declare(client, list(self.tasks.values()), self.schedules)
                except Unavailable as exc:
                    log.warning("declaring schedules on %s: %s", address, exc)
                    continue
                finally:
                    await client.close()
                for schedule_id, what in done.items():
                    log.info("schedule %s: %s", schedule_id, what)
                return
            await self._clock.sleep(backoff)
            backoff = min(5.0, backoff * 2)

    def _to_ask(self, job_type: str, poll: int = 0) -> int:
        """How many jobs of ``job_type`` are worth a claim now: a type claims again once a
        quarter of its slots (or all, when idle) are free, so a busy worker asks for jobs in
        batches rather than one round trip per finished job."""
        limit = self.handlers[job_type].concurrency
        free = self._slots.free(job_type)
        if free <= 0 or (free < limit and free < max(1, limit // 4)):
            return 0
        if poll and free <= self._slots.asked(job_type):
            return 0  # the others asked for every free slot (only the first asks beyond them)
        share = -(-free // self.claim_polls)  # (rounded up) one poll's part of the free slots
        return min(self._slots.to_ask(job_type), share)

    def _poll_wait_s(self) -> float:
        """A long poll waits at most half of what a lease leaves after its margin, so a claim
        taken at the end of the wait still has a lease counted from when it was sent."""
        return min(self.claim_wait_s, (self.lease_s - self.safety_margin_s) / 2)

    async def _claim_loop(
        self, stub: WorkerStub, stop: asyncio.Event, job_type: str, poll: int = 0
    ) -> None:
        """One type's long polls to one node. Each type polls on its own: a claim
        names one limit for all its types, so one claim for every type either capped them all
        at the smallest type's free slots, or asked only for the types with a free slot and
        waited out its long poll while a full type's slots freed."""
        backoff = 0.1
        while not stop.is_set():
            n = self._to_ask(job_type, poll)
            if n <= 0:
                await self._slots.wait_freed(job_type)
                continue
            req = pb.ClaimRequest(
                worker_id=self.worker_id,
                types=[job_type],
                max_jobs=n,
                max_reply_bytes=MAX_REPLY_BYTES,  # our channels accept that much
                wait=dur(round(self._poll_wait_s() * 1000)),
                lease=dur(round(self.lease_s * 1000)),
            )
            sent = self._clock.monotonic()
            self._slots.asking(job_type, n)
            try:
                resp = await stub.Claim(req, timeout=self._poll_wait_s() + 10)
            except grpc.RpcError as exc:
                log.warning("claim failed: %s; retrying in %.1fs", translate(exc), backoff)
                await self._clock.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            finally:
                self._slots.asking(job_type, -n)
            backoff = 0.1
            for claimed in resp.jobs:
                self._start(stub, claimed, sent)

    def _start(self, stub: WorkerStub, claimed: pb.ClaimedJob, sent: float) -> None:
        job = claimed.job
        left = sent + dur_s(claimed.lease) - self.safety_margin_s - self._clock.monotonic()
        if left <= 0:
            # The lease was over before the reply was even read (this process was stopped,
            # or the machine overloaded): its handler must not take a single step. It is
            # given back at once, fenced: not an attempt (invariant 9).
            over = -left + self.safety_margin_s
            log.warning(
                "job %s: it arrived %.3fs after its lease (with the safety margin); "
                "not started, given back",
                job.job_id,
                over,
            )
            self._give_back_unstarted(
                stub,
                job.job_id,
                claimed.fence,
                f"{NOT_STARTED}: lease over before the worker received it ({over:.3f}s late, "
                f"{dur_s(claimed.lease):g}s lease, {self.safety_margin_s:g}s safety margin)",
            )
            return
        run = self._slots.claimed(job.job_id, job.type)
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
            self._execute(stub, ctx, deadline, heartbeat_now=waited, run=run),
            name=f"job-{job.job_id}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._track(ctx, stub, task)

    def _give_back_unstarted(self, stub: WorkerStub, job_id: str, fence: int, why: str) -> None:
        """Hand a job whose handler never started back to its node, in the background (a
        give-back that does not arrive leaves the job to its lease's end: uncounted too)."""
        item = pb.FinishItem(
            job_id=job_id, fence=fence, failed=True, give_back=True, not_started=True, error=why
        )

        async def send() -> None:
            try:
                await stub.Finish(pb.FinishRequest(items=[item]), timeout=10.0)
            except grpc.RpcError as exc:
                log.info("job %s: give-back not sent (%s); its lease ends it", job_id, exc)

        task = asyncio.create_task(send(), name=f"give-back-{job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notice_start(
        self, stub: WorkerStub, ctx: JobContext, started_at_ms: int
    ) -> Awaitable[None] | None:
        """Tell the node the handler starts (invariant 9): over the stream, in the next
        request; otherwise a heartbeat that carries the notice. Returns what to await before
        the handler's first step (the notice handed to the transport)."""
        notice = getattr(stub, "notice_start", None)
        if notice is not None:
            sent: Awaitable[None] | None = notice(ctx.job_id, ctx.fence, started_at_ms)
            return sent
        request = pb.HeartbeatRequest(
            job_id=ctx.job_id,
            fence=ctx.fence,
            lease=dur(round(self.lease_s * 1000)),
            started=True,
            started_at=ts(started_at_ms),
        )

        async def send() -> None:
            with contextlib.suppress(grpc.RpcError):  # its heartbeats carry it again
                await stub.Heartbeat(request, timeout=max(1.0, self.lease_s / 3))

        task = asyncio.create_task(send(), name=f"start-notice-{ctx.job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _emit(self, kind: str, ctx: JobContext, detail: str = "") -> None:
        """Tell the event hook; a hook that raises is logged, never let into the worker's own
        bookkeeping (one that raised on "started" once kept its job's slot for good)."""
        if self._on_event is None:
            return
        try:
            self._on_event(kind, ctx, detail)
        except Exception:
            log.exception("job %s: the event hook raised on %r; ignored", ctx.job_id, kind)

    async def _execute(
        self,
        stub: WorkerStub,
        ctx: JobContext,
        deadline: float,
        heartbeat_now: bool = False,
        run: Run | None = None,
    ) -> None:
        """Run one claimed job: wait for its slot, call its handler, report how it ended. Its
        slot is given back when the handler really ended (``Slots.release``), not before."""
        run = run or self._slots.claimed(ctx.job_id, ctx.job_type)
        spec = self.handlers[ctx.job_type]
        ctx._lease.begin(self._clock, deadline)
        handler = asyncio.create_task(self._invoke(spec, ctx, run), name=f"handler-{ctx.job_id}")
        handler.add_done_callback(lambda _: self._slots.release(run))
        self._track_handler(ctx, handler)  # for the drain (``stop``)
        started_at = 0

        def started() -> Awaitable[None] | None:
            nonlocal started_at
            started_at = self._clock.now_ms()
            tracked = self._inflight.get(ctx.job_id)
            if tracked is not None:
                tracked.started = True
            return self._notice_start(stub, ctx, started_at)

        run.on_started = started
        heartbeats = self._start_heartbeats(stub, ctx, handler, heartbeat_now, lambda: started_at)
        try:
            outcome = await self._outcome(spec, ctx, run, handler)
            if outcome is not None:
                await self._report(stub, ctx, outcome)
        finally:
            heartbeats.cancel()

    async def _outcome(
        self, spec: HandlerSpec, ctx: JobContext, run: Run, handler: asyncio.Task[Any]
    ) -> _Ended | None:
        """How the handler ended, with its result or its error and traceback, or None when
        the lease was lost (nothing to report: the job is someone else's now). The type's
        timeout counts from when the handler started; a job that waited that long for its
        slot is not run."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(spec.timeout_s) as limit:
                run.on_start = lambda: limit.reschedule(loop.time() + spec.timeout_s)
                value = await asyncio.shield(handler)
            result, encoding = encode_result(value)
            return _Ended("complete", result=result, result_encoding=encoding)
        except ResultError as exc:
            return _Ended("permanent", _describe(exc))
        except TimeoutError as exc:
            if not limit.expired():
                return _failed("retry", exc)  # the handler's own
            why = f"timed out after {spec.timeout_s:g}s"
            if not run.started:
                why = f"not started within its timeout of {spec.timeout_s:g}s: it waited for "
                why += run.waiting_for()
            ctx._lease.stop(why)
            handler.cancel()
            # A cooperative handler stops at once; one that can not be stopped keeps its slot
            # (and this job) until it ends, but the attempt is reported now.
            await asyncio.wait({handler}, timeout=self.safety_margin_s)
            return _Ended("retry", why)
        except (asyncio.CancelledError, LeaseLost) as exc:
            if ctx.cancelled:
                why = f"{ctx._lease.why()}; handler stopped"
                _log_problem(ctx, "stopped", why)
                self._emit("lost", ctx, why)
                return None
            if isinstance(exc, LeaseLost):
                return _failed("retry", exc)
            raise  # this worker's own task was cancelled (shutting down)
        except PermanentError as exc:
            return _failed("permanent", exc)
        except Exception as exc:
            return _failed("retry", exc)

    async def _invoke(self, spec: HandlerSpec, ctx: JobContext, run: Run) -> Any:
        """Wait for the job's slot, then call its handler. What the handler raises that would
        end the event loop or be taken for the worker cancelling it — ``SystemExit``,
        ``KeyboardInterrupt``, its own ``CancelledError`` — comes out as ``_Raised``, an
        ordinary exception that fails the attempt."""
        await self._slots.acquire(run)
        sent = run.start()
        if sent is not None:  # the start notice leaves before the handler's first step
            with contextlib.suppress(TimeoutError, grpc.RpcError):
                async with asyncio.timeout(NOTICE_WAIT_S):
                    await asyncio.shield(sent)
        self._emit("started", ctx)
        try:
            if spec.is_async:
                return await _Guarded(spec.fn(ctx), ctx)
            return await self._in_thread(spec, ctx, run)
        except (SystemExit, KeyboardInterrupt) as exc:
            raise _Raised(_describe(exc)) from exc
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if ctx.cancelled or (task is not None and task.cancelling()):
                raise  # the worker stopped it
            raise _Raised(f"{_describe(exc)} (raised by the handler)") from exc

    async def _in_thread(self, spec: HandlerSpec, ctx: JobContext, run: Run) -> Any:
        """Call a ``def`` handler in a thread; ``run.thread`` is done once the thread returned
        (the call can not be stopped, only interrupted between bytecodes)."""
        loop = asyncio.get_running_loop()
        ident: list[int] = []

        def call() -> Any:
            ident.append(threading.get_ident())
            return spec.fn(ctx)

        assert self._threads is not None
        job: Future[Any] = self._threads.submit(call)
        returned = run.thread = loop.create_future()
        job.add_done_callback(lambda _: _set_soon_threadsafe(loop, returned))
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            if ident and not job.done():  # interrupt it at its next bytecode (not in a C call)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(ident[0]), ctypes.py_object(LeaseLost)
                )
            raise

    def _start_heartbeats(
        self,
        stub: WorkerStub,
        ctx: JobContext,
        handler: asyncio.Task[Any],
        heartbeat_now: bool,
        started_at_ms: Callable[[], int] = lambda: 0,
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
            started_at_ms=started_at_ms,
        )
        return heartbeats.start(stub, handler, heartbeat_now)

    async def _report(self, stub: WorkerStub, ctx: JobContext, ended: _Ended) -> None:
        """Send the result, retried until it is in or the lease is over (``Results``); once the
        lease is over nothing is sent, and the job is left to its lease expiry. Every failure
        is logged at WARNING, whatever is printed."""
        kind, error = ended.kind, ended.error
        if kind != "complete":
            what = "failed permanently" if kind == "permanent" else "failed"
            _log_problem(ctx, what, error)
        item = pb.FinishItem(
            job_id=ctx.job_id,
            fence=ctx.fence,
            failed=kind != "complete",
            error=truncate_error(error),  # the server would; a long one could not be sent
            permanent=kind == "permanent",
            result=ended.result,
            result_encoding=ended.result_encoding,
            traceback=ended.traceback,
        )
        result, why = await self._results.deliver(item, stub, ctx._lease)
        if result is None:
            why = f"{why}; the job is left to its lease expiry"
            _log_problem(ctx, "result not sent", why)
            self._emit("unreported", ctx, why)
        elif result.code == 0:
            self._emit("succeeded" if kind == "complete" else "failed", ctx, error)
        else:
            _log_problem(ctx, "result refused", result.message)
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
            job_id=f.ctx.job_id,
            fence=f.ctx.fence,
            failed=True,
            error=SHUT_DOWN if f.started else f"{NOT_STARTED}: the worker was stopping",
            give_back=True,
            not_started=not f.started,
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
        if self._nodes is None:
            return []
        return list(self._nodes.stubs.values())  # type: ignore[arg-type]  # (stub-like links)


def _log_problem(ctx: JobContext, what: str, detail: str) -> None:
    """One WARNING line for a job that did not succeed, in every log format and with
    ``--quiet`` too (``timeshard worker`` prints only progress; problems are log records)."""
    log.warning(
        "job %s (%s) %s on attempt %d/%d: %s",
        ctx.job_id,
        ctx.job_type,
        what,
        ctx.attempt,
        ctx.max_attempts,
        detail,
        extra={"job_id": ctx.job_id, "job_type": ctx.job_type, "event": "job.failed"},
    )


class _Raised(Exception):
    """What a handler raised that must not leave it as it is (see ``Worker._invoke``)."""


def _describe(exc: BaseException) -> str:
    """How an attempt's error reads in the job's history: "SystemExit: 3"."""
    if isinstance(exc, _Raised):
        return str(exc)
    text = str(exc)
    if not text and not isinstance(exc, Exception):
        return type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _set_soon_threadsafe(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
    def settle() -> None:
        if not fut.done():
            fut.set_result(None)

    with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits any more
        loop.call_soon_threadsafe(settle)


class _Guarded:
    """Drives an ``async def`` handler one step at a time and, once its lease is over, throws
    ``LeaseLost`` into it instead of resuming it. A handler that blocked the event loop past its
    lease (``time.sleep``, a long computation) is so stopped at its next ``await``, before it
    takes another step (invariant 6): on resuming, other tasks — the heartbeat loop among them —
    may not have run yet. (The blocking call itself can not be stopped.)"""

    __slots__ = ("_coro", "_ctx")

    def __init__(self, coro: Coroutine[Any, Any, Any], ctx: JobContext) -> None:
        self._coro, self._ctx = coro, ctx

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, lease = self._coro, self._ctx._lease
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                if error is not None:
                    step = coro.throw(error)
                elif not lease.held():
                    step = coro.throw(LeaseLost(f"job {self._ctx.job_id}: {lease.why()}"))
                else:
                    step = coro.send(value)
            except StopIteration as done:
                return done.value
            value, error = None, None
            try:
                value = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task: cancellation
                error = exc
