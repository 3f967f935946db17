"""The Python worker SDK.

    from timeshard.worker import Worker, PermanentError

    worker = Worker()

    @worker.handler("email.send", timeout=30, concurrency=8)
    async def send(ctx):            # or a plain def: it runs in a thread
        await mailer.send(ctx.json(), idempotency_key=ctx.idempotency_key)

    asyncio.run(worker.run(["127.0.0.1:50051"]))  # or timeshard.loops.run(...): timers to the µs

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
given (``JobContext``, ``PermanentError``) is in ``context``; one job's attempt, from its
claim to its report, in ``attempts``; the nodes it takes jobs from (discovery, channels,
links) in ``nodes``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from timeshard.client import AsyncClient, Client, Retry, ScheduleSpec
from timeshard.clock import Clock, SystemClock
from timeshard.errors import InvalidArgument, Unavailable
from timeshard.limits import MAX_CLAIM_TYPES, MAX_REPLY_BYTES
from timeshard.model import NOT_STARTED, validate_job_type, validate_worker_id
from timeshard.security.channel import ClientSecurity, TlsArg, server_from_env
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, schedule_from_pb, translate
from timeshard.worker.attempts import Attempts, HandlerThreads, InFlight
from timeshard.worker.context import EventHook, Handler, HandlerSpec, JobContext, PermanentError
from timeshard.worker.nodes import Link, Nodes
from timeshard.worker.results import Results
from timeshard.worker.slots import Slots
from timeshard.worker.stream import Host, NodeLink
from timeshard.worker.tasks import Task, WorkerClients, cron_spec, declare, task_handler

__all__ = ["EventHook", "JobContext", "PermanentError", "Worker"]
"""The names imported from here before ``context`` was split out still are."""

log = logging.getLogger("timeshard.worker")  # the SDK logs as one component

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub


SHUT_DOWN = "worker shut down"
"""Why a job was given back: the reason stored with its attempt."""
STOP_GRACE_S = 2.0
"""After the drain, how long the handlers still running get to stop before their jobs are
given back (or, if they do not stop, left to their lease)."""


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
        self.declared = False
        """True once a running worker has set its type policies and schedules (it claims
        only then)."""
        self.drain_s = 30.0
        """On ``stop``, how long running handlers may take to finish before their jobs are
        given back."""
        self.abandoned = 0
        """Handlers that had not stopped when ``run`` returned (their threads may still run;
        their jobs are left to their lease expiry)."""
        self._wire()

    def _wire(self) -> None:
        """The worker's parts, each given what it needs of the others: its clients, its
        slots, its attempts (``attempts``) and where their results go, the state of a stop;
        the nodes (``nodes``) come with ``run``."""
        self._clients = WorkerClients(self)
        self._slots = Slots(lambda job_type: self.handlers[job_type].concurrency)
        self._nodes: Nodes | None = None
        self._attempts = Attempts(
            self,
            clock=self._clock,
            slots=self._slots,
            results=Results(self._clock, self._other_nodes),
            emit=self._emit,
        )
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
        threads_pool = self._attempts.threads = HandlerThreads(max(1, threads))
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
            start=self._attempts.start,
            claim_loop=self._claim_loop,
            claim_polls=self.claim_polls,
            revoke=self._attempts.revoke,
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
                self._attempts.start(stub, claimed, sent)

    def _emit(self, kind: str, ctx: JobContext, detail: str = "") -> None:
        """Tell the event hook; a hook that raises is logged, never let into the worker's own
        bookkeeping (one that raised on "started" once kept its job's slot for good)."""
        if self._on_event is None:
            return
        try:
            self._on_event(kind, ctx, detail)
        except Exception:
            log.exception("job %s: the event hook raised on %r; ignored", ctx.job_id, kind)

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

    async def _drain(self, threads: HandlerThreads) -> None:
        if self._attempts.tasks:
            log.info(
                "worker %s: stopping; waiting up to %.0f s for %d running jobs",
                self.worker_id,
                self.drain_s,
                len(self._attempts.tasks),
            )
            await self._until(lambda: not self._attempts.tasks, self.drain_s, self._drain_over)
        left = [f for f in self._attempts.inflight.values() if not f.task.done()]
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

    async def _give_back(self, f: InFlight, threads: HandlerThreads) -> None:
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
        result, why = await self._attempts.results.deliver(item, f.stub, f.ctx._lease)
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
