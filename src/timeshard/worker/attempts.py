"""One job's attempt in a worker, from the claim to the report: a claim whose lease was over
on arrival is given back unstarted (not an attempt, invariant 9); otherwise the job waits for
its slot, its start notice goes out as its handler starts, its heartbeats extend its lease
(``heartbeats``), and how the handler ended (returned, raised, timed out, lost its lease) is
reported (``results``). A handler that cannot be stopped keeps its slot until it really ends.
The ``Worker`` owns one ``Attempts`` and starts each claimed job with ``Attempts.start``; its
drain reads the jobs in flight here (``Attempts.inflight``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Coroutine, Generator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import grpc

from timeshard.clock import Clock
from timeshard.limits import START_GRACE_MS, truncate_error
from timeshard.model import NOT_STARTED
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, dur_s, ts, ts_ms
from timeshard.worker.context import EventHook, HandlerSpec, JobContext, PermanentError
from timeshard.worker.heartbeats import DeferredHeartbeats, Heartbeats
from timeshard.worker.lease import LeaseLost
from timeshard.worker.results import Results
from timeshard.worker.returns import ResultError, encode_result, traceback_of
from timeshard.worker.slots import Run, Slots
from timeshard.worker.startat import StartAt

if TYPE_CHECKING:
    from timeshard.v1.timeshard_pb2_grpc import WorkerServiceAsyncStub as WorkerStub

log = logging.getLogger("timeshard.worker")  # part of the worker SDK: its logger, as before


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


@dataclass(kw_only=True, slots=True)
class InFlight:
    """A job this worker runs, as the drain needs it."""

    ctx: JobContext
    stub: WorkerStub
    task: asyncio.Task[None]
    is_async: bool
    handler: asyncio.Task[Any] | None = None
    started: bool = False
    """Its handler started (its start notice went out): a give-back at the drain then says
    it was stopped, not that it never started."""
    at: StartAt | None = None
    """Pushed with ``starts_in``: when it may start (``startat``)."""


class HandlerThreads(ThreadPoolExecutor):
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


class WorkerSettings(Protocol):
    """What the attempts read of their worker, when they need it (``timeshard worker`` sets
    the id and the lease after making the worker)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def lease_s(self) -> float: ...
    @property
    def safety_margin_s(self) -> float: ...
    @property
    def handlers(self) -> Mapping[str, HandlerSpec]: ...


