"""Tasks: handlers declared with their payload type, and the cron schedules declared in code.

    @dataclass
    class Email:
        to: str
        subject: str = ""

    @worker.task("email.send", retry=Retry(max_attempts=5), timeout=60, concurrency=8)
    async def send(email: Email, ctx: JobContext) -> None: ...

    send.schedule(Email(to="a@example.com"), delay=timedelta(minutes=5))

The handler's payload parameter (the one not annotated ``JobContext``) says what a payload is:
a dataclass, a TypedDict, or any type pydantic validates; unannotated, it is the decoded JSON.
A payload is checked against it where the task is scheduled (``InvalidArgument``, nothing sent)
and again where it runs: one that does not match fails the job permanently, with the fields
that did not match, and it goes to the dead-letter queue (no retry can make it match).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import sys
import threading
import typing
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import pydantic
import pydantic_core
import typing_extensions
from typing_extensions import Unpack

from timeshard.client import AsyncClient, Client, JobOptionArgs, Retry, Scheduled, ScheduleSpec
from timeshard.cron import CronSpec
from timeshard.errors import InvalidArgument, Unimplemented
from timeshard.security.channel import TlsArg
from timeshard.wire import schedule_from_pb

P = TypeVar("P")
log = logging.getLogger("timeshard.worker")


class _Clients(Protocol):
    """What a task schedules through: its worker (``Worker.client``/``async_client``)."""

    def client(self) -> Client: ...

    def async_client(self) -> AsyncClient: ...


class _Settings(Protocol):
    """Where a worker's clients go: its ``server``, ``tls`` and ``token``."""

    server: str | None
    tls: TlsArg
    token: str | None


class WorkerClients:
    """The worker's clients for ``Task.schedule``: one blocking, one per event loop."""

    def __init__(self, worker: _Settings) -> None:
        self._worker = worker
        self._sync: Client | None = None
        self._aio: dict[asyncio.AbstractEventLoop, AsyncClient] = {}
        self._lock = threading.Lock()

    def sync(self) -> Client:
        with self._lock:
            if self._sync is None:
                w = self._worker
                self._sync = Client(w.server, tls=w.tls, token=w.token)
            return self._sync

    def aio(self) -> AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [k for k in self._aio if k.is_closed()]:
                del self._aio[old]
            if loop not in self._aio:
                w = self._worker
                self._aio[loop] = AsyncClient(w.server, tls=w.tls, token=w.token)
            return self._aio[loop]

    def forget(self) -> None:
        """Drop the clients (the server moved: ``testing.local``); the blocking one is closed."""
        with self._lock:
            if self._sync is not None:
                self._sync.close()
            self._sync = None
            self._aio.clear()


class _Context(Protocol):
    payload: bytes


class PayloadMismatch(Exception):
    """A payload that does not match its task's type (raised as a permanent error at run
    time, as ``InvalidArgument`` where it is scheduled)."""


class PayloadType:
    """A handler's payload type and its checks (pydantic, strict: ``"3"`` is not an int)."""

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.name = getattr(annotation, "__name__", repr(annotation))
        self._adapter: pydantic.TypeAdapter[Any] | None = None
        if annotation is not inspect.Parameter.empty and annotation is not Any:
            try:
                self._adapter = pydantic.TypeAdapter(_for_pydantic(annotation))
            except pydantic.PydanticUserError as exc:
                raise TypeError(f"payload type {self.name}: {exc.message}") from None

    def encode(self, payload: Any) -> bytes:
        """The payload as JSON, checked against the type as the worker will read it."""
        try:
            raw = pydantic_core.to_json(payload)
        except pydantic_core.PydanticSerializationError as exc:
            raise InvalidArgument("payload", f"not JSON-serialisable: {exc}") from None
        try:
            self.decode(raw)
        except PayloadMismatch as exc:
            raise InvalidArgument("payload", str(exc)) from None
        return raw

    def decode(self, raw: bytes) -> Any:
        if self._adapter is None:
            return json.loads(raw or b"null")
        try:
            return self._adapter.validate_json(raw or b"null", strict=True)
        except pydantic.ValidationError as exc:
            raise PayloadMismatch(f"does not match {self.name}: {_problems(exc)}") from None


def _problems(exc: pydantic.ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'the payload'}: {e['msg']}"
        for e in exc.errors(include_url=False)
    )


def _for_pydantic(annotation: Any) -> Any:
    """Before Python 3.12 pydantic reads only ``typing_extensions.TypedDict``: the same
    TypedDict, made with it."""
    if sys.version_info >= (3, 12) or not typing.is_typeddict(annotation):
        return annotation
    if type(annotation) is type(typing_extensions.TypedDict("_Probe", {})):  # type: ignore[operator]
        return annotation
    hints = typing.get_type_hints(annotation, include_extras=True)
    required = annotation.__required_keys__
    fields = {
        k: typing_extensions.Required[v] if k in required else typing_extensions.NotRequired[v]
        for k, v in hints.items()
    }
    return typing_extensions.TypedDict(annotation.__name__, fields)  # type: ignore[operator]