class Attempts:
    """The attempts one worker runs. ``worker`` is read for its settings and handlers;
    ``emit`` is the worker's event hook."""

    def __init__(
        self,
        worker: WorkerSettings,
        *,
        clock: Clock,
        slots: Slots,
        results: Results,
        emit: EventHook,
    ) -> None:
        self._worker = worker
        self._clock = clock
        self._slots = slots
        self.results = results
        """Where results, heartbeats and give-backs go, retried on the other nodes."""
        self._emit = emit
        self.tasks: set[asyncio.Task[None]] = set()
        """Each job's task, and the give-backs and start notices sent in the background."""
        self.inflight: dict[str, InFlight] = {}
        self.threads: ThreadPoolExecutor | None = None
        """The ``def`` handlers' threads (``HandlerThreads``), made when the worker runs."""

    def start(
        self, stub: WorkerStub, claimed: pb.ClaimedJob, sent: float, received: float | None = None
    ) -> None:
        """Start a job claimed from ``stub`` by a claim sent at ``sent`` (this worker's
        monotonic clock), in its own task; or give it back if its lease is already over.
        ``received``: when the message that carried it was read (None: now). A push's jobs
        share it, so the last of many does not start later by the time spent on the others."""
        job, margin = claimed.job, self._worker.safety_margin_s
        left = sent + dur_s(claimed.lease) - margin - self._clock.monotonic()
        if left <= 0:
            # The lease was over before the reply was even read (this process was stopped,
            # or the machine overloaded): its handler must not take a single step. It is
            # given back at once, fenced: not an attempt (invariant 9).
            over = -left + margin
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
                f"{dur_s(claimed.lease):g}s lease, {margin:g}s safety margin)",
            )
            return
        at = None
        if claimed.HasField("starts_in"):  # (a push to a worker that starts it on its clock)
            read = self._clock.monotonic() if received is None else received
            at = StartAt.of(sent, read, dur_s(claimed.starts_in))
            why = at.too_late(sent + dur_s(claimed.lease) - margin)
            if why:
                log.warning("job %s: %s; not started, given back", job.job_id, why)
                self._give_back_unstarted(stub, job.job_id, claimed.fence, f"{NOT_STARTED}: {why}")
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
            worker_id=self._worker.worker_id,
        )
        # The lease started when the server took the claim, at some point after ``sent``: a
        # safe base whatever happened since, even a reply that sat in the socket while this
        # process was stopped (its arrival is not: a handler then acted on a lease long over,
        # found by the chaos suite). A long poll waits at most half the lease, so a claim that
        # waited still has time; it sends a heartbeat at once to get the rest.
        received = self._clock.monotonic()
        waited = received - sent > margin / 2
        deadline = sent + dur_s(claimed.lease) - margin
        task = asyncio.create_task(
            self.execute(stub, ctx, deadline, heartbeat_now=waited, run=run, at=at),
            name=f"job-{job.job_id}",
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self._track(ctx, stub, task, at)

    def revoke(self, job_id: str, fence: int) -> bool:
        """The node revoked the push of ``(job_id, fence)`` (its cancel): a handler not started
        never will be. Returns whether it had started (a job not here was never started from
        this push: its notice would have gone before this answer)."""
        f = self.inflight.get(job_id)
        if f is None or f.ctx.fence != fence:
            return False
        if f.started:
            return True
        f.ctx._lease.lose("revoked by the node (cancelled) before its handler started")
        if f.at is not None:
            f.at.revoke()
        return False

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
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _notice_start(self, stub: WorkerStub, ctx: JobContext, started_at_ms: int) -> None:
        """Tell the node the handler starts (invariant 9): over the stream, with its next
        request (``NodeLink.notice_start``); otherwise a heartbeat that carries the notice. The
        handler does not wait for it: its heartbeats and its result carry the start again."""
        notice = getattr(stub, "notice_start", None)
        if notice is not None:
            notice(ctx.job_id, ctx.fence, started_at_ms)
            return
        request = pb.HeartbeatRequest(
            job_id=ctx.job_id,
            fence=ctx.fence,
            lease=dur(round(self._worker.lease_s * 1000)),
            started=True,
            started_at=ts(started_at_ms),
        )

        async def send() -> None:
            with contextlib.suppress(grpc.RpcError):  # its heartbeats carry it again
                await stub.Heartbeat(request, timeout=max(1.0, self._worker.lease_s / 3))

        task = asyncio.create_task(send(), name=f"start-notice-{ctx.job_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def execute(
        self,
        stub: WorkerStub,
        ctx: JobContext,
        deadline: float,
        heartbeat_now: bool = False,
        run: Run | None = None,
        at: StartAt | None = None,
    ) -> None:
        """Run one claimed job: wait for its slot, call its handler, report how it ended. Its
        slot is given back when the handler really ended (``Slots.release``), not before."""
        run = run or self._slots.claimed(ctx.job_id, ctx.job_type)
        spec = self._worker.handlers[ctx.job_type]
        ctx._lease.begin(self._clock, deadline)
        handler = asyncio.create_task(
            self._invoke(spec, ctx, run, at), name=f"handler-{ctx.job_id}"
        )
        handler.add_done_callback(lambda _: self._slots.release(run))
        self._track_handler(ctx, handler)  # for the drain (``stop``)
        started_at = 0

        def started() -> None:
            nonlocal started_at
            started_at = self._clock.now_ms()
            tracked = self.inflight.get(ctx.job_id)
            if tracked is not None:
                tracked.started = True
            self._notice_start(stub, ctx, started_at)

        run.on_started = started
        heartbeats = self._start_heartbeats(stub, ctx, handler, heartbeat_now, lambda: started_at)
        try:
            outcome = await self._outcome(spec, ctx, run, handler)
            if run.started and not run.stepped:
                # Its start notice went out, but the handler was stopped before its first
                # step (the lease ran out or it was stopped while the notice left): it never
                # started, so it is given back unstarted, not left to count (invariant 9).
                why = f"{NOT_STARTED}: {ctx._lease.why()} before its handler's first step"
                log.warning("job %s: %s; given back", ctx.job_id, why)
                self._give_back_unstarted(stub, ctx.job_id, ctx.fence, why)
            elif at is not None and not run.started and not at.revoked and at.late(self._clock):
                why = f"{NOT_STARTED}: {ctx._lease.why()}"
                log.warning("job %s: %s; given back", ctx.job_id, why)
                self._give_back_unstarted(stub, ctx.job_id, ctx.fence, why)
            elif outcome is not None:
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
            await asyncio.wait({handler}, timeout=self._worker.safety_margin_s)
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

    async def _invoke(
        self, spec: HandlerSpec, ctx: JobContext, run: Run, at: StartAt | None = None
    ) -> Any:
        """Wait for the job's slot, then call its handler. What the handler raises that would
        end the event loop or be taken for the worker cancelling it — ``SystemExit``,
        ``KeyboardInterrupt``, its own ``CancelledError`` — comes out as ``_Raised``, an
        ordinary exception that fails the attempt."""
        if at is not None:
            await at.wait(self._clock)  # never before its time on this worker's clock
        await self._slots.acquire(run)
        if at is not None and not at.revoked and at.late(self._clock):
            ctx._lease.lose(
                f"its start came more than {START_GRACE_MS / 1000:g}s past its time (the "
                "worker was stopped or overloaded)"
            )
        if not ctx._lease.held():  # over while it waited: no start notice, no step
            raise LeaseLost(f"job {ctx.job_id}: {ctx._lease.why()}")
        run.start()
        # One turn of the loop: the stream's writer hands the start notice to the transport
        # before the handler's first step (a handler that kills its worker still counts).
        await asyncio.sleep(0)
        if not ctx._lease.held():  # stalled as it started: no step, given back unstarted
            raise LeaseLost(f"job {ctx.job_id}: {ctx._lease.why()}")
        self._emit("started", ctx, "")
        try:
            if spec.is_async:
                return await _Guarded(spec.fn(ctx), ctx, run)
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

        assert self.threads is not None
        run.stepped = True  # (from here its thread may run it)
        job: Future[Any] = self.threads.submit(call)
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
            results=self.results,
            job_id=ctx.job_id,
            fence=ctx.fence,
            lease=ctx._lease,
            lease_s=self._worker.lease_s,
            safety_margin_s=self._worker.safety_margin_s,
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
        result, why = await self.results.deliver(item, stub, ctx._lease)
        if result is None:
            why = f"{why}; the job is left to its lease expiry"
            _log_problem(ctx, "result not sent", why)
            self._emit("unreported", ctx, why)
        elif result.code == 0:
            self._emit("succeeded" if kind == "complete" else "failed", ctx, error)
        else:
            _log_problem(ctx, "result refused", result.message)
            self._emit("rejected", ctx, result.message)

    def _track(
        self,
        ctx: JobContext,
        stub: WorkerStub,
        task: asyncio.Task[None],
        at: StartAt | None = None,
    ) -> None:
        spec = self._worker.handlers[ctx.job_type]
        self.inflight[ctx.job_id] = InFlight(
            ctx=ctx, stub=stub, task=task, is_async=spec.is_async, at=at
        )
        task.add_done_callback(lambda _: self.inflight.pop(ctx.job_id, None))

    def _track_handler(self, ctx: JobContext, handler: asyncio.Task[Any]) -> None:
        tracked = self.inflight.get(ctx.job_id)
        if tracked is not None:
            tracked.handler = handler


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
    """What a handler raised that must not leave it as it is (see ``Attempts._invoke``)."""


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

    __slots__ = ("_coro", "_ctx", "_run")

    def __init__(self, coro: Coroutine[Any, Any, Any], ctx: JobContext, run: Run) -> None:
        self._coro, self._ctx, self._run = coro, ctx, run

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
                    self._run.stepped = True  # (a coroutine never resumed ran no step)
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