class Task(Generic[P]):
    """A job type with its handler, payload type and policies, as ``Worker.task`` declared
    it. ``schedule``/``schedule_async`` schedule one (through the worker's server, or the
    client given); calling the task calls its handler directly (handy in unit tests)."""

    def __init__(
        self,
        worker: _Clients,
        job_type: str,
        fn: Callable[..., Any],
        payload_type: PayloadType,
        *,
        retry: Retry | None,
        timeout_s: float,
        concurrency: int,
        cluster_concurrency: int = 0,
    ) -> None:
        self.worker = worker
        self.job_type = job_type
        self.fn = fn
        self.payload_type = payload_type
        self.retry = retry
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.cluster_concurrency = cluster_concurrency
        functools.update_wrapper(self, fn)

    @property
    def has_policy(self) -> bool:
        """Whether the task sets its type's policy on the cluster (retry, cluster limit)."""
        return self.retry is not None or self.cluster_concurrency > 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.job_type} ({self.payload_type.name})>"

    def _options(self, options: JobOptionArgs) -> JobOptionArgs:
        """The job's options, with the task's ``max_attempts`` where none is given."""
        if not options.get("max_attempts") and self.retry is not None:
            options = options.copy()
            options["max_attempts"] = self.retry.max_attempts
        return options

    def schedule(
        self, payload: P, *, client: Client | None = None, **options: Unpack[JobOptionArgs]
    ) -> Scheduled:
        """Schedule one run with its options, as ``Client.schedule`` takes them (``delay`` or
        ``at``, ``key``, ``max_attempts``, ``deadline``/``deadline_in``, ``priority``,
        ``if_exists``), through the worker's server or ``client``. The payload is checked
        against the task's type first."""
        raw = self.payload_type.encode(payload)
        c = client or self.worker.client()
        return c.schedule(self.job_type, raw, **self._options(options))

    async def schedule_async(
        self, payload: P, *, client: AsyncClient | None = None, **options: Unpack[JobOptionArgs]
    ) -> Scheduled:
        """``schedule`` from asyncio code."""
        raw = self.payload_type.encode(payload)
        c = client or self.worker.async_client()
        return await c.schedule(self.job_type, raw, **self._options(options))


def task_handler(
    job_type: str, fn: Callable[..., Any], context: type, permanent: type[Exception]
) -> tuple[Callable[..., Any], PayloadType]:
    """The ``handler(ctx)`` that runs task ``fn``: reads and checks the payload, then calls
    ``fn(payload)`` or ``fn(payload, ctx)`` (the parameter annotated ``context``, the
    worker's ``JobContext``, gets the context); a payload that does not match raises
    ``permanent``. Checked now: a task that can not be called so is a ``TypeError`` here."""
    hints = typing.get_type_hints(fn)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.default is inspect.Parameter.empty
    ]
    ctx_names = [p.name for p in params if hints.get(p.name) is context]
    payload_params = [p for p in params if p.name not in ctx_names]
    if len(ctx_names) > 1 or len(payload_params) > 1 or not params:
        raise TypeError(
            f"task {fn.__name__} for {job_type} must take its payload and, optionally, a "
            "parameter annotated JobContext: def f(payload: MyPayload, ctx: JobContext)"
        )
    payload_type = PayloadType(
        hints.get(payload_params[0].name, inspect.Parameter.empty)
        if payload_params
        else inspect.Parameter.empty
    )

    def arguments(ctx: _Context) -> dict[str, Any]:
        args: dict[str, Any] = {name: ctx for name in ctx_names}
        if payload_params:
            try:
                args[payload_params[0].name] = payload_type.decode(ctx.payload)
            except PayloadMismatch as exc:
                raise permanent(f"payload {exc}") from None
            except ValueError as exc:
                raise permanent(f"payload is not JSON: {exc}") from None
        return args

    if inspect.iscoroutinefunction(fn):

        async def run_async(ctx: _Context) -> Any:
            return await fn(**arguments(ctx))

        return run_async, payload_type

    def run(ctx: _Context) -> Any:
        return fn(**arguments(ctx))

    return run, payload_type


def cron_spec(
    cron: str,
    *,
    schedule_id: str,
    job_type: str,
    tz: str,
    payload_type: PayloadType,
    payload: Any,
    options: dict[str, Any],
) -> ScheduleSpec:
    """A schedule declared in code, checked as the server would check it (a bad cron, zone,
    id or policy is ``InvalidArgument`` at once, where it is declared)."""
    CronSpec(
        expression=cron,
        timezone=tz,
        dst_gap=options.get("dst_gap") or None,
        dst_fold=options.get("dst_fold") or None,
    )
    try:
        spec = ScheduleSpec(
            job_type=job_type,
            cron=cron,
            tz=tz,
            schedule_id=schedule_id,
            payload=payload_type.encode({} if payload is None else payload),
            **options,
        )
    except TypeError as exc:
        raise InvalidArgument("schedule", str(exc)) from None
    schedule_from_pb(spec.message(), schedule_id)  # the id, policies and template
    return spec


async def declare(
    client: AsyncClient, tasks: list[Task[Any]], specs: list[ScheduleSpec]
) -> dict[str, str]:
    """Set the tasks' type policies, then create or update each declared schedule by id
    (``AsyncClient.put_schedule``). Returns what was done to each schedule. A clash (the id
    taken by a schedule of another type) raises ``AlreadyExists``."""
    policies = [(t.job_type, t.retry, t.cluster_concurrency) for t in tasks if t.has_policy]
    if policies:
        try:
            await client.set_type_policies(policies)
        except Unimplemented:  # a node of an older version, during an upgrade: claim anyway
            log.warning(
                "%s does not take type policies (an older timeshard?): the tasks' retry and "
                "cluster limits are not set there",
                client.address,
            )
    done: dict[str, str] = {}
    for spec in specs:
        _, what = await client.put_schedule(spec)
        done[spec.schedule_id] = what
    return done
